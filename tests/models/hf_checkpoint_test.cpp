// Hugging Face interop: the Megatron <-> HF name and layout mapping, checked three ways:
//  - against a small HF directory that tests/parity/make_hf_fixture.py writes with Debian's torch
//    (no transformers here), whose logits it computes from the HF tensors with HF's math: Kiln's
//    import must give the same logits (f32, rel. err <= 1e-5), and Kiln's export of the imported
//    model must give back the very same tensors, bit for bit;
//  - round trips from a Kiln model (GQA, biases, untied) through HF layout and back;
//  - unsupported architectures, fields and tensors refused by name.
#include "kiln/models/hf_checkpoint.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "kiln/data/tokenizer_factory.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/gpt_model.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace hf_checkpoint_test {

namespace fs = std::filesystem;

constexpr const char* kPython = "/usr/bin/python3";

std::string python_skip_reason() {
  if (!fs::exists(kPython)) return "python3 not found at /usr/bin/python3";
  if (std::system(fmt::format("{} -c 'import torch' >/dev/null 2>&1", kPython).c_str()) != 0) {
    return "python3 cannot import torch";
  }
  return {};
}

fs::path scratch(const std::string& name) {
  const fs::path dir = fs::path(KILN_BINARY_DIR) / "hf_checkpoint_test" / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

// Writes the fixture with the Python script; returns an empty path (and the reason) on failure.
fs::path make_fixture(const std::string& arch) {
  const fs::path dir = scratch("fixture_" + arch);
  const fs::path script = fs::path(KILN_SOURCE_DIR) / "tests/parity/make_hf_fixture.py";
  const std::string cmd =
      fmt::format("{} {} {} {} > {}.log 2>&1", kPython, script.string(), dir.string(), arch, dir.string());
  if (std::system(cmd.c_str()) != 0) {
    std::ifstream log(dir.string() + ".log");
    ADD_FAILURE() << "make_hf_fixture.py failed:\n" << std::string(std::istreambuf_iterator<char>(log), {});
    return {};
  }
  return dir;
}

double relative_error(const Tensor& ours, const Tensor& theirs) {
  const auto a = ours.to_vector<double>(), b = theirs.to_vector<double>();
  double diff2 = 0, ref2 = 0;
  for (std::size_t i = 0; i < a.size(); ++i) {
    diff2 += (a[i] - b[i]) * (a[i] - b[i]);
    ref2 += b[i] * b[i];
  }
  return std::sqrt(diff2 / ref2);
}

bool same_values(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector<double>() == b.to_vector<double>();
}

class HfFixture : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    if (const auto reason = python_skip_reason(); !reason.empty()) GTEST_SKIP() << reason;
    dir_ = make_fixture(GetParam());
    ASSERT_FALSE(dir_.empty());
  }
  fs::path dir_;
};

TEST_P(HfFixture, ImportGivesTheLogitsOfHuggingFacesMath) {
  const HfDirectory imported = read_hf_directory(dir_);
  EXPECT_EQ(imported.config.vocab_size, 300);
  EXPECT_EQ(imported.tokenizer.type, "GPT2BPETokenizer");
  GptModel model(imported.config, 0);
  model.load_state_dict(imported.megatron);
  model.eval();
  const auto reference = io::load_safetensors((dir_ / "reference.safetensors").string()).tensors;
  const Tensor& tokens = reference.at("tokens");
  NoGradGuard no_grad;
  const Tensor logits = model.forward(tokens);
  ASSERT_EQ(logits.size(2), imported.config.padded_vocab_size());
  const Tensor ours = logits.narrow(2, 0, imported.config.vocab_size).contiguous();
  EXPECT_LE(relative_error(ours, reference.at("logits")), 1e-5);
}

