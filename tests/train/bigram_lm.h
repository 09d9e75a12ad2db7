#pragma once
// The trainer tests' language model and data: a bigram model (an embedding, dropout, LayerNorm and
// an output projection) on byte tokens of tinyshakespeare, small enough that a training run takes a
// fraction of a second on the CPU.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/nn/layers.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/gpt_trainer.h"

namespace kiln::train::testing {

namespace fs = std::filesystem;

constexpr std::int64_t kVocab = 128;

// tinyshakespeare's first 40 kB as byte tokens (ASCII, < 128), 100 documents of 400 bytes.
inline std::string shakespeare_dataset(const fs::path& dir) {
  std::ifstream in(fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "tinyshakespeare_100k.txt", std::ios::binary);
  std::string text(40000, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  EXPECT_EQ(in.gcount(), 40000);
  const fs::path prefix = dir / "shakespeare_text_document";
  data::IndexedDatasetWriter writer(prefix, data::TokenDtype::UInt16);
  for (std::size_t d = 0; d < 100; ++d) {
    std::vector<std::int32_t> tokens;
    for (std::size_t i = d * 400; i < (d + 1) * 400; ++i)
      tokens.push_back(static_cast<unsigned char>(text[i]) % kVocab);
    writer.add_document(tokens);
  }
  writer.finish();
  return prefix.string();
}

class BigramLm : public nn::Module {
 public:
  BigramLm(std::int64_t hidden, double dropout) : nn::Module("BigramLm") {
    embedding = register_module("embedding", std::make_shared<nn::Embedding>(kVocab, hidden));
    drop = register_module("drop", std::make_shared<nn::Dropout>(dropout));
    norm = register_module("norm", std::make_shared<nn::LayerNorm>(hidden));
    output = register_module("output", std::make_shared<nn::Linear>(hidden, kVocab));
  }
  Tensor loss(const Tensor& tokens, const Tensor& labels, const Tensor& mask) {
    Tensor h = norm->forward(drop->forward(embedding->forward(tokens)));
    Tensor logits = output->forward(h).to(DType::F32);
    // The trainer's mask is all ones (pretraining counts every token): the plain mean is the masked one.
    const std::int64_t n = tokens.numel();
    return cross_entropy(logits.reshape({n, kVocab}), labels.reshape({n}));
  }
  std::shared_ptr<nn::Embedding> embedding;
  std::shared_ptr<nn::Dropout> drop;
  std::shared_ptr<nn::LayerNorm> norm;
  std::shared_ptr<nn::Linear> output;
};

inline LanguageModelHandle bigram(std::int64_t hidden = 32, double dropout = 0.1, std::uint64_t seed = 5) {
  manual_seed(seed);
  auto model = std::make_shared<BigramLm>(hidden, dropout);
  LanguageModelHandle h;
  h.module = model;
  h.loss = [model](const Tensor& t, const Tensor& l, const Tensor& m) { return model->loss(t, l, m); };
  h.seq_length = 32;
  h.flops_per_token = 6.0 * static_cast<double>(2 * kVocab * hidden);
  h.shape_flags = {{"--hidden-size", std::to_string(hidden)}};
  h.description = "a bigram model";
  return h;
}

}  // namespace kiln::train::testing
