// GPT-2 and Llama parity with PyTorch (Debian's python3-torch) on the CPU in float32: Kiln writes
// the model's weights (Megatron-core names and layout) and the inputs as safetensors, the script
// tests/parity/gpt_reference.py runs the same model written in plain torch with Hugging Face's math
// (separate q/k/v projections, repeat_kv, rotate_half RoPE with Llama 3 scaling, HF RMSNorm) and
// writes logits, loss and every parameter's gradient back; they are compared here.
//
// What is compared, per tensor: the norm-wise relative error ||kiln - torch|| / ||torch|| and the
// largest element error relative to the tensor's largest magnitude, max|kiln - torch| / max|torch|;
// both must be <= 1e-5 (the bound for f32 on the CPU). Skipped without python3 and torch.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>

#include "kiln/io/safetensors.h"
#include "kiln/models/gpt_model.h"
#include "kiln/nn/init.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";
constexpr double kTolerance = 1e-5;

struct Errors {
  double normwise = 0, max_relative = 0;
};

Errors relative_errors(const Tensor& ours, const Tensor& theirs) {
  const auto a = ours.to_vector<double>(), b = theirs.to_vector<double>();
  double diff2 = 0, ref2 = 0, max_diff = 0, max_ref = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    const double d = a[i] - b[i];
    diff2 += d * d;
    ref2 += b[i] * b[i];
    max_diff = std::max(max_diff, std::abs(d));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  if (ref2 == 0) return {std::sqrt(diff2), max_diff};  // a zero reference: absolute errors
  return {std::sqrt(diff2 / ref2), max_diff / max_ref};
}

class GptParity : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!fs::exists(kPython))
      skip_reason_ = "python3 not found at /usr/bin/python3";
    else if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", kPython).c_str()) != 0)
      skip_reason_ = "python3 cannot import torch";
  }

  void SetUp() override {
    if (!skip_reason_.empty()) GTEST_SKIP() << skip_reason_;
    dir_ = fs::path(KILN_BINARY_DIR) / "parity" / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }

  // Gives every parameter random values of a useful size (norm weights around 1, biases and the
  // rest around 0), so that each weight's layout and role matters to the result.
  static void randomise(GptModel& model, std::uint64_t seed) {
    Generator gen(seed);
    NoGradGuard no_grad;
    for (const auto& [name, p] : model.named_parameters()) {
      const bool norm_weight = name.find("layernorm.weight") != std::string::npos;
      nn::init::normal_(p, norm_weight ? 1.0 : 0.0, norm_weight ? 0.1 : 0.15, &gen);
    }
  }

  static Tensor random_ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<std::int64_t> ids(static_cast<std::size_t>(b * t));
    for (auto& id : ids) id = static_cast<std::int64_t>(rng() % static_cast<std::uint32_t>(vocab));
    return Tensor::from_vector(ids, {b, t});
  }

  // Runs Kiln and torch on `config` and compares logits, loss and gradients.
  void check(const GptConfig& config) {
    GptModel model(config, 1234);
    model.eval();  // dropout off: each side has its own random streams
    randomise(model, 99);
    const std::int64_t b = 2, t = config.seq_length;
    Tensor tokens = random_ids(b, t, config.vocab_size, 5);
    Tensor labels = random_ids(b, t, config.vocab_size, 6);
    std::vector<float> mask(static_cast<std::size_t>(b * t), 1.0f);
    for (std::size_t i = 0; i < mask.size(); i += 3) mask[i] = 0.0f;  // some tokens do not count
    Tensor loss_mask = Tensor::from_vector(mask, {b, t});

    Tensor logits = model.forward(tokens);
    Tensor loss = model.loss(tokens, labels, loss_mask);
    loss.backward();

    io::save_safetensors((dir_ / "model.safetensors").string(), model.state_dict());
    TensorDict inputs;
    inputs.insert("tokens", tokens);
    inputs.insert("labels", labels);
    inputs.insert("loss_mask", loss_mask);
    io::save_safetensors((dir_ / "inputs.safetensors").string(), inputs);
    nlohmann::json c = {{"num_layers", config.num_layers},
                        {"hidden_size", config.hidden_size},
                        {"num_attention_heads", config.num_attention_heads},
                        {"num_query_groups", config.query_groups()},
                        {"head_dim", config.head_dim()},
                        {"normalization", std::string(to_string(config.normalization))},
                        {"norm_epsilon", config.norm_epsilon},
                        {"position_embedding_type", std::string(to_string(config.position_embedding_type))},
                        {"rotary_base", config.rotary_base},
                        {"rope_llama3_scaling", config.rope_llama3_scaling},
                        {"rope_scaling_factor", config.rope_scaling_factor},
                        {"swiglu", config.swiglu}};
    std::ofstream(dir_ / "config.json") << c.dump(2);

    const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "gpt_reference.py";
    const std::string cmd =
        fmt::format("{} {} {} > {} 2>&1", kPython, script.string(), dir_.string(), (dir_ / "torch.log").string());
    const int rc = std::system(cmd.c_str());
    std::ifstream log(dir_ / "torch.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ASSERT_EQ(rc, 0) << "gpt_reference.py failed:\n" << text;

    const TensorDict torch_out = io::load_safetensors((dir_ / "outputs.safetensors").string()).tensors;
    auto compare = [&](const std::string& name, const Tensor& ours) {
      ASSERT_TRUE(torch_out.contains(name)) << "torch wrote no " << name;
      const Tensor& theirs = torch_out.at(name);
      ASSERT_TRUE(ours.defined()) << name << ": Kiln has none";
      ASSERT_EQ(ours.shape(), theirs.shape()) << name;
      const Errors e = relative_errors(ours, theirs);
      EXPECT_LE(e.normwise, kTolerance) << name << ": norm-wise relative error";
      EXPECT_LE(e.max_relative, kTolerance) << name << ": largest element error / largest magnitude";
    };
    compare("logits", logits);
    compare("loss", loss);
    std::size_t grads = 0;
    for (const auto& [name, p] : model.named_parameters()) {
      compare("grad." + name, p.grad());
      ++grads;
    }
    EXPECT_EQ(grads + 2, torch_out.size()) << "torch returned other tensors than Kiln's parameters";
  }

  static inline std::string skip_reason_;
  fs::path dir_;
};

// GPT-2 style: learned positions, LayerNorm, GELU(tanh), biases, tied output layer, padded vocabulary.
TEST_F(GptParity, SmallGpt2MatchesTorch) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 4;
  c.seq_length = 12;
  c.max_position_embeddings = 16;
  c.vocab_size = 100;  // padded to 128: the padded rows take part in the softmax, as in Megatron
  check(c);
}

// Llama style: RoPE (base 5e5, Llama 3 scaling: with head size 16 the frequencies fall in all three
// bands), RMSNorm, SwiGLU, GQA (8 heads, 2 groups), --kv-channels 16 (heads * 16 != hidden), no
// biases, untied output layer.
TEST_F(GptParity, SmallLlamaMatchesTorch) {
  GptConfig c = GptConfig::llama3_8b(100);
  c.num_layers = 2;
  c.hidden_size = 64;
  c.ffn_hidden_size = 96;
  c.num_attention_heads = 8;
  c.num_query_groups = 2;
  c.kv_channels = 16;
  c.seq_length = 12;
  c.max_position_embeddings = 64;
  c.rope_llama3_scaling = true;
  c.rope_scaling_factor = 8;
  c.make_vocab_size_divisible_by = 1;
  check(c);
}

}  // namespace
}  // namespace kiln::models
