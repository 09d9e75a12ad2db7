// GptModel on the CPU: Megatron-core's parameter names and shapes, parameter counts, Megatron's init,
// KV-cache generation against the full forward, activation recompute (bit-identical gradients),
// bf16, the masked loss.
#include "kiln/models/gpt_model.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace gpt_model_test {

GptConfig tiny_gpt2() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 10;
  c.max_position_embeddings = 16;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 8;  // padded to 56
  return c;
}

GptConfig tiny_llama() {
  GptConfig c = GptConfig::llama3_8b(50);
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 8;
  c.seq_length = 10;
  c.max_position_embeddings = 16;
  c.make_vocab_size_divisible_by = 1;
  return c;
}

Tensor ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::int64_t salt) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>((i * 7 + 3 + salt * 13) % vocab);
  return Tensor::from_vector(v, {b, t});
}

double max_abs(const std::vector<double>& v) {
  double m = 0;
  for (double x : v) m = std::max(m, std::abs(x));
  return m;
}

TEST(GptModel, ParameterNamesAndShapesAreMegatronCores) {
  GptModel gpt(tiny_gpt2(), 1);
  std::vector<std::pair<std::string, Shape>> want = {{"embedding.word_embeddings.weight", {56, 32}},
                                                     {"embedding.position_embeddings.weight", {16, 32}}};
  for (int i = 0; i < 2; ++i) {
    const std::string p = fmt::format("decoder.layers.{}.", i);
    want.insert(want.end(), {{p + "input_layernorm.weight", {32}},
                             {p + "input_layernorm.bias", {32}},
                             {p + "self_attention.linear_qkv.weight", {96, 32}},
                             {p + "self_attention.linear_qkv.bias", {96}},
                             {p + "self_attention.linear_proj.weight", {32, 32}},
                             {p + "self_attention.linear_proj.bias", {32}},
                             {p + "pre_mlp_layernorm.weight", {32}},
                             {p + "pre_mlp_layernorm.bias", {32}},
                             {p + "mlp.linear_fc1.weight", {128, 32}},
                             {p + "mlp.linear_fc1.bias", {128}},
                             {p + "mlp.linear_fc2.weight", {32, 128}},
                             {p + "mlp.linear_fc2.bias", {32}}});
  }
  want.insert(want.end(), {{"decoder.final_layernorm.weight", {32}}, {"decoder.final_layernorm.bias", {32}}});
  const TensorDict got = gpt.named_parameters();
  ASSERT_EQ(got.size(), want.size());
  for (std::size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].first, want[i].first);
    EXPECT_EQ(got[i].second.shape(), want[i].second) << want[i].first;
  }
  EXPECT_TRUE(gpt.output_weight().is_same(gpt.embedding->word_embeddings->weight));  // tied

  GptModel llama(tiny_llama(), 1);
  const TensorDict l = llama.named_parameters();
  // 1 embedding + 2 x (2 norms + qkv + proj + fc1 + fc2) + final norm + output layer, no biases.
  ASSERT_EQ(l.size(), 1u + 2 * 6 + 1 + 1);
  EXPECT_EQ(l.at("decoder.layers.0.self_attention.linear_qkv.weight").shape(), (Shape{(4 + 2 * 2) * 8, 32}));
  EXPECT_EQ(l.at("decoder.layers.0.self_attention.linear_proj.weight").shape(), (Shape{32, 4 * 8}));
  EXPECT_EQ(l.at("decoder.layers.1.mlp.linear_fc1.weight").shape(), (Shape{2 * 48, 32}));
  EXPECT_EQ(l.at("decoder.layers.1.mlp.linear_fc2.weight").shape(), (Shape{32, 48}));
  EXPECT_EQ(l.at("output_layer.weight").shape(), (Shape{50, 32}));
  EXPECT_FALSE(l.contains("embedding.position_embeddings.weight"));
  EXPECT_FALSE(l.contains("decoder.final_layernorm.bias"));
}

TEST(GptModel, NumParametersMatchesTheBuiltModel) {
  for (const GptConfig& c : {tiny_gpt2(), tiny_llama()}) {
    GptModel m(c, 1);
    EXPECT_EQ(m.num_parameters(), c.num_parameters());
  }
  // The full-size GPT-2 124M with Hugging Face's unpadded vocabulary: 124,439,808 parameters.
  GptConfig gpt2 = GptConfig::gpt2_124m(50257);
  gpt2.make_vocab_size_divisible_by = 1;
  GptModel m(gpt2, 1);
  EXPECT_EQ(m.num_parameters(), 124439808);
}

