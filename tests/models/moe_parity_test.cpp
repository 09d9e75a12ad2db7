// Mixture-of-experts parity with PyTorch (tests/parity/moe_reference.py, float64 from the papers'
// equations as Megatron-core computes them) on the CPU in float32: one MoeLayer per variant of the
// router (softmax / pre-softmax / sigmoid with expert bias, scaling factor, group-limited top-k),
// the load-balancing losses (aux_loss, seq_aux_loss, z-loss), capacity dropping (both policies,
// with and without padding) and the shared expert, through the fused kernels and the unfused
// reference path. Compared: the output, the input's and every parameter's gradient (the aux losses
// reach them through the autograd hook), the per-expert routed and dropped counts, the aux loss
// values, and the expert bias after DeepSeek-V3's update.
#include <fmt/ranges.h>
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/gpt_model.h"
#include "kiln/models/moe_aux_loss.h"
#include "kiln/models/moe_layer.h"
#include "kiln/nn/init.h"
#include "kiln/tensor/grad_mode.h"
#include "torch_python.h"

namespace kiln::models {
namespace {

namespace fs = std::filesystem;

double normwise_error(const Tensor& ours, const Tensor& theirs) {
  const auto a = ours.to_vector<double>(), b = theirs.to_vector<double>();
  double diff2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff2 += (a[i] - b[i]) * (a[i] - b[i]);
    ref2 += b[i] * b[i];
  }
  return ref2 == 0 ? std::sqrt(diff2) : std::sqrt(diff2 / ref2);
}

MoeSpec base_spec() {
  MoeSpec s;
  s.hidden_size = 16;
  s.num_experts = 4;
  s.ffn_hidden_size = 8;
  s.router.topk = 2;
  s.aux_loss_coeff = 0.01;
  s.grouped_gemm = true;
  s.permute_fusion = true;
  s.seq_length = 8;
  return s;
}

class MoeParity : public ::testing::Test {
 protected:
  static const std::string& python() {
    static const std::string found = test_python::find_torch_python();
    return found;
  }

  void SetUp() override {
    if (python().empty()) GTEST_SKIP() << "no python3 that imports torch ($KILN_PARITY_PYTHON, /usr/bin/python3)";
    dir_ =
        fs::path(KILN_BINARY_DIR) / "parity" / "moe" / ::testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
    set_moe_aux_loss_scale(1.0);
  }

  void check(const MoeSpec& spec) {
    LayerContext context;
    MoeLayer layer(spec, context);
    layer.train();
    Generator gen(7);
    {
      NoGradGuard no_grad;
      for (const auto& [name, p] : layer.named_parameters()) nn::init::normal_(p, 0.0, 0.3, &gen);
      if (layer.router->expert_bias.defined()) nn::init::normal_(layer.router->expert_bias, 0.0, 0.1, &gen);
    }
    const std::int64_t b = 2, t = spec.seq_length, h = spec.hidden_size;
    Tensor x = nn::init::normal_(Tensor::zeros({b, t, h}), 0.0, 1.0, &gen).detach();
    x.requires_grad_(true);
    const Tensor r = nn::init::normal_(Tensor::zeros({b, t, h}), 0.0, 1.0, &gen).detach();

    TensorDict inputs;
    inputs.insert("x", x.detach());
    inputs.insert("r", r);
    nlohmann::json names = nlohmann::json::array();
    for (const auto& [name, p] : layer.named_parameters()) {
      inputs.insert(name, p.detach().clone());
      names.push_back(name);
    }
    if (layer.router->expert_bias.defined()) inputs.insert("router.expert_bias", layer.router->expert_bias.clone());
    io::save_safetensors((dir_ / "inputs.safetensors").string(), inputs);

    Tensor y = layer.forward(x);
    sum(mul(y, r)).backward();
    const RouterStats stats = layer.router->take_stats();
    layer.router->update_expert_bias();

    const bool softmax = spec.router.score == te::RouterScore::Softmax;
    nlohmann::json c = {{"parameters", names},
                        {"num_experts", spec.num_experts},
                        {"topk", spec.router.topk},
                        {"score", softmax ? "softmax" : "sigmoid"},
                        {"pre_softmax", spec.router.pre_softmax},
                        {"scaling_factor", spec.router.scaling_factor},
                        {"num_groups", spec.router.num_groups},
                        {"group_topk", spec.router.group_topk},
                        {"capacity_factor", spec.capacity_factor},
                        {"drop_policy", spec.drop_policy == MoeTokenDropPolicy::Probs ? "probs" : "position"},
                        {"load_balancing", std::string(to_string(spec.load_balancing))},
                        {"aux_loss_coeff", spec.aux_loss_coeff},
                        {"z_loss_coeff", spec.z_loss_coeff},
                        {"swiglu", spec.activation == MlpActivation::SwiGLU},
                        {"bias_update_rate", spec.bias_update_rate}};
    std::ofstream(dir_ / "config.json") << c.dump(2);
    const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "moe_reference.py";
    const std::string cmd =
        fmt::format("{} {} {} > {} 2>&1", python(), script.string(), dir_.string(), (dir_ / "torch.log").string());
    const int rc = std::system(cmd.c_str());
    std::ifstream log(dir_ / "torch.log");
    const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
    ASSERT_EQ(rc, 0) << "moe_reference.py failed:\n" << text;
    const TensorDict torch_out = io::load_safetensors((dir_ / "outputs.safetensors").string()).tensors;

    double worst = 0;
    auto compare = [&](const std::string& name, const Tensor& ours, double bound = 1e-5) {
      ASSERT_TRUE(torch_out.contains(name)) << "torch wrote no " << name;
      ASSERT_TRUE(ours.defined()) << name << ": Kiln has none";
      ASSERT_EQ(ours.numel(), torch_out.at(name).numel()) << name;
      const double e = normwise_error(ours, torch_out.at(name));
      worst = std::max(worst, e);
      EXPECT_LE(e, bound) << name << ": norm-wise relative error";
    };
    compare("y", y);
    compare("grad.x", x.grad());
    for (const auto& [name, p] : layer.named_parameters()) compare("grad." + name, p.grad());
    // Counts are exact.
    EXPECT_EQ(Tensor::from_vector(stats.tokens, {spec.num_experts}).to(DType::F64).to_vector<double>(),
              torch_out.at("tokens").to(DType::F64).to_vector<double>());
    EXPECT_EQ(Tensor::from_vector(stats.dropped, {spec.num_experts}).to(DType::F64).to_vector<double>(),
              torch_out.at("dropped").to(DType::F64).to_vector<double>());
    EXPECT_NEAR(stats.load_balancing_loss, torch_out.at("aux_loss").item(),
                1e-6 * std::max(1.0, std::abs(torch_out.at("aux_loss").item())));
    EXPECT_NEAR(stats.z_loss, torch_out.at("z_loss").item(),
                1e-5 * std::max(1.0, std::abs(torch_out.at("z_loss").item())));
    if (layer.router->expert_bias.defined()) compare("new_expert_bias", layer.router->expert_bias);
    std::cout << fmt::format(
        "[ parity   ] worst norm-wise relative error {:.2e}; tokens per expert [{}], dropped [{}]\n", worst,
        fmt::join(stats.tokens, " "), fmt::join(stats.dropped, " "));
  }

