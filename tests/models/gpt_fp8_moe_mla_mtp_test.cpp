// GptModel with --fp8-format on the parts beyond the dense layers: a MoE model (the experts' grouped
// GEMMs through te::fp8_grouped_linear), an MLA model (its projections through te::fp8_linear, the
// ones whose sizes are not multiples of 16 kept in the model's dtype) and an MTP model (its eh_proj
// and transformer layer in FP8, also when --first-last-layers-bf16 leaves every decoder layer bf16,
// as Megatron's MTP runs under the global fp8 context). Each starts within 1% of the float32 model
// from the same seed and learns like it with every recipe, and a model with all three resumes
// bit-identically from a mid-run state_dict (the experts' per-expert scaling states included).
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/models/gpt_model.h"
#include "kiln/models/moe_layer.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/optim/optimizer.h"

namespace kiln::models {
namespace gpt_fp8_moe_mla_mtp_test {

// 2 layers x 48, 4 heads, RoPE, SwiGLU (FFN 64), 16 positions: every FP8 dimension a multiple of 16.
GptConfig base(bool fp8, te::Fp8ScalingRecipe recipe) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 48;
  c.num_attention_heads = 4;
  c.ffn_hidden_size = 64;
  c.seq_length = 16;
  c.max_position_embeddings = 32;
  c.vocab_size = 100;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.fp8 = fp8;
  c.fp8_recipe.recipe = recipe;
  c.fp8_recipe.format = te::Fp8Format::Hybrid;
  c.fp8_recipe.amax_history_len = 4;
  c.fp8_recipe.amax_compute_algo = ops::AmaxComputeAlgo::Max;
  return c;
}

// 4 experts, top-2 (64 routed rows a batch over 4 experts: counts rarely multiples of 16), FFN 32.
GptConfig with_moe(GptConfig c) {
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 32;
  return c;
}

// q 48 -> 32 -> 4 x (16 + 8); kv 48 -> 24 + 8, then 24 -> 4 x (16 + 16): linear_kv_up_proj's input
// (the kv LoRA rank, 24) is not a multiple of 16, so that projection stays in the model's dtype.
GptConfig with_mla(GptConfig c) {
  c.multi_latent_attention = true;
  c.q_lora_rank = 32;
  c.kv_lora_rank = 24;
  c.qk_head_dim = 16;
  c.qk_pos_emb_head_dim = 8;
  c.v_head_dim = 16;
  return c;
}

GptConfig with_mtp(GptConfig c) {
  c.mtp_num_layers = 1;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

std::pair<Tensor, Tensor> batch() {
  std::vector<std::int64_t> s(2 * 16 + 1);
  for (std::size_t i = 0; i < s.size(); ++i) s[i] = static_cast<std::int64_t>((i * 37 + 11) % 97);
  std::vector<std::int64_t> t(s.begin(), s.end() - 1), l(s.begin() + 1, s.end());
  return {Tensor::from_vector(t, {2, 16}), Tensor::from_vector(l, {2, 16})};
}

optim::AdamOptions adam() {
  optim::AdamOptions o = optim::AdamW::defaults();
  o.lr = 3e-3;
  return o;
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

bool linear_is_fp8(const GptModel& m, const std::string& name) {
  const auto l = std::dynamic_pointer_cast<ParallelLinear>(m.named_modules().at(name));
  EXPECT_TRUE(l) << name;
  return l && l->is_fp8();
}

void expect_learns_like_float32(GptConfig (*make)(bool, te::Fp8ScalingRecipe)) {
  GptModel ref(make(false, te::Fp8ScalingRecipe::Delayed), 7);
  optim::AdamW ref_opt(ref.parameters(), adam());
  const std::vector<double> want = train(ref, ref_opt, 20);
  ASSERT_LT(want.back(), 0.6 * want.front()) << "the float32 model must learn the batch";
  for (auto recipe :
       {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise}) {
    GptModel m(make(true, recipe), 7);
    optim::AdamW opt(m.parameters(), adam());
    const std::vector<double> got = train(m, opt, 20);
    EXPECT_NEAR(got.front(), want.front(), 0.01 * want.front()) << te::to_string(recipe);
    EXPECT_LT(got.back(), 0.6 * got.front()) << te::to_string(recipe) << " learns";
    EXPECT_NEAR(got.back(), want.back(), 0.05 * want.front())
        << te::to_string(recipe) << ": final loss " << got.back() << " vs float32 " << want.back();
  }
}

TEST(GptFp8Moe, TheExpertsRunFp8AndEachRecipeLearnsLikeTheFloat32Model) {
  GptModel m(with_moe(base(true, te::Fp8ScalingRecipe::Delayed)), 3);
  for (std::int64_t i = 0; i < 2; ++i) {
    const std::string layer = "decoder.layers." + std::to_string(i) + ".";
    EXPECT_TRUE(std::dynamic_pointer_cast<GroupedMlp>(m.named_modules().at(layer + "mlp.experts"))->is_fp8());
    EXPECT_TRUE(linear_is_fp8(m, layer + "self_attention.linear_qkv"));
    // One delayed-scaling state per expert weight, one per grouped input and output gradient.
    const TensorDict sd = m.state_dict();
    for (const char* fc : {"fc1", "fc2"}) {
      for (int e = 0; e < 4; ++e)
        EXPECT_TRUE(sd.contains(layer + "mlp.experts.fp8_" + fc + "_weight" + std::to_string(e) + "_scale"));
      EXPECT_TRUE(sd.contains(layer + "mlp.experts.fp8_" + fc + "_input_amax_history"));
      EXPECT_TRUE(sd.contains(layer + "mlp.experts.fp8_" + fc + "_grad_output_scale_inv"));
    }
  }
  expect_learns_like_float32([](bool fp8, te::Fp8ScalingRecipe r) { return with_moe(base(fp8, r)); });
}

TEST(GptFp8Mla, ProjectionsOfSizesOfMultiplesOf16RunFp8AndEachRecipeLearns) {
  GptModel m(with_mla(base(true, te::Fp8ScalingRecipe::Tensorwise)), 3);
  const std::string a = "decoder.layers.0.self_attention.";
  for (const char* name : {"linear_q_down_proj", "linear_q_up_proj", "linear_kv_down_proj", "linear_proj"})
    EXPECT_TRUE(linear_is_fp8(m, a + name)) << name;
  EXPECT_FALSE(linear_is_fp8(m, a + "linear_kv_up_proj")) << "kv LoRA rank 24 is not a multiple of 16";
  expect_learns_like_float32([](bool fp8, te::Fp8ScalingRecipe r) { return with_mla(base(fp8, r)); });
}

TEST(GptFp8Mtp, TheMtpModulesRunFp8EvenWithEveryDecoderLayerBf16AndEachRecipeLearns) {
  GptConfig c = with_mtp(base(true, te::Fp8ScalingRecipe::Tensorwise));
  c.first_last_layers_bf16 = true;
  c.num_layers_at_start_in_bf16 = 1;
  c.num_layers_at_end_in_bf16 = 1;
  GptModel m(c, 3);
  EXPECT_FALSE(linear_is_fp8(m, "decoder.layers.0.mlp.linear_fc1"));
  EXPECT_FALSE(linear_is_fp8(m, "decoder.layers.1.mlp.linear_fc1"));
  for (const char* name :
       {"mtp.layers.0.eh_proj", "mtp.layers.0.transformer_layer.self_attention.linear_qkv",
        "mtp.layers.0.transformer_layer.self_attention.linear_proj", "mtp.layers.0.transformer_layer.mlp.linear_fc1",
        "mtp.layers.0.transformer_layer.mlp.linear_fc2"})
    EXPECT_TRUE(linear_is_fp8(m, name)) << name;
  expect_learns_like_float32([](bool fp8, te::Fp8ScalingRecipe r) { return with_mtp(base(fp8, r)); });
}

TEST(GptFp8MoeMlaMtp, ResumesBitIdenticallyWithEveryScalingState) {
  const GptConfig c = with_mtp(with_mla(with_moe(base(true, te::Fp8ScalingRecipe::Delayed))));
  GptModel a(c, 5);
  optim::AdamW opt_a(a.parameters(), adam());
  train(a, opt_a, 3);
  TensorDict model_copy, opt_copy;
  for (const auto& [k, v] : a.state_dict()) model_copy.insert(k, v.clone());
  for (const auto& [k, v] : opt_a.state_dict()) opt_copy.insert(k, v.clone());
  for (const char* moved :
       {"decoder.layers.0.mlp.experts.fp8_fc2_grad_output_scale", "decoder.layers.1.mlp.experts.fp8_fc1_input_scale",
        "decoder.layers.0.self_attention.linear_kv_down_proj.fp8_input_scale",
        "mtp.layers.0.eh_proj.fp8_grad_output_scale"})
    EXPECT_NE(static_cast<const float*>(model_copy.at(moved).data_ptr())[0], 1.0f)
        << moved << " has moved on from its start";
  const std::vector<double> straight = train(a, opt_a, 3);

  GptModel b(c, 99);  // other weights, fresh state: everything must come from the checkpoint
  optim::AdamW opt_b(b.parameters(), adam());
  b.load_state_dict(model_copy, /*strict=*/true);
  opt_b.load_state_dict(opt_copy);
  const std::vector<double> resumed = train(b, opt_b, 3);
  for (std::size_t i = 0; i < straight.size(); ++i) EXPECT_EQ(resumed[i], straight[i]) << "step " << i;
}

}  // namespace gpt_fp8_moe_mla_mtp_test
}  // namespace kiln::models
