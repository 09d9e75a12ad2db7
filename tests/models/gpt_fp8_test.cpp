// GptModel with --fp8-format: every decoder linear is an FP8 linear, the model learns with each
// recipe about as a float32 model from the same seed does, --first-last-layers-bf16 keeps the named
// layers out, the delayed recipe's scaling state stays float32 in a bf16 model, and a model and
// optimizer state saved mid-run resume bit-identically (scaling state included).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/models/gpt_model.h"
#include "kiln/models/transformer_layer.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/error.h"
#include "small_configs.h"

namespace kiln::models {
namespace gpt_fp8_test {

// 2 layers x 48, 4 heads (QKV 144), FFN 192, 16 positions: every FP8 dimension a multiple of 16.
GptConfig fp8_config(bool fp8, te::Fp8ScalingRecipe recipe) {
  GptConfig c = test_configs::small_gpt2();
  c.seq_length = 16;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.fp8 = fp8;
  c.fp8_recipe.recipe = recipe;
  c.fp8_recipe.format = te::Fp8Format::Hybrid;
  c.fp8_recipe.amax_history_len = 4;
  c.fp8_recipe.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  return c;
}

// A batch of 2 x 16 tokens to memorise (labels: the next token of a fixed pseudo-random stream).
std::pair<Tensor, Tensor> batch() {
  std::vector<std::int64_t> s(2 * 16 + 1);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::int64_t>((i * 37 + 11) % 97);
  std::vector<std::int64_t> t(s.begin(), s.end() - 1), l(s.begin() + 1, s.end());
  return {Tensor::from_vector(t, {2, 16}), Tensor::from_vector(l, {2, 16})};
}

std::vector<double> train(GptModel& m, optim::Optimizer& opt, int steps) {
  const auto [tokens, labels] = batch();
  std::vector<double> losses;
  for (int i = 0; i < steps; ++i) {
    opt.zero_grad();
    Tensor loss = m.loss(tokens, labels, Tensor());
    loss.backward();
    opt.step();
    losses.push_back(loss.item());
  }
  return losses;
}

optim::AdamOptions adam() {
  optim::AdamOptions o = optim::AdamW::defaults();
  o.lr = 3e-3;
  return o;
}

TEST(GptFp8, EveryDecoderLinearIsFp8AndTheFirstLastLayersCanStayBf16) {
  GptConfig c = fp8_config(true, te::Fp8ScalingRecipe::Tensorwise);
  c.num_layers = 3;
  c.first_last_layers_bf16 = true;
  c.num_layers_at_start_in_bf16 = 1;
  c.num_layers_at_end_in_bf16 = 1;
  GptModel m(c, 3);
  const auto modules = m.named_modules();
  for (std::int64_t i = 0; i < 3; ++i) {
    const bool fp8 = i == 1;
    for (const char* name :
         {"self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2"})
      EXPECT_EQ(std::dynamic_pointer_cast<ParallelLinear>(
                    modules.at("decoder.layers." + std::to_string(i) + "." + std::string(name)))
                    ->is_fp8(),
                fp8)
          << "layer " << i << " " << name;
  }
}

TEST(GptFp8, EachRecipeLearnsLikeTheFloat32Model) {
  GptModel ref(fp8_config(false, te::Fp8ScalingRecipe::Delayed), 7);
  optim::AdamW ref_opt(ref.parameters(), adam());
  const std::vector<double> want = train(ref, ref_opt, 25);
  ASSERT_LT(want.back(), 0.5 * want.front()) << "the float32 model must learn the batch";
  for (auto recipe :
       {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
    GptModel m(fp8_config(true, recipe), 7);
    optim::AdamW opt(m.parameters(), adam());
    const std::vector<double> got = train(m, opt, 25);
    EXPECT_NEAR(got.front(), want.front(), 0.01 * want.front()) << te::to_string(recipe);
    EXPECT_LT(got.back(), 0.5 * got.front()) << te::to_string(recipe) << " learns";
    EXPECT_NEAR(got.back(), want.back(), 0.05 * want.front())
        << te::to_string(recipe) << ": final loss " << got.back() << " vs float32 " << want.back();
  }
}

TEST(GptFp8, ScalingStateStaysFloat32InABf16Model) {
  GptModel m(fp8_config(true, te::Fp8ScalingRecipe::Delayed), 5);
  m.to(DType::BF16);
  int states = 0;
  for (const auto& [name, t] : m.state_dict())
    if (is_fp8_scaling_state(name)) {
      ++states;
      EXPECT_EQ(t.dtype(), DType::F32) << name;
    } else {
      EXPECT_EQ(t.dtype(), DType::BF16) << name;
    }
  EXPECT_EQ(states, 2 * 4 * 3 * 3);  // layers x linears x (input, weight, grad_output) x 3 tensors
  const auto [tokens, labels] = batch();
  Tensor loss = m.loss(tokens, labels, Tensor());
  loss.backward();
  EXPECT_TRUE(std::isfinite(loss.item()));
  const Tensor scale = m.state_dict().at("decoder.layers.1.mlp.linear_fc2.fp8_grad_output_scale");
  EXPECT_NE(static_cast<const float*>(scale.data_ptr())[0], 1.0f) << "the backward's cast updated its scale";
}

TEST(GptFp8, ResumesBitIdenticallyWithTheScalingState) {
  const GptConfig c = fp8_config(true, te::Fp8ScalingRecipe::Delayed);
  GptModel a(c, 5);
  optim::AdamW opt_a(a.parameters(), adam());
  train(a, opt_a, 3);
  const TensorDict saved_model = a.state_dict(), saved_opt = opt_a.state_dict();
  TensorDict model_copy, opt_copy;
  for (const auto& [k, v] : saved_model) model_copy.insert(k, v.clone());
  for (const auto& [k, v] : saved_opt) opt_copy.insert(k, v.clone());
  EXPECT_NE(static_cast<const float*>(model_copy.at("decoder.layers.0.mlp.linear_fc1.fp8_input_scale").data_ptr())[0],
            1.0f)
      << "the state has moved on from its start";
  const std::vector<double> straight = train(a, opt_a, 3);

  GptModel b(c, 99);  // other weights, fresh state: everything must come from the checkpoint
  optim::AdamW opt_b(b.parameters(), adam());
  b.load_state_dict(model_copy, /*strict=*/true);
  opt_b.load_state_dict(opt_copy);
  const std::vector<double> resumed = train(b, opt_b, 3);
  for (std::size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;
}

// --transformer-impl transformer_engine with the delayed recipe: the norms (and SwiGLU) write the
// next linears' FP8 inputs themselves and the layer batches its scaling updates. GPT-2 style
// (LayerNorm, GELU) and Llama style (RMSNorm, SwiGLU, RoPE, GQA): the model learns the batch like the
// float32 model with the same ops, and resumes bit-identically from a mid-run state.
class GptFp8FusedCasts : public ::testing::TestWithParam<bool> {};

GptConfig fused_config(bool llama, bool fp8) {
  GptConfig c = llama ? test_configs::small_llama() : fp8_config(fp8, te::Fp8ScalingRecipe::Delayed);
  if (llama) {  // 16 positions (tokens a batch: a multiple of 16); every width already one
    c.seq_length = 16;
    c.attention_dropout = 0;
    c.hidden_dropout = 0;
    c.fp8 = fp8;
    c.fp8_recipe.recipe = te::Fp8ScalingRecipe::Delayed;
    c.fp8_recipe.format = te::Fp8Format::Hybrid;
    c.fp8_recipe.amax_history_len = 4;
    c.fp8_recipe.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  }
  c.transformer_impl = TransformerImpl::TransformerEngine;
  return c;
}

TEST_P(GptFp8FusedCasts, LearnsLikeTheFloat32ModelAndResumesBitIdentically) {
  const bool llama = GetParam();
  GptModel ref(fused_config(llama, false), 7);
  optim::AdamW ref_opt(ref.parameters(), adam());
  const std::vector<double> want = train(ref, ref_opt, 25);
  GptModel m(fused_config(llama, true), 7);
  for (const auto& [name, module] : m.named_modules())
    if (const auto layer = std::dynamic_pointer_cast<TransformerLayer>(module)) {
      EXPECT_TRUE(layer->fp8_fused_casts()) << name << " runs the fused casts";
    }
  GptConfig local = fused_config(llama, true);
  local.transformer_impl = TransformerImpl::Local;
  for (const auto& [name, module] : GptModel(local, 7).named_modules())
    if (const auto layer = std::dynamic_pointer_cast<TransformerLayer>(module)) {
      EXPECT_FALSE(layer->fp8_fused_casts()) << name << ": the local ops keep their own numerics";
    }
  optim::AdamW opt(m.parameters(), adam());
  const std::vector<double> got = train(m, opt, 25);
  EXPECT_NEAR(got.front(), want.front(), 0.01 * want.front());
  EXPECT_LT(got.back(), 0.5 * got.front()) << "learns";
  EXPECT_NEAR(got.back(), want.back(), 0.05 * want.front()) << "final loss " << got.back() << " vs " << want.back();

  TensorDict model_copy, opt_copy;
  for (const auto& [k, v] : m.state_dict()) model_copy.insert(k, v.clone());
  for (const auto& [k, v] : opt.state_dict()) opt_copy.insert(k, v.clone());
  const std::vector<double> straight = train(m, opt, 3);
  GptModel b(fused_config(llama, true), 99);
  optim::AdamW opt_b(b.parameters(), adam());
  b.load_state_dict(model_copy, /*strict=*/true);
  opt_b.load_state_dict(opt_copy);
  const std::vector<double> resumed = train(b, opt_b, 3);
  for (std::size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;
}

INSTANTIATE_TEST_SUITE_P(Styles, GptFp8FusedCasts, ::testing::Values(false, true),
                         [](const auto& info) { return info.param ? "llama" : "gpt2"; });

TEST(GptFp8, ConfigRefusesWhatHasNoFp8PathNamingTheFlag) {
  auto refuse = [](GptConfig c, const char* part) {
    try {
      c.validate();
      ADD_FAILURE() << "accepted; expected '" << part << "'";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  GptConfig c = fp8_config(true, te::Fp8ScalingRecipe::Delayed);
  GptConfig odd = c;
  odd.hidden_size = 40;
  odd.num_attention_heads = 4;
  refuse(odd, "--hidden-size to be a multiple of 16");
  GptConfig moe = c;  // the experts' grouped GEMMs run FP8 now; their FFN size must fit them
  moe.add_bias_linear = false;
  moe.num_experts = 4;
  moe.moe_ffn_hidden_size = 40;
  refuse(moe, "--moe-ffn-hidden-size to be a multiple of 16");
  GptConfig layers = c;
  layers.first_last_layers_bf16 = true;
  layers.num_layers_at_start_in_bf16 = 2;
  layers.num_layers_at_end_in_bf16 = 1;
  refuse(layers, "exceed --num-layers");
  GptConfig hist = c;
  hist.fp8_recipe.amax_history_len = 0;
  refuse(hist, "--fp8-amax-history-len");
  GptConfig recompute = c;
  recompute.recompute_granularity = RecomputeGranularity::Full;
  refuse(recompute, "--recompute-granularity full");
  GptConfig no_fp8 = fp8_config(false, te::Fp8ScalingRecipe::Delayed);
  no_fp8.first_last_layers_bf16 = true;
  refuse(no_fp8, "--first-last-layers-bf16 only applies with --fp8-format");
}

}  // namespace gpt_fp8_test
}  // namespace kiln::models