TEST_P(HfFixture, ExportWritesBackTheSameTensorsAndConfig) {
  const HfDirectory imported = read_hf_directory(dir_);
  const fs::path out = scratch("export_" + GetParam());
  write_hf_directory(out, imported.config, imported.megatron, imported.tokenizer);
  const auto original = io::load_safetensors((dir_ / "model.safetensors").string());
  const auto exported = io::load_safetensors((out / "model.safetensors").string());
  EXPECT_EQ(exported.metadata.at("format"), "pt");  // transformers refuses safetensors without it
  ASSERT_EQ(exported.tensors.size(), original.tensors.size());
  for (const auto& [name, t] : original.tensors) {
    const Tensor* mine = exported.tensors.find(name);
    ASSERT_NE(mine, nullptr) << "the export lacks " << name;
    EXPECT_TRUE(same_values(*mine, t)) << name << " differs after import + export";
  }
  // The exported config reads back to the same model.
  const GptConfig again = gpt_config_from_hf(data::read_text_file(out / "config.json"), "exported config.json");
  const GptConfig& c = imported.config;
  EXPECT_EQ(again.num_layers, c.num_layers);
  EXPECT_EQ(again.hidden_size, c.hidden_size);
  EXPECT_EQ(again.ffn_hidden(), c.ffn_hidden());
  EXPECT_EQ(again.query_groups(), c.query_groups());
  EXPECT_EQ(again.head_dim(), c.head_dim());
  EXPECT_EQ(again.max_positions(), c.max_positions());
  EXPECT_EQ(again.vocab_size, c.vocab_size);
  EXPECT_EQ(again.rotary_base, c.rotary_base);
  EXPECT_EQ(again.rope_llama3_scaling, c.rope_llama3_scaling);
  EXPECT_EQ(again.rope_scaling_factor, c.rope_scaling_factor);
  EXPECT_EQ(again.untie_embeddings_and_output_weights, c.untie_embeddings_and_output_weights);
  EXPECT_EQ(again.norm_epsilon, c.norm_epsilon);
  for (const char* file : {"vocab.json", "merges.txt", "tokenizer.json", "tokenizer_config.json"}) {
    EXPECT_TRUE(fs::exists(out / file)) << file;
  }
  // tokenizer.json (what transformers' AutoTokenizer loads for any model type) gives GPT-2's ids.
  const auto files_tok = data::make_tokenizer(imported.tokenizer);
  const auto json_tok = data::make_tokenizer({"HuggingFaceTokenizer", out / "tokenizer.json", {}, {}});
  EXPECT_EQ(json_tok->encode("ROMEO: the thing, 日本"), files_tok->encode("ROMEO: the thing, 日本"));
  EXPECT_EQ(json_tok->eod(), files_tok->eod());
  const auto config = nlohmann::json::parse(data::read_text_file(out / "config.json"));
  EXPECT_EQ(config["eos_token_id"], 259);  // the fixture tokenizer's <|endoftext|>
  // Exporting again replaces the earlier export; nothing is left beside it.
  write_hf_directory(out, imported.config, imported.megatron, imported.tokenizer);
  for (const auto& e : fs::directory_iterator(out.parent_path())) {
    const std::string name = e.path().filename().string();
    EXPECT_FALSE(name.starts_with(out.filename().string() + ".")) << "left behind: " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(Architectures, HfFixture, ::testing::Values("llama", "gpt2", "mixtral", "deepseek_v3"));

// DeepSeek's published checkpoints store the RoPE channels interleaved (transformers'
// rope_interleave, default true): the fixture's weights rewritten that way (row perm[j] of the RoPE
// block holds what Kiln's row j holds, perm = 0, 2, 4, ..., 1, 3, 5, ...) with rope_interleave true
// must import to the same model, hence the same logits.
TEST(HfCheckpoint, DeepseekInterleavedRopeImportsToTheSameLogits) {
  if (const auto reason = python_skip_reason(); !reason.empty()) GTEST_SKIP() << reason;
  const fs::path dir = make_fixture("deepseek_v3");
  ASSERT_FALSE(dir.empty());
  auto config = nlohmann::json::parse(data::read_text_file(dir / "config.json"));
  const std::int64_t pe = config["qk_rope_head_dim"], qk = config["qk_nope_head_dim"], kvr = config["kv_lora_rank"];
  auto interleave = [&](const Tensor& w, std::int64_t block, std::int64_t offset) {
    Tensor out = w.clone();
    for (std::int64_t b0 = 0; b0 < w.size(0); b0 += block)
      for (std::int64_t j = 0; j < pe; ++j) {
        const std::int64_t to = j < pe / 2 ? 2 * j : 2 * (j - pe / 2) + 1;
        out.select(0, b0 + offset + to).copy_(w.select(0, b0 + offset + j));
      }
    return out;
  };
  auto loaded = io::load_safetensors((dir / "model.safetensors").string());
  TensorDict rewritten;
  for (const auto& [name, t] : loaded.tensors) {
    if (name.ends_with("self_attn.q_b_proj.weight")) {
      rewritten.insert(name, interleave(t, qk + pe, qk));
    } else if (name.ends_with("self_attn.kv_a_proj_with_mqa.weight")) {
      rewritten.insert(name, interleave(t, kvr + pe, kvr));
    } else {
      rewritten.insert(name, t);
    }
  }
  io::save_safetensors((dir / "model.safetensors").string(), rewritten, {{"format", "pt"}});
  config.erase("rope_interleave");  // transformers' default: true
  std::ofstream(dir / "config.json") << config.dump(2);
  const HfDirectory imported = read_hf_directory(dir);
  GptModel model(imported.config, 0);
  model.load_state_dict(imported.megatron);
  model.eval();
  const auto reference = io::load_safetensors((dir / "reference.safetensors").string()).tensors;
  NoGradGuard no_grad;
  const Tensor logits = model.forward(reference.at("tokens"));
  const Tensor ours = logits.narrow(2, 0, imported.config.vocab_size).contiguous();
  EXPECT_LE(relative_error(ours, reference.at("logits")), 1e-5);
}

// ---- round trips from Kiln models (no Python needed)

void expect_refused(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "accepted; expected an error mentioning: " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

GptConfig tiny_llama(bool bias) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.ffn_hidden_size = 40;
  c.num_attention_heads = 4;
  c.num_query_groups = 2;
  c.kv_channels = 16;  // heads * kv != hidden: HF's head_dim
  c.seq_length = 16;
  c.vocab_size = 100;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.add_bias_linear = bias;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

GptConfig tiny_gpt2() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = 100;
  return c;
}

void expect_round_trip(const GptConfig& config) {
  GptModel model(config, 11);
  TensorDict megatron;
  for (const auto& [name, t] : model.state_dict()) {
    // Distinct values everywhere (the padded rows too: they must come back as zeros).
    megatron.insert(name, Tensor::randn(t.shape(), std::hash<std::string>{}(name)));
  }
  const TensorDict hf = megatron_to_hf(config, megatron);
  const TensorDict back = hf_to_megatron(config, hf);
  ASSERT_EQ(back.size(), megatron.size());
  for (const auto& [name, t] : megatron) {
    const Tensor* b = back.find(name);
    ASSERT_NE(b, nullptr) << name;
    Tensor want = t;
    if (name == "embedding.word_embeddings.weight" || name == "output_layer.weight") {
      want = t.clone();
      want.narrow(0, config.vocab_size, config.padded_vocab_size() - config.vocab_size).zero_();
    }
    EXPECT_TRUE(same_values(*b, want)) << name;
  }
}

GptConfig tiny_mixtral() {
  GptConfig c = tiny_llama(false);
  c.num_experts = 4;
  c.moe_router_topk = 2;
  c.moe_ffn_hidden_size = 24;
  return c;
}

// MLA, the first layer dense, then sigmoid-routed MoE with expert bias, groups and a shared expert.
GptConfig tiny_deepseek(bool q_lora) {
  GptConfig c = tiny_llama(false);
  c.num_layers = 3;
  c.num_query_groups = 0;
  c.kv_channels = 0;
  c.norm_epsilon = 1e-6;
  c.multi_latent_attention = true;
  c.q_lora_rank = q_lora ? 12 : 0;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.num_experts = 8;
  c.moe_router_topk = 4;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_score_function = MoeRouterScore::Sigmoid;
  c.moe_router_enable_expert_bias = true;
  c.moe_router_num_groups = 4;
  c.moe_router_group_topk = 2;
  c.moe_router_topk_scaling_factor = 2.5;
  c.moe_shared_expert_intermediate_size = 32;
  c.moe_layer_pattern = {0, 1, 1};
  return c;
}

TEST(HfCheckpoint, LlamaRoundTripWithGqaBiasesAndUntiedOutput) { expect_round_trip(tiny_llama(true)); }
TEST(HfCheckpoint, MixtralRoundTrip) { expect_round_trip(tiny_mixtral()); }
TEST(HfCheckpoint, DeepseekV3RoundTripWithQueryCompression) { expect_round_trip(tiny_deepseek(true)); }
TEST(HfCheckpoint, DeepseekV3RoundTripWithoutQueryCompression) { expect_round_trip(tiny_deepseek(false)); }
TEST(HfCheckpoint, DenseMlaRoundTripsAsDeepseekV3) {
  GptConfig c = tiny_deepseek(true);
  c.num_experts = 0;
  c.moe_layer_pattern.clear();
  EXPECT_EQ(hf_architecture_for(c), HfArchitecture::DeepseekV3);
  expect_round_trip(c);
}

// The config.json a Kiln MoE / MLA model exports reads back to the same model.
TEST(HfCheckpoint, MoeConfigsReadBackToTheSameModel) {
  const GptConfig mixtral = tiny_mixtral();
  const auto mj = nlohmann::json::parse(hf_config_json(mixtral, 1, 2, DType::F32));
  EXPECT_EQ(mj["architectures"][0], "MixtralForCausalLM");
  EXPECT_EQ(mj["num_local_experts"], 4);
  EXPECT_EQ(mj["intermediate_size"], 24);
  const GptConfig m2 = gpt_config_from_hf(mj.dump(), "mixtral.json");
  EXPECT_EQ(m2.num_experts, 4);
  EXPECT_EQ(m2.moe_router_topk, 2);
  EXPECT_EQ(m2.moe_ffn_hidden(), 24);
  EXPECT_EQ(m2.query_groups(), 2);
  EXPECT_EQ(m2.moe_router_score_function, MoeRouterScore::Softmax);

  const GptConfig ds = tiny_deepseek(true);
  const auto dj = nlohmann::json::parse(hf_config_json(ds, 1, 2, DType::F32));
  EXPECT_EQ(dj["architectures"][0], "DeepseekV3ForCausalLM");
  EXPECT_EQ(dj["first_k_dense_replace"], 1);
  EXPECT_EQ(dj["n_shared_experts"], 2);
  EXPECT_EQ(dj["rope_interleave"], false);
  EXPECT_FALSE(dj.contains("head_dim"));
  const GptConfig d2 = gpt_config_from_hf(dj.dump(), "deepseek.json");
  EXPECT_TRUE(d2.multi_latent_attention);
  EXPECT_EQ(d2.q_lora_rank, 12);
  EXPECT_EQ(d2.kv_lora_rank, 10);
  EXPECT_EQ(d2.qk_head_dim, 8);
  EXPECT_EQ(d2.qk_pos_emb_head_dim, 4);
  EXPECT_EQ(d2.v_head_dim, 6);
  EXPECT_EQ(d2.num_experts, 8);
  EXPECT_EQ(d2.moe_router_topk, 4);
  EXPECT_EQ(d2.moe_ffn_hidden(), 16);
  EXPECT_EQ(d2.ffn_hidden(), 40);
  EXPECT_EQ(d2.moe_shared_expert_intermediate_size, 32);
  EXPECT_EQ(d2.moe_router_num_groups, 4);
  EXPECT_EQ(d2.moe_router_group_topk, 2);
  EXPECT_EQ(d2.moe_router_topk_scaling_factor, 2.5);
  EXPECT_TRUE(d2.moe_router_enable_expert_bias);
  for (std::int64_t i = 0; i < 3; ++i) EXPECT_EQ(d2.is_moe_layer(i), ds.is_moe_layer(i)) << i;
  EXPECT_FALSE(hf_rope_interleave(dj.dump()));
  nlohmann::json published = dj;
  published.erase("rope_interleave");
  EXPECT_TRUE(hf_rope_interleave(published.dump()));
  EXPECT_FALSE(hf_rope_interleave(mj.dump()));
}

TEST(HfCheckpoint, MoeModelsNeitherClassReproducesAreRefusedByName) {
  GptConfig mtp = tiny_deepseek(true);
  mtp.mtp_num_layers = 1;
  expect_refused([&] { hf_architecture_for(mtp); }, "--mtp-num-layers 1");
  GptConfig softmax_mla = tiny_deepseek(true);
  softmax_mla.moe_router_score_function = MoeRouterScore::Softmax;
  softmax_mla.moe_router_enable_expert_bias = false;
  expect_refused([&] { hf_architecture_for(softmax_mla); }, "--moe-router-score-function softmax");
  GptConfig groups = tiny_deepseek(true);
  groups.moe_router_group_topk = 4;
  expect_refused([&] { hf_architecture_for(groups); }, "--moe-router-topk / --moe-router-group-topk = 4 / 4");
  GptConfig no_shared = tiny_deepseek(true);
  no_shared.moe_shared_expert_intermediate_size = 0;
  expect_refused([&] { hf_architecture_for(no_shared); }, "--moe-shared-expert-intermediate-size (0)");
  GptConfig interleaved = tiny_deepseek(true);
  interleaved.moe_layer_pattern = {1, 0, 1};
  expect_refused([&] { hf_architecture_for(interleaved); }, "first_k_dense_replace");
  GptConfig eps = tiny_deepseek(true);
  eps.norm_epsilon = 1e-5;
  expect_refused([&] { hf_architecture_for(eps); }, "--norm-epsilon 1e-6");
  GptConfig sigmoid = tiny_mixtral();
  sigmoid.moe_router_score_function = MoeRouterScore::Sigmoid;
  expect_refused([&] { hf_architecture_for(sigmoid); }, "--moe-router-score-function sigmoid");
  GptConfig pre = tiny_mixtral();
  pre.moe_router_pre_softmax = true;
  expect_refused([&] { hf_architecture_for(pre); }, "--moe-router-pre-softmax");
  GptConfig shared = tiny_mixtral();
  shared.moe_shared_expert_intermediate_size = 24;
  expect_refused([&] { hf_architecture_for(shared); }, "no shared experts");
  GptConfig sparse = tiny_mixtral();
  sparse.moe_layer_freq = 2;
  expect_refused([&] { hf_architecture_for(sparse); }, "MoE MLPs in every layer");
  nlohmann::json yarn = nlohmann::json::parse(hf_config_json(tiny_deepseek(true), 1, 2, DType::F32));
  yarn["rope_scaling"] = {{"type", "yarn"}, {"factor", 40}};
  expect_refused([&] { gpt_config_from_hf(yarn.dump(), "d.json"); }, "rope_scaling");
  nlohmann::json window = nlohmann::json::parse(hf_config_json(tiny_mixtral(), 1, 2, DType::F32));
  window["sliding_window"] = 4096;
  expect_refused([&] { gpt_config_from_hf(window.dump(), "m.json"); }, "sliding_window 4096");
}
TEST(HfCheckpoint, LlamaRoundTripWithoutBiases) { expect_round_trip(tiny_llama(false)); }
TEST(HfCheckpoint, Gpt2RoundTrip) { expect_round_trip(tiny_gpt2()); }

TEST(HfCheckpoint, LlamaQkvSplitFollowsMegatronsGroups) {
  // One layer, 4 query heads in 2 groups, head_dim 16: Megatron's rows are
  // [q0 q1 k0 v0 | q2 q3 k1 v1] (16 rows each); HF's q_proj is [q0 q1 q2 q3], k_proj [k0 k1].
  GptConfig c = tiny_llama(false);
  c.num_layers = 1;
  GptModel model(c, 1);
  TensorDict megatron = model.state_dict();
  const std::int64_t rows = c.qkv_size();
  std::vector<float> ids(static_cast<std::size_t>(rows * c.hidden_size));
  for (std::size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<float>(i / static_cast<std::size_t>(c.hidden_size));
  megatron.set("decoder.layers.0.self_attention.linear_qkv.weight", Tensor::from_vector(ids, {rows, c.hidden_size}));
  const TensorDict hf = megatron_to_hf(c, megatron);
  auto first_column = [&](const std::string& name) {
    const Tensor t = hf.at(name).select(1, 0).contiguous();
    return t.to_vector<float>();
  };
  auto range = [](int from, int count) {
    std::vector<float> v;
    for (int i = 0; i < count; ++i) v.push_back(static_cast<float>(from + i));
    return v;
  };
  auto cat = [](std::vector<float> a, const std::vector<float>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  EXPECT_EQ(first_column("model.layers.0.self_attn.q_proj.weight"), cat(range(0, 32), range(64, 32)));
  EXPECT_EQ(first_column("model.layers.0.self_attn.k_proj.weight"), cat(range(32, 16), range(96, 16)));
  EXPECT_EQ(first_column("model.layers.0.self_attn.v_proj.weight"), cat(range(48, 16), range(112, 16)));
}

TEST(HfCheckpoint, ConfigJsonHasTransformersFields) {
  GptConfig c = tiny_llama(false);
  c.rope_llama3_scaling = true;
  c.rope_scaling_factor = 32;
  c.rotary_base = 500000;
  const auto llama = nlohmann::json::parse(hf_config_json(c, 1, 2, DType::BF16));
  EXPECT_EQ(llama["architectures"][0], "LlamaForCausalLM");
  EXPECT_EQ(llama["num_key_value_heads"], 2);
  EXPECT_EQ(llama["head_dim"], 16);
  EXPECT_EQ(llama["intermediate_size"], 40);
  EXPECT_EQ(llama["rope_theta"], 500000.0);
  EXPECT_EQ(llama["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(llama["rope_scaling"]["factor"], 32.0);
  EXPECT_EQ(llama["rope_scaling"]["original_max_position_embeddings"], 8192);
  EXPECT_EQ(llama["tie_word_embeddings"], false);
  EXPECT_EQ(llama["torch_dtype"], "bfloat16");
  EXPECT_EQ(llama["vocab_size"], 100);  // the tokenizer's, not the padded 128
  const auto gpt2 = nlohmann::json::parse(hf_config_json(tiny_gpt2(), 5, 5, DType::F32));
  EXPECT_EQ(gpt2["architectures"][0], "GPT2LMHeadModel");
  EXPECT_EQ(gpt2["activation_function"], "gelu_new");
  EXPECT_EQ(gpt2["n_positions"], 16);
  EXPECT_EQ(gpt2["n_inner"], 128);
  EXPECT_EQ(gpt2["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(gpt2["tie_word_embeddings"], true);
}

TEST(HfCheckpoint, UnsupportedConfigsAreRefusedByName) {
  nlohmann::json llama = nlohmann::json::parse(hf_config_json(tiny_llama(false), 1, 2, DType::F32));
  auto with = [&](const char* key, nlohmann::json value) {
    nlohmann::json j = llama;
    j[key] = std::move(value);
    return j.dump();
  };
  expect_refused([&] { gpt_config_from_hf(with("architectures", {"MistralForCausalLM"}), "c.json"); },
                 "architecture 'MistralForCausalLM' is not supported");
  expect_refused([&] { gpt_config_from_hf(with("hidden_act", "gelu"), "c.json"); }, "hidden_act 'gelu'");
  expect_refused(
      [&] {
        gpt_config_from_hf(with("rope_scaling", {{"rope_type", "linear"}, {"factor", 2.0}}), "c.json");
      },
      "rope_scaling type 'linear'");
  expect_refused(
      [&] {
        gpt_config_from_hf(with("rope_scaling", {{"rope_type", "llama3"}, {"factor", 8.0}, {"high_freq_factor", 2.0}}),
                           "c.json");
      },
      "rope_scaling.high_freq_factor");
  expect_refused([&] { gpt_config_from_hf(with("mlp_bias", true), "c.json"); }, "mlp_bias");
  expect_refused([&] { gpt_config_from_hf(with("num_hidden_layers", -1), "c.json"); }, "'num_hidden_layers'");
  expect_refused([&] { gpt_config_from_hf("{not json", "c.json"); }, "c.json: not valid JSON");
  nlohmann::json gpt2 = nlohmann::json::parse(hf_config_json(tiny_gpt2(), 5, 5, DType::F32));
  gpt2["activation_function"] = "relu";
  expect_refused([&] { gpt_config_from_hf(gpt2.dump(), "g.json"); }, "activation_function 'relu'");
  expect_refused([&] { gpt_config_from_hf(hf_config_json(tiny_gpt2(), 5, 5, DType::F32), "g.json", 17); },
                 "--seq-length 17 is more than the model's 16 positions");
}

TEST(HfCheckpoint, MissingAndUnknownTensorsAreRefusedByName) {
  const GptConfig c = tiny_gpt2();
  GptModel model(c, 3);
  TensorDict hf = megatron_to_hf(c, model.state_dict());
  TensorDict extra = hf;
  extra.insert("transformer.h.0.attn.rotary.weight", Tensor::zeros({2}));
  expect_refused([&] { hf_to_megatron(c, extra); }, "transformer.h.0.attn.rotary.weight");
  TensorDict missing;
  for (const auto& [name, t] : hf) {
    if (name != "transformer.h.1.mlp.c_fc.bias") missing.insert(name, t);
  }
  expect_refused([&] { hf_to_megatron(c, missing); }, "'transformer.h.1.mlp.c_fc.bias' is missing");
  // GPT-2 names without the "transformer." prefix (as published checkpoints have them) load too.
  TensorDict bare;
  for (const auto& [name, t] : hf) bare.insert(name.substr(std::string("transformer.").size()), t);
  EXPECT_NO_THROW(hf_to_megatron(c, bare));
  GptConfig layer_norm_rope = c;
  layer_norm_rope.position_embedding_type = PositionEmbedding::Rope;
  expect_refused([&] { megatron_to_hf(layer_norm_rope, model.state_dict()); }, "fits neither LlamaForCausalLM");
}

TEST(HfCheckpoint, AnUnsupportedDirectoryIsRefusedBeforeReadingWeights) {
  const fs::path dir = scratch("mistral");
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << R"({"architectures": ["MistralForCausalLM"], "model_type": "mistral"})";
  expect_refused([&] { read_hf_directory(dir); }, "architecture 'MistralForCausalLM' is not supported");
  expect_refused([&] { read_hf_directory(dir / "nothing"); }, "is not a directory");
}

}  // namespace hf_checkpoint_test
}  // namespace kiln::models