TEST(GptModel, MegatronInitialisation) {
  GptConfig c = tiny_gpt2();
  c.num_layers = 4;
  c.hidden_size = 128;
  c.init_method_std = 0.05;
  GptModel m(c, 42);
  auto stddev = [](const Tensor& t) {
    const auto v = t.to_vector<double>();
    double s = 0, s2 = 0;
    for (double x : v) s += x, s2 += x * x;
    const double mean = s / static_cast<double>(v.size());
    return std::sqrt(s2 / static_cast<double>(v.size()) - mean * mean);
  };
  const TensorDict p = m.named_parameters();
  const double out_std = 0.05 / std::sqrt(2.0 * 4);
  EXPECT_NEAR(stddev(p.at("decoder.layers.0.self_attention.linear_qkv.weight")), 0.05, 0.05 * 0.02);
  EXPECT_NEAR(stddev(p.at("decoder.layers.0.mlp.linear_fc1.weight")), 0.05, 0.05 * 0.02);
  EXPECT_NEAR(stddev(p.at("embedding.word_embeddings.weight")), 0.05, 0.05 * 0.02);
  EXPECT_NEAR(stddev(p.at("decoder.layers.3.self_attention.linear_proj.weight")), out_std, out_std * 0.03);
  EXPECT_NEAR(stddev(p.at("decoder.layers.3.mlp.linear_fc2.weight")), out_std, out_std * 0.03);
  for (const auto& [name, t] : p) {
    const auto v = t.to_vector<double>();
    if (name.ends_with(".bias")) {
      EXPECT_EQ(max_abs(v), 0.0) << name;
    } else if (name.find("layernorm") != std::string::npos) {
      for (double x : v) ASSERT_EQ(x, 1.0) << name;
    }
  }
  // Seeded: the same seed gives the same weights, another seed others.
  GptModel same(c, 42), other(c, 43);
  const auto w = p.at("decoder.layers.2.mlp.linear_fc1.weight").to_vector<float>();
  EXPECT_EQ(same.named_parameters().at("decoder.layers.2.mlp.linear_fc1.weight").to_vector<float>(), w);
  EXPECT_NE(other.named_parameters().at("decoder.layers.2.mlp.linear_fc1.weight").to_vector<float>(), w);
}

// Generation with the cache (a prompt, then one token at a time) gives the logits of one full forward.
TEST(GptModel, KvCacheForwardEqualsFullForward) {
  GptConfig no_positions = tiny_gpt2();  // --position-embedding-type none: causality alone orders the tokens
  no_positions.position_embedding_type = PositionEmbedding::None;
  for (const GptConfig& c : {tiny_gpt2(), tiny_llama(), no_positions}) {
    GptModel m(c, 3);
    m.eval();
    const std::int64_t b = 2, t = 9;
    Tensor tokens = ids(b, t, c.vocab_size, 1);
    const auto full = m.forward(tokens).to_vector<double>();

    KvCache cache = m.make_kv_cache(b, 12);
    std::vector<Tensor> pieces = {m.forward(tokens.narrow(1, 0, 5).contiguous(), cache)};
    for (std::int64_t i = 5; i < t; ++i) pieces.push_back(m.forward(tokens.narrow(1, i, 1).contiguous(), cache));
    EXPECT_EQ(cache.length(), t);
    const auto incremental = cat(pieces, 1).to_vector<double>();
    ASSERT_EQ(incremental.size(), full.size());
    double worst = 0;
    for (std::size_t i = 0; i < full.size(); ++i) worst = std::max(worst, std::abs(incremental[i] - full[i]));
    EXPECT_LE(worst, 1e-5 * max_abs(full)) << "position embedding " << to_string(c.position_embedding_type);

    // reset() starts over: the prompt's logits again.
    cache.reset();
    const auto again = m.forward(tokens.narrow(1, 0, 5).contiguous(), cache).to_vector<double>();
    EXPECT_EQ(again, pieces[0].to_vector<double>());
  }
}

TEST(GptModel, KvCacheRefusesOverflowAndMismatch) {
  GptModel m(tiny_gpt2(), 3);
  m.eval();
  KvCache cache = m.make_kv_cache(1, 4);
  m.forward(ids(1, 3, 50, 0), cache);
  EXPECT_THROW(m.forward(ids(1, 2, 50, 0), cache), Error);
  KvCache other_batch = m.make_kv_cache(2, 4);
  EXPECT_THROW(m.forward(ids(1, 2, 50, 0), other_batch), Error);
  EXPECT_THROW(m.make_kv_cache(1, 17), Error);  // beyond --max-position-embeddings 16
}

// The loss and every gradient of one training step (dropout on), as raw floats.
std::pair<std::vector<float>, std::vector<std::vector<float>>> training_step(const GptConfig& c) {
  GptModel m(c, 11);
  m.train();
  Tensor tokens = ids(2, c.seq_length, c.vocab_size, 2), labels = ids(2, c.seq_length, c.vocab_size, 5);
  Tensor loss = m.loss(tokens, labels, Tensor());
  loss.backward();
  std::vector<std::vector<float>> grads;
  for (const auto& [name, p] : m.named_parameters()) grads.push_back(p.grad().to_vector<float>());
  return {loss.to_vector<float>(), grads};
}