  fs::path dir_;
};

TEST_F(MoeParity, SoftmaxTop2AuxAndZLossSwiglu) {
  MoeSpec s = base_spec();
  s.activation = MlpActivation::SwiGLU;
  s.z_loss_coeff = 0.001;
  check(s);
}

TEST_F(MoeParity, UnfusedReferencePath) {
  MoeSpec s = base_spec();
  s.activation = MlpActivation::SwiGLU;
  s.z_loss_coeff = 0.001;
  s.grouped_gemm = false;
  s.permute_fusion = false;
  check(s);
}

TEST_F(MoeParity, PreSoftmaxScalingSeqAuxLoss) {
  MoeSpec s = base_spec();
  s.router.pre_softmax = true;
  s.router.scaling_factor = 2.5;
  s.load_balancing = MoeLoadBalancing::SeqAuxLoss;
  check(s);
}

TEST_F(MoeParity, Top1Softmax) {
  MoeSpec s = base_spec();
  s.router.topk = 1;
  check(s);
}

TEST_F(MoeParity, SigmoidExpertBiasGroupLimitedSharedExpert) {
  MoeSpec s = base_spec();
  s.num_experts = 8;
  s.router.score = te::RouterScore::Sigmoid;
  s.router.topk = 4;
  s.router.num_groups = 4;
  s.router.group_topk = 2;
  s.router.scaling_factor = 2.5;
  s.expert_bias = true;
  s.bias_update_rate = 0.01;
  s.shared_expert_ffn = 12;
  s.activation = MlpActivation::SwiGLU;
  check(s);
}

TEST_F(MoeParity, CapacityDropByProbs) {
  MoeSpec s = base_spec();
  s.capacity_factor = 1.0;
  s.z_loss_coeff = 0.001;
  check(s);
}

TEST_F(MoeParity, CapacityDropByPositionPadded) {
  MoeSpec s = base_spec();
  s.capacity_factor = 0.75;
  s.drop_policy = MoeTokenDropPolicy::Position;
  s.pad_to_capacity = true;
  check(s);
}

TEST_F(MoeParity, CapacityPaddedUnfusedSigmoidBias) {
  MoeSpec s = base_spec();
  s.router.score = te::RouterScore::Sigmoid;
  s.expert_bias = true;
  s.bias_update_rate = 0.01;
  s.capacity_factor = 0.75;
  s.pad_to_capacity = true;
  s.grouped_gemm = false;
  s.permute_fusion = false;
  check(s);
}

// ---- config: bad input is refused naming the flags; the parameter count matches the model.

GptConfig small_moe() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 100;
  c.add_bias_linear = false;
  c.swiglu = true;
  c.ffn_hidden_size = 48;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 24;
  c.moe_router_topk = 2;
  return c;
}

