#pragma once
// The GPT embedding (Megatron-core's LanguageModelEmbedding): word embeddings plus learned absolute
// position embeddings (when the config has them), then dropout (--hidden-dropout).
// word_embeddings is Megatron's VocabParallelEmbedding: with tensor parallelism each rank holds the
// rows [r V/tp, (r+1) V/tp) of the padded vocabulary (vocab_parallel.h); with a group of size 1 it is
// a plain lookup table. Under sequence parallelism the output is this rank's slice of the sequence,
// [B, T/tp, H].
#include <cstdint>
#include <memory>

#include "kiln/models/transformer_context.h"
#include "kiln/nn/layers.h"

namespace kiln::models {

// A [num_embeddings, dim] table, created uninitialised (GptModel initialises it).
class EmbeddingTable : public nn::Module {
 public:
  EmbeddingTable(std::int64_t num_embeddings, std::int64_t embedding_dim);
  Tensor forward(const Tensor& indices);
  std::string extra_repr() const override;

  std::int64_t num_embeddings, embedding_dim;
  Tensor weight;
};

class LanguageModelEmbedding : public nn::Module {
 public:
  LanguageModelEmbedding(const GptConfig& config, std::uint64_t dropout_seed, const LayerContext& context);
  // tokens [B, T] int64 at positions position_offset .. position_offset + T -> [B, T, H]; or at
  // `position_ids` ([T] int64) when given (context parallelism: a rank's tokens are two chunks).
  Tensor forward(const Tensor& tokens, std::int64_t position_offset = 0, const Tensor& position_ids = Tensor());

  std::shared_ptr<EmbeddingTable> word_embeddings;
  std::shared_ptr<EmbeddingTable> position_embeddings;  // null unless learned_absolute
  std::shared_ptr<nn::Dropout> embedding_dropout;
  std::int64_t vocab_size;  // the whole padded vocabulary

 private:
  LayerContext context_;
};

}  // namespace kiln::models
