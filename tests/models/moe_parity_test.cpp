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
#include "torch_parity.h"

namespace kiln::models {
namespace moe_parity_test {

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

struct Variant {
  std::string name;
  MoeSpec spec;
};

// Kiln's side of one variant: the layer (its gradients), input, output and router counts.
struct KilnRun {
  std::shared_ptr<MoeLayer> layer;
  Tensor x, y;
  RouterStats stats;
};

KilnRun run_kiln(const MoeSpec& spec, const fs::path& dir) {
  KilnRun run;
  run.layer = std::make_shared<MoeLayer>(spec, LayerContext{});
  MoeLayer& layer = *run.layer;
  layer.train();
  Generator gen(7);
  {
    NoGradGuard no_grad;
    for (const auto& [name, p] : layer.named_parameters()) nn::init::normal_(p, 0.0, 0.3, &gen);
    if (layer.router->expert_bias.defined()) nn::init::normal_(layer.router->expert_bias, 0.0, 0.1, &gen);
  }
  const std::int64_t b = 2, t = spec.seq_length, h = spec.hidden_size;
  run.x = nn::init::normal_(Tensor::zeros({b, t, h}), 0.0, 1.0, &gen).detach();
  run.x.requires_grad_(true);
  const Tensor r = nn::init::normal_(Tensor::zeros({b, t, h}), 0.0, 1.0, &gen).detach();

  TensorDict inputs;
  inputs.insert("x", run.x.detach());
  inputs.insert("r", r);
  nlohmann::json names = nlohmann::json::array();
  for (const auto& [name, p] : layer.named_parameters()) {
    inputs.insert(name, p.detach().clone());
    names.push_back(name);
  }
  if (layer.router->expert_bias.defined()) inputs.insert("router.expert_bias", layer.router->expert_bias.clone());
  io::save_safetensors((dir / "inputs.safetensors").string(), inputs);

  run.y = layer.forward(run.x);
  sum(mul(run.y, r)).backward();
  run.stats = layer.router->take_stats();
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
  std::ofstream(dir / "config.json") << c.dump(2);
  return run;
}

void compare_with_torch(const KilnRun& run, const MoeSpec& spec, const fs::path& dir) {
  const TensorDict torch_out = io::load_safetensors((dir / "outputs.safetensors").string()).tensors;
  double worst = 0;
  auto compare = [&](const std::string& name, const Tensor& ours) {
    ASSERT_TRUE(torch_out.contains(name)) << "torch wrote no " << name;
    ASSERT_TRUE(ours.defined()) << name << ": Kiln has none";
    ASSERT_EQ(ours.numel(), torch_out.at(name).numel()) << name;
    const double e = normwise_error(ours, torch_out.at(name));
    worst = std::max(worst, e);
    EXPECT_LE(e, 1e-5) << name << ": norm-wise relative error";
  };
  compare("y", run.y);
  compare("grad.x", run.x.grad());
  for (const auto& [name, p] : run.layer->named_parameters()) compare("grad." + name, p.grad());
  // Counts are exact.
  const auto as_doubles = [](const std::vector<std::int64_t>& v) { return std::vector<double>(v.begin(), v.end()); };
  EXPECT_EQ(as_doubles(run.stats.tokens), torch_out.at("tokens").to_vector<double>());
  EXPECT_EQ(as_doubles(run.stats.dropped), torch_out.at("dropped").to_vector<double>());
  const double aux = torch_out.at("aux_loss").item(), z = torch_out.at("z_loss").item();
  EXPECT_NEAR(run.stats.load_balancing_loss, aux, 1e-6 * std::max(1.0, std::abs(aux)));
  EXPECT_NEAR(run.stats.z_loss, z, 1e-5 * std::max(1.0, std::abs(z)));
  if (spec.expert_bias) compare("new_expert_bias", run.layer->router->expert_bias);
  std::cout << fmt::format("[ parity   ] worst norm-wise relative error {:.2e}; tokens per expert [{}], dropped [{}]\n",
                           worst, fmt::join(run.stats.tokens, " "), fmt::join(run.stats.dropped, " "));
}

std::vector<Variant> variants() {
  std::vector<Variant> v;
  MoeSpec s = base_spec();
  s.activation = MlpActivation::SwiGLU;
  s.z_loss_coeff = 0.001;
  v.push_back({"softmax_top2_aux_z_swiglu", s});
  s.grouped_gemm = s.permute_fusion = false;
  v.push_back({"unfused_reference_path", s});

  s = base_spec();
  s.router.pre_softmax = true;
  s.router.scaling_factor = 2.5;
  s.load_balancing = MoeLoadBalancing::SeqAuxLoss;
  v.push_back({"pre_softmax_scaling_seq_aux_loss", s});

  s = base_spec();
  s.router.topk = 1;
  v.push_back({"top1_softmax", s});

  s = base_spec();
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
  v.push_back({"sigmoid_expert_bias_groups_shared_expert", s});

  s = base_spec();
  s.capacity_factor = 1.0;
  s.z_loss_coeff = 0.001;
  v.push_back({"capacity_drop_by_probs", s});

  s = base_spec();
  s.capacity_factor = 0.75;
  s.drop_policy = MoeTokenDropPolicy::Position;
  s.pad_to_capacity = true;
  v.push_back({"capacity_drop_by_position_padded", s});

  s = base_spec();
  s.router.score = te::RouterScore::Sigmoid;
  s.expert_bias = true;
  s.bias_update_rate = 0.01;
  s.capacity_factor = 0.75;
  s.pad_to_capacity = true;
  s.grouped_gemm = s.permute_fusion = false;
  v.push_back({"capacity_padded_unfused_sigmoid_bias", s});
  return v;
}

// Every variant against torch, in one Python process (importing torch takes seconds).
TEST(MoeParity, RouterLossesCapacityAndBiasMatchTorch) {
  const std::string python = parity::find_torch_python();
  if (python.empty()) GTEST_SKIP() << "no python3 that imports torch ($KILN_PARITY_PYTHON, /usr/bin/python3)";
  set_moe_aux_loss_scale(1.0);
  const fs::path root = fs::path(KILN_BINARY_DIR) / "parity" / "moe";
  fs::remove_all(root);
  std::vector<KilnRun> runs;
  std::string dirs;
  for (const Variant& v : variants()) {
    const fs::path dir = root / v.name;
    fs::create_directories(dir);
    runs.push_back(run_kiln(v.spec, dir));
    dirs += " " + dir.string();
  }
  const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests" / "parity" / "moe_reference.py";
  const std::string cmd =
      fmt::format("{} {}{} > {} 2>&1", python, script.string(), dirs, (root / "torch.log").string());
  const int rc = std::system(cmd.c_str());
  std::ifstream log(root / "torch.log");
  const std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
  ASSERT_EQ(rc, 0) << "moe_reference.py failed:\n" << text;
  const std::vector<Variant> all = variants();
  for (std::size_t i = 0; i < all.size(); ++i) {
    SCOPED_TRACE(all[i].name);
    compare_with_torch(runs[i], all[i].spec, root / all[i].name);
  }
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

}  // namespace moe_parity_test
}  // namespace kiln::models
