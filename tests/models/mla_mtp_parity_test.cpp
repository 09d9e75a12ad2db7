// Multi-head latent attention and multi-token prediction against PyTorch (Debian's python3-torch)
// on the CPU in float32: Kiln writes the weights (Megatron-core names) and inputs as safetensors,
// tests/parity/mla_mtp_reference.py runs the same model written from the DeepSeek-V2/V3 papers'
// equations (MLA's scores as the sum of the compressed and the decoupled-RoPE dot products, MTP's
// sequential modules on the shared embedding and output head) and writes back logits, the main
// loss, each MTP depth's loss and every parameter's gradient of L_main + factor / D * sum_k L_k.
// Bounds as gpt_parity_test.cpp's f32 ones: norm-wise and max-element relative errors <= 1e-5.
// Skipped without a Python that imports torch.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kiln/io/safetensors.h"
#include "kiln/models/gpt_model.h"
#include "kiln/nn/init.h"
#include "kiln/tensor/grad_mode.h"
#include "mla_configs.h"
#include "torch_parity.h"

namespace kiln::models {
namespace mla_mtp_parity_test {

namespace fs = std::filesystem;

// The shared small MLA + MTP config with an untied output layer.
GptConfig small_mla_mtp() {
  GptConfig c = test_configs::small_mla_mtp();
  c.untie_embeddings_and_output_weights = true;
  return c;
}

// DeepSeek-V2-Lite style: no query compression (linear_q_proj); here with LayerNorm, GELU, biases
// (linear_proj's), a tied output layer, a value head larger than qk + RoPE (q and k padded), 1 depth.
GptConfig small_mla_lite() {
  GptConfig c = small_mla_mtp();
  c.q_lora_rank = 0;
  c.qk_head_dim = 4;
  c.qk_pos_emb_head_dim = 2;
  c.v_head_dim = 8;
  c.normalization = Normalization::LayerNorm;
  c.swiglu = false;
  c.add_bias_linear = true;
  c.untie_embeddings_and_output_weights = false;
  c.mtp_num_layers = 1;
  c.mtp_loss_scaling_factor = 1.0;
  return c;
}

class MlaMtpParity : public ::testing::Test {
 protected:
  static const std::string& python() {
    static const std::string found = parity::find_torch_python();
    return found;
  }

  void SetUp() override {
    if (python().empty())
      GTEST_SKIP() << "no python3 that imports torch ($KILN_PARITY_PYTHON, /usr/bin/python3, python3)";
    dir_ = parity::fresh_test_dir();
  }

  void check(const GptConfig& config) {
    GptModel model(config, 1234);
    model.eval();
    {  // weights of a useful size: norm weights around 1, the rest around 0
      Generator gen(99);
      NoGradGuard no_grad;
      for (const auto& [name, p] : model.named_parameters()) {
        const bool norm_weight = name.find("norm.weight") != std::string::npos;
        nn::init::normal_(p, norm_weight ? 1.0 : 0.0, norm_weight ? 0.1 : 0.2, &gen);
      }
    }
    TensorDict weights;
    for (const auto& [name, p] : model.state_dict()) weights.insert(name, p);
    io::save_safetensors((dir_ / "model.safetensors").string(), weights);

    const std::int64_t b = 2, t = config.seq_length;
    Tensor tokens = parity::random_ids(b, t, config.vocab_size, 5);
    Tensor labels = parity::random_ids(b, t, config.vocab_size, 6);
    std::vector<float> mask(static_cast<std::size_t>(b * t), 1.0f);
    for (std::size_t i = 0; i < mask.size(); i += 3) mask[i] = 0.0f;
    Tensor loss_mask = Tensor::from_vector(mask, {b, t});
    TensorDict inputs;
    inputs.insert("tokens", tokens);
    inputs.insert("labels", labels);
    inputs.insert("loss_mask", loss_mask);
    io::save_safetensors((dir_ / "inputs.safetensors").string(), inputs);

    Tensor logits = model.forward(tokens);
    Tensor loss = model.loss(tokens, labels, loss_mask);
    loss.backward();

    nlohmann::json c = {{"num_layers", config.num_layers},
                        {"hidden_size", config.hidden_size},
                        {"num_attention_heads", config.num_attention_heads},
                        {"q_lora_rank", config.q_lora_rank},
                        {"kv_lora_rank", config.kv_lora_rank},
                        {"qk_head_dim", config.qk_head_dim},
                        {"qk_pos_emb_head_dim", config.qk_pos_emb_head_dim},
                        {"v_head_dim", config.v_head_dim},
                        {"normalization", std::string(to_string(config.normalization))},
                        {"norm_epsilon", config.norm_epsilon},
                        {"rotary_base", config.rotary_base},
                        {"swiglu", config.swiglu},
                        {"mtp_num_layers", config.mtp_num_layers},
                        {"mtp_loss_scaling_factor", config.mtp_loss_scaling_factor}};
    std::ofstream(dir_ / "config.json") << c.dump(2);
    const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "mla_mtp_reference.py";
    const int rc = std::system(
        fmt::format("{} {} {} > {} 2>&1", python(), script.string(), dir_.string(), (dir_ / "torch.log").string())
            .c_str());
    std::ifstream log(dir_ / "torch.log");
    ASSERT_EQ(rc, 0) << "mla_mtp_reference.py failed:\n"
                     << std::string((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    const TensorDict torch_out = io::load_safetensors((dir_ / "outputs.safetensors").string()).tensors;

    double worst = 0;
    std::size_t compared = 0;
    auto compare = [&](const std::string& name, const Tensor& ours) {
      ASSERT_TRUE(torch_out.contains(name)) << "torch wrote no " << name;
      ASSERT_TRUE(ours.defined()) << name << ": Kiln has none";
      ASSERT_EQ(ours.shape(), torch_out.at(name).shape()) << name;
      const parity::Errors e = parity::relative_errors(ours, torch_out.at(name));
      worst = std::max({worst, e.normwise, e.max_relative});
      EXPECT_LE(e.normwise, 1e-5) << name << ": norm-wise relative error";
      EXPECT_LE(e.max_relative, 1e-5) << name << ": largest element error / largest magnitude";
      ++compared;
    };
    compare("logits", logits);
    compare("loss", loss);  // the value is the main loss; MTP enters the gradients
    ASSERT_EQ(model.mtp_losses().size(), static_cast<std::size_t>(config.mtp_num_layers));
    for (std::size_t k = 0; k < model.mtp_losses().size(); ++k)
      compare(fmt::format("mtp_loss.{}", k + 1), model.mtp_losses()[k]);
    for (const auto& [name, p] : model.named_parameters()) compare("grad." + name, p.grad());
    std::cout << fmt::format("[ parity   ] {} tensors; worst relative error {:.2e}\n", compared, worst);
  }

  fs::path dir_;
};

TEST_F(MlaMtpParity, CompressedQueriesAndTwoDepthsMatchTorch) { check(small_mla_mtp()); }

TEST_F(MlaMtpParity, LiteLayoutLayerNormBiasesTiedMatchTorch) { check(small_mla_lite()); }

// The same model with --transformer-impl transformer_engine: MLA's attention on te::attention's
// flash kernel (CPU here), V padded to the query/key head size.
TEST_F(MlaMtpParity, FlashKernelMatchesTorch) {
  GptConfig c = small_mla_mtp();
  c.transformer_impl = TransformerImpl::TransformerEngine;
  check(c);
}

}  // namespace mla_mtp_parity_test
}  // namespace kiln::models