std::string error_of(const GptConfig& c) {
  try {
    c.validate();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

TEST(MoeConfig, RefusesInconsistentFlagsNamingThem) {
  GptConfig c = small_moe();
  c.moe_router_topk = 5;
  EXPECT_NE(error_of(c).find("--moe-router-topk (5) must be between 1 and --num-experts (4)"), std::string::npos)
      << error_of(c);
  c = small_moe();
  c.moe_router_num_groups = 2;
  c.moe_router_group_topk = 3;
  EXPECT_NE(error_of(c).find("--moe-router-group-topk (3) exceeds --moe-router-num-groups (2)"), std::string::npos)
      << error_of(c);
  c = small_moe();
  c.moe_router_num_groups = 3;
  c.moe_router_group_topk = 1;
  EXPECT_NE(error_of(c).find("--num-experts (4) must be divisible by --moe-router-num-groups (3"), std::string::npos)
      << error_of(c);
  c = small_moe();
  c.moe_router_group_topk = 1;
  EXPECT_NE(error_of(c).find("--moe-router-num-groups and --moe-router-group-topk"), std::string::npos) << error_of(c);
  c = small_moe();
  c.moe_expert_capacity_factor_set = true;
  c.moe_expert_capacity_factor = 0;
  EXPECT_NE(error_of(c).find("--moe-expert-capacity-factor must be positive"), std::string::npos) << error_of(c);
  c.moe_expert_capacity_factor = -1;
  EXPECT_NE(error_of(c).find("--moe-expert-capacity-factor must be positive"), std::string::npos) << error_of(c);
  c = small_moe();
  c.moe_pad_expert_input_to_capacity = true;
  EXPECT_NE(error_of(c).find("--moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor"),
            std::string::npos);
  c = small_moe();
  c.moe_router_enable_expert_bias = true;
  EXPECT_NE(error_of(c).find("--moe-router-enable-expert-bias needs --moe-router-score-function sigmoid"),
            std::string::npos);
  c = small_moe();
  c.add_bias_linear = true;
  EXPECT_NE(error_of(c).find("--disable-bias-linear"), std::string::npos);
  EXPECT_EQ(error_of(small_moe()), "");
}

TEST(MoeConfig, LayerFreqForms) {
  GptConfig c = small_moe();
  c.num_layers = 4;
  parse_moe_layer_freq("2", c);
  EXPECT_TRUE(c.is_moe_layer(0));
  EXPECT_FALSE(c.is_moe_layer(1));
  EXPECT_TRUE(c.is_moe_layer(2));
  EXPECT_EQ(c.num_moe_layers(), 2);
  parse_moe_layer_freq("[0,1,1,0]", c);
  EXPECT_FALSE(c.is_moe_layer(0));
  EXPECT_TRUE(c.is_moe_layer(1));
  EXPECT_EQ(c.num_moe_layers(), 2);
  EXPECT_EQ(error_of(c), "");
  parse_moe_layer_freq("[1,0]", c);
  EXPECT_NE(error_of(c).find("--moe-layer-freq lists 2 layers, --num-layers is 4"), std::string::npos);
  EXPECT_THROW(parse_moe_layer_freq("[1,2]", c), std::exception);
  EXPECT_THROW(parse_moe_layer_freq("x", c), std::exception);
}

TEST(MoeConfig, ParameterCountAndNamesMatchTheModel) {
  GptConfig c = small_moe();
  c.moe_shared_expert_intermediate_size = 16;
  c.moe_layer_pattern = {1, 0};
  GptModel model(c, 3);
  EXPECT_EQ(model.num_parameters(), c.num_parameters());
  const TensorDict params = model.named_parameters();
  EXPECT_TRUE(params.contains("decoder.layers.0.mlp.router.weight"));
  EXPECT_EQ(params.at("decoder.layers.0.mlp.experts.weight1").shape(), (Shape{4, 48, 32}));
  EXPECT_EQ(params.at("decoder.layers.0.mlp.experts.weight2").shape(), (Shape{4, 32, 24}));
  EXPECT_TRUE(params.contains("decoder.layers.0.mlp.shared_experts.linear_fc1.weight"));
  EXPECT_TRUE(params.contains("decoder.layers.1.mlp.linear_fc1.weight"));  // a dense layer
  // Megatron's FLOPs: the MoE layer's MLP counts top-k experts of F_moe plus the shared expert.
  GptConfig dense = c;
  dense.num_experts = 0;
  const double h = 32, mlp_dense = h * 48 * 3, mlp_moe = h * (24 * 2 + 16) * 3;
  EXPECT_NEAR(c.flops_per_token() - dense.flops_per_token(), 6 * (mlp_moe - mlp_dense), 1e-6);
}

}  // namespace
}  // namespace kiln::models