TEST(GptModel, RecomputeGivesBitIdenticalGradients) {
  for (GptConfig base : {tiny_gpt2(), tiny_llama()}) {
    base.num_layers = 3;
    base.attention_dropout = 0.2;  // dropout masks must be replayed by the recompute
    base.hidden_dropout = 0.2;
    const auto reference = training_step(base);

    struct Variant {
      const char* name;
      RecomputeGranularity granularity;
      RecomputeMethod method;
      std::int64_t layers;
    };
    for (const Variant& v : {Variant{"full uniform 2", RecomputeGranularity::Full, RecomputeMethod::Uniform, 2},
                             Variant{"full uniform 1", RecomputeGranularity::Full, RecomputeMethod::Uniform, 1},
                             Variant{"full block 2", RecomputeGranularity::Full, RecomputeMethod::Block, 2},
                             Variant{"selective", RecomputeGranularity::Selective, RecomputeMethod::Uniform, 1}}) {
      GptConfig c = base;
      c.recompute_granularity = v.granularity;
      c.recompute_method = v.method;
      c.recompute_num_layers = v.layers;
      const auto got = training_step(c);
      EXPECT_EQ(got.first, reference.first) << v.name;
      ASSERT_EQ(got.second.size(), reference.second.size());
      for (std::size_t i = 0; i < got.second.size(); ++i)
        EXPECT_EQ(got.second[i], reference.second[i]) << v.name << ", gradient " << i;
    }
  }
}

TEST(GptModel, DropoutOnlyInTraining) {
  GptModel m(tiny_gpt2(), 5);
  Tensor tokens = ids(1, 6, 50, 0);
  m.train();
  const auto a = m.forward(tokens).to_vector<float>(), b = m.forward(tokens).to_vector<float>();
  EXPECT_NE(a, b);  // fresh masks at each call
  m.eval();
  EXPECT_EQ(m.forward(tokens).to_vector<float>(), m.forward(tokens).to_vector<float>());
}

// sum(CE * mask) / sum(mask), checked against the logits in float64.
TEST(GptModel, LossIsTheMaskedMeanOfTokenCrossEntropies) {
  const GptConfig c = tiny_llama();
  GptModel m(c, 8);
  m.eval();
  const std::int64_t b = 2, t = 7;
  Tensor tokens = ids(b, t, c.vocab_size, 3), labels = ids(b, t, c.vocab_size, 4);
  std::vector<float> mask_values = {1, 0, 1, 1, 0, 1, 1, 0.5f, 1, 1, 0, 0, 1, 1};
  Tensor mask = Tensor::from_vector(mask_values, {b, t});
  const Tensor loss = m.loss(tokens, labels, mask);
  EXPECT_EQ(loss.dtype(), DType::F32);
  EXPECT_EQ(loss.dim(), 0);

  const auto logits = m.forward(tokens).to_vector<double>();
  const auto label = labels.to_vector<std::int64_t>();
  const std::int64_t v = c.padded_vocab_size();
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < b * t; ++i) {
    const double* row = logits.data() + i * v;
    double mx = row[0], z = 0;
    for (std::int64_t j = 0; j < v; ++j) mx = std::max(mx, row[j]);
    for (std::int64_t j = 0; j < v; ++j) z += std::exp(row[j] - mx);
    const double ce = std::log(z) + mx - row[label[static_cast<std::size_t>(i)]];
    num += ce * mask_values[static_cast<std::size_t>(i)];
    den += mask_values[static_cast<std::size_t>(i)];
  }
  EXPECT_NEAR(loss.item(), num / den, 1e-5 * num / den);
  // No mask: every token counts.
  const double all = m.loss(tokens, labels, Tensor()).item();
  const double with_ones = m.loss(tokens, labels, Tensor::ones({b, t})).item();
  EXPECT_NEAR(all, with_ones, 1e-6 * all);  // a mean, or a sum over a sum of ones
}

TEST(GptModel, Bf16ParametersF32Loss) {
  const GptConfig c = tiny_llama();
  GptModel f32(c, 9), bf16(c, 9);
  f32.eval();
  bf16.eval();
  bf16.to(DType::BF16);
  for (const auto& [name, p] : bf16.named_parameters()) EXPECT_EQ(p.dtype(), DType::BF16) << name;
  Tensor tokens = ids(2, 8, c.vocab_size, 1), labels = ids(2, 8, c.vocab_size, 2);
  EXPECT_EQ(bf16.forward(tokens).dtype(), DType::BF16);
  Tensor loss = bf16.loss(tokens, labels, Tensor());
  EXPECT_EQ(loss.dtype(), DType::F32);
  const double reference = f32.loss(tokens, labels, Tensor()).item();
  EXPECT_NEAR(loss.item(), reference, 2e-2 * reference);
  loss.backward();
  for (const auto& [name, p] : bf16.named_parameters()) {
    ASSERT_TRUE(p.grad().defined()) << name;
    EXPECT_EQ(p.grad().dtype(), DType::BF16) << name;
  }
}

TEST(GptModel, RefusesBadTokens) {
  GptModel m(tiny_gpt2(), 1);
  EXPECT_THROW(m.forward(Tensor::zeros({2, 4})), Error);  // f32, not int64
  EXPECT_THROW(m.forward(ids(1, 17, 50, 0)), Error);      // beyond 16 positions
  GptConfig bad = tiny_gpt2();
  bad.num_query_groups = 3;
  EXPECT_THROW(GptModel(bad, 1), Error);
}

}  // namespace gpt_model_test
}  // namespace kiln::models
