// Hugging Face interop of the mixture-of-experts and multi-latent-attention models
// (models/hf_checkpoint.h): MixtralForCausalLM and DeepseekV3ForCausalLM, after transformers'
// modeling_mixtral.py and modeling_deepseek_v3.py.
//   Mixtral: Llama's attention; every layer's MLP a softmax top-k router (block_sparse_moe.gate:
//     softmax over all experts, top-k, renormalised over the k, which is Kiln's softmax router
//     without --moe-router-pre-softmax) and SwiGLU experts w1 (gate), w3 (up), w2 (down).
//   DeepSeek-V3: MLA (q_a_proj -> q_a_layernorm -> q_b_proj, or q_proj; kv_a_proj_with_mqa's
//     first kv_lora_rank rows the latent, the rest the shared RoPE key; kv_b_proj per head the
//     no-RoPE key then the value), dense MLPs in the first first_k_dense_replace layers, then MoE:
//     sigmoid scores, top-k of scores + e_score_correction_bias (Kiln's expert bias), groups
//     scored by their top two, weights renormalised (norm_topk_prob) and scaled
//     (routed_scaling_factor), plus shared experts of n_shared_experts x moe_intermediate_size.
// Kiln's Megatron-style tensors: the router's [E, H] weight, the experts' weight1 [E, 2F, H] (gate
// rows, then up rows) and weight2 [E, H, F], the shared experts as a dense MLP.
#include <cmath>

#include "kiln/models/hf_checkpoint_detail.h"

namespace kiln::models::hf_detail {

namespace {

constexpr std::string_view kWhat = "export-hf (the Kiln checkpoint)";
// transformers builds q_a_layernorm and kv_a_layernorm with DeepseekV3RMSNorm's default epsilon,
// not rms_norm_eps; Kiln's MLA norms use --norm-epsilon, so the two agree only at this value.
constexpr double kMlaNormEpsilon = 1e-6;

// The first MoE layer when all layers before it are dense and all from it MoE (DeepSeek-V3's
// first_k_dense_replace; num_layers without MoE); -1 when the model's MoE layers are placed otherwise.
std::int64_t first_moe_layer(const GptConfig& c) {
  std::int64_t first = c.num_layers;
  for (std::int64_t i = 0; i < c.num_layers; ++i) {
    if (c.is_moe_layer(i)) {
      first = i;
      break;
    }
  }
  for (std::int64_t i = first; i < c.num_layers; ++i)
    if (!c.is_moe_layer(i)) return -1;
  return first;
}

// Row j of Kiln's RoPE channels is row rope_source(j) of a checkpoint stored with rope_interleave:
// transformers de-interleaves the projection's output (channels 0, 2, 4, ... then 1, 3, 5, ...)
// before its rotate-half RoPE, which is Kiln's.
std::int64_t rope_source(std::int64_t j, std::int64_t pe) { return j < pe / 2 ? 2 * j : 2 * (j - pe / 2) + 1; }

// Gathers, within each block of `block` rows, rows offset .. offset + pe through rope_source.
Tensor deinterleave_rope_rows(const Tensor& w, std::int64_t block, std::int64_t offset, std::int64_t pe) {
  Tensor out = w.clone();
  for (std::int64_t b0 = 0; b0 < w.size(0); b0 += block)
    for (std::int64_t j = 0; j < pe; ++j)
      out.select(0, b0 + offset + j).copy_(w.select(0, b0 + offset + rope_source(j, pe)));
  return out;
}

}  // namespace

HfArchitecture moe_architecture_for(const GptConfig& c) {
  KILN_CHECK(c.mtp_num_layers == 0,
             "export-hf: transformers' DeepseekV3ForCausalLM does not load multi-token prediction modules, but the "
             "model has --mtp-num-layers {}",
             c.mtp_num_layers);
  const bool rope = c.position_embedding_type == PositionEmbedding::Rope;
  const bool rms = c.normalization == Normalization::RMSNorm;
  KILN_CHECK(rope && rms && c.swiglu && !c.add_bias_linear,
             "export-hf: MixtralForCausalLM and DeepseekV3ForCausalLM need --position-embedding-type rope, "
             "--normalization RMSNorm, --swiglu and --disable-bias-linear; the model has position embedding {}, {}, "
             "swiglu {}, biases {}",
             rope ? "rope" : "not rope", rms ? "RMSNorm" : "LayerNorm", c.swiglu ? "on" : "off",
             c.add_bias_linear ? "on" : "off");
  const bool moe = c.num_experts > 0;
  const bool sigmoid = c.moe_router_score_function == MoeRouterScore::Sigmoid;
  if (c.multi_latent_attention) {
    KILN_CHECK(c.norm_epsilon == kMlaNormEpsilon,
               "export-hf: DeepseekV3ForCausalLM's q_a_layernorm and kv_a_layernorm use epsilon 1e-6 whatever "
               "rms_norm_eps is, Kiln's MLA norms --norm-epsilon ({}); the export needs --norm-epsilon 1e-6",
               c.norm_epsilon);
    if (!moe) return HfArchitecture::DeepseekV3;
    KILN_CHECK(sigmoid,
               "export-hf: DeepseekV3ForCausalLM routes with sigmoid scores, but the model has "
               "--moe-router-score-function softmax");
    KILN_CHECK(c.moe_router_num_groups == 0 || c.moe_router_topk / c.moe_router_group_topk == 2,
               "export-hf: DeepseekV3ForCausalLM scores an expert group by its top 2 experts, Kiln by its top "
               "--moe-router-topk / --moe-router-group-topk = {} / {}; they agree only when that is 2",
               c.moe_router_topk, c.moe_router_group_topk);
    const std::int64_t f = c.moe_ffn_hidden(), shared = c.moe_shared_expert_intermediate_size;
    KILN_CHECK(shared > 0 && shared % f == 0,
               "export-hf: DeepseekV3ForCausalLM's MoE layers always have shared experts of n_shared_experts x "
               "moe_intermediate_size; --moe-shared-expert-intermediate-size ({}) must be a positive multiple of "
               "--moe-ffn-hidden-size ({})",
               shared, f);
    KILN_CHECK(first_moe_layer(c) >= 0,
               "export-hf: DeepseekV3ForCausalLM has dense MLPs in its first first_k_dense_replace layers and MoE in "
               "all the others; the model's --moe-layer-freq places its MoE layers otherwise");
    return HfArchitecture::DeepseekV3;
  }
  KILN_CHECK(!sigmoid,
             "export-hf: MixtralForCausalLM routes with softmax; --moe-router-score-function sigmoid exports as "
             "DeepseekV3ForCausalLM, which needs --multi-latent-attention");
  KILN_CHECK(!c.moe_router_pre_softmax,
             "export-hf: MixtralForCausalLM renormalises the top-k softmax probabilities; --moe-router-pre-softmax "
             "does not");
  KILN_CHECK(c.moe_router_num_groups == 0,
             "export-hf: MixtralForCausalLM has no group-limited routing (--moe-router-num-groups {})",
             c.moe_router_num_groups);
  KILN_CHECK(c.moe_router_topk_scaling_factor == 0 || c.moe_router_topk_scaling_factor == 1,
             "export-hf: MixtralForCausalLM does not scale its routing weights (--moe-router-topk-scaling-factor {})",
             c.moe_router_topk_scaling_factor);
  KILN_CHECK(c.moe_shared_expert_intermediate_size == 0,
             "export-hf: MixtralForCausalLM has no shared experts (--moe-shared-expert-intermediate-size {})",
             c.moe_shared_expert_intermediate_size);
  KILN_CHECK(first_moe_layer(c) == 0,
             "export-hf: MixtralForCausalLM has MoE MLPs in every layer; the model's --moe-layer-freq leaves some "
             "dense");
  return HfArchitecture::Mixtral;
}

void moe_config_to_hf(const GptConfig& c, HfArchitecture arch, json& j) {
  const bool moe = c.num_experts > 0;
  if (arch == HfArchitecture::Mixtral) {
    j["model_type"] = "mixtral";
    j["intermediate_size"] = c.moe_ffn_hidden();
    j["num_local_experts"] = c.num_experts;
    j["num_experts_per_tok"] = c.moe_router_topk;
    j["router_aux_loss_coef"] = c.moe_aux_loss_coeff;
    j["output_router_logits"] = false;
    j["router_jitter_noise"] = 0.0;
    j["sliding_window"] = nullptr;
    j.erase("mlp_bias");
    j.erase("pretraining_tp");
    return;
  }
  j["model_type"] = "deepseek_v3";
  j.erase("head_dim");  // transformers sets it to qk_rope_head_dim
  j.erase("mlp_bias");
  j.erase("pretraining_tp");
  j["num_key_value_heads"] = c.num_attention_heads;
  j["q_lora_rank"] = c.q_lora_rank > 0 ? json(c.q_lora_rank) : json(nullptr);
  j["kv_lora_rank"] = c.kv_lora_rank;
  j["qk_nope_head_dim"] = c.qk_head_dim;
  j["qk_rope_head_dim"] = c.qk_pos_emb_head_dim;
  j["v_head_dim"] = c.v_head_dim;
  j["rope_interleave"] = false;  // Kiln's RoPE rotates halves; its weights are written for that
  j["first_k_dense_replace"] = first_moe_layer(c);
  j["moe_layer_freq"] = 1;
  j["n_routed_experts"] = moe ? c.num_experts : 1;
  j["num_experts_per_tok"] = moe ? c.moe_router_topk : 1;
  j["moe_intermediate_size"] = moe ? c.moe_ffn_hidden() : c.ffn_hidden();
  j["n_shared_experts"] = moe ? c.moe_shared_expert_intermediate_size / c.moe_ffn_hidden() : 1;
  const bool groups = moe && c.moe_router_num_groups > 0;
  j["n_group"] = groups ? c.moe_router_num_groups : 1;
  j["topk_group"] = groups ? c.moe_router_group_topk : 1;
  j["norm_topk_prob"] = !moe || c.moe_router_topk > 1;  // Kiln's sigmoid router renormalises when k > 1
  j["routed_scaling_factor"] = c.moe_router_topk_scaling_factor > 0 ? c.moe_router_topk_scaling_factor : 1.0;
  j["scoring_func"] = "sigmoid";
  j["topk_method"] = "noaux_tc";
  j["aux_loss_alpha"] = c.moe_aux_loss_coeff;
  j["seq_aux"] = c.moe_router_load_balancing_type == MoeLoadBalancing::SeqAuxLoss;
}

GptConfig mixtral_from_hf(const ConfigReader& r) {
  GptConfig c = llama_from_hf(r);
  c.num_experts = r.integer("num_local_experts");
  c.moe_router_topk = r.integer("num_experts_per_tok");
  c.moe_ffn_hidden_size = c.ffn_hidden_size;
  c.moe_router_score_function = MoeRouterScore::Softmax;
  c.moe_aux_loss_coeff = r.number("router_aux_loss_coef", 0.001);
  c.moe_router_load_balancing_type = MoeLoadBalancing::AuxLoss;
  KILN_CHECK(r.number("router_jitter_noise", 0) == 0,
             "{}: router_jitter_noise {} is not supported (Kiln's router adds no noise)", r.where,
             r.number("router_jitter_noise", 0));
  KILN_CHECK(!r.has("sliding_window"), "{}: sliding_window {} is not supported (Kiln's attention is full causal)",
             r.where, r.j["sliding_window"].dump());
  return c;
}

GptConfig deepseek_v3_from_hf(const ConfigReader& r) {
  KILN_CHECK(!r.has("rope_scaling"), "{}: rope_scaling {} is not supported (Kiln's MLA has no YaRN scaling)", r.where,
             r.j["rope_scaling"].dump());
  GptConfig c = llama_from_hf(r);
  c.num_query_groups = 0;  // MLA's keys and values are per head
  c.kv_channels = 0;
  KILN_CHECK(c.norm_epsilon == kMlaNormEpsilon,
             "{}: rms_norm_eps {} is not supported: transformers' q_a_layernorm / kv_a_layernorm use 1e-6 and Kiln "
             "one epsilon for all norms",
             r.where, c.norm_epsilon);
  KILN_CHECK(!c.add_bias_linear, "{}: attention_bias true is not supported", r.where);
  c.multi_latent_attention = true;
  c.q_lora_rank = r.has("q_lora_rank") ? r.integer("q_lora_rank") : 0;
  c.kv_lora_rank = r.integer("kv_lora_rank");
  c.qk_head_dim = r.integer("qk_nope_head_dim");
  c.qk_pos_emb_head_dim = r.integer("qk_rope_head_dim");
  c.v_head_dim = r.integer("v_head_dim");
  const std::int64_t dense = r.has("first_k_dense_replace") ? r.j["first_k_dense_replace"].get<std::int64_t>() : 0;
  KILN_CHECK(dense >= 0, "{}: first_k_dense_replace must be >= 0, got {}", r.where, dense);
  if (!r.has("n_routed_experts") || dense >= c.num_layers) return c;  // dense MLPs only
  KILN_CHECK(!r.has("moe_layer_freq") || r.integer("moe_layer_freq") == 1,
             "{}: moe_layer_freq {} is not supported (transformers' DeepseekV3 makes every layer from "
             "first_k_dense_replace MoE)",
             r.where, r.j.value("moe_layer_freq", json()).dump());
  const std::string scoring = r.text("scoring_func", "sigmoid"), method = r.text("topk_method", "noaux_tc");
  KILN_CHECK(scoring == "sigmoid", "{}: scoring_func '{}' is not supported (DeepSeek-V3 routes with sigmoid)", r.where,
             scoring);
  KILN_CHECK(method == "noaux_tc", "{}: topk_method '{}' is not supported (DeepSeek-V3's is noaux_tc)", r.where,
             method);
  c.num_experts = r.integer("n_routed_experts");
  c.moe_router_topk = r.integer("num_experts_per_tok");
  c.moe_ffn_hidden_size = r.integer("moe_intermediate_size");
  c.moe_router_score_function = MoeRouterScore::Sigmoid;
  c.moe_router_enable_expert_bias = true;  // e_score_correction_bias
  if (dense > 0) {
    c.moe_layer_pattern.assign(static_cast<std::size_t>(c.num_layers), 1);
    std::fill_n(c.moe_layer_pattern.begin(), dense, 0);
  }
  const std::int64_t groups = r.has("n_group") ? r.integer("n_group") : 1;
  const std::int64_t group_topk = r.has("topk_group") ? r.integer("topk_group") : groups;
  if (groups > 1 && group_topk < groups) {
    KILN_CHECK(c.moe_router_topk == 2 * group_topk,
               "{}: num_experts_per_tok {} with topk_group {} is not supported: transformers scores a group by its "
               "top 2 experts, Kiln by its top num_experts_per_tok / topk_group",
               r.where, c.moe_router_topk, group_topk);
    c.moe_router_num_groups = groups;
    c.moe_router_group_topk = group_topk;
  }
  const bool norm_topk = r.flag("norm_topk_prob", true);
  KILN_CHECK(norm_topk == (c.moe_router_topk > 1),
             "{}: norm_topk_prob {} with num_experts_per_tok {} is not supported (Kiln's sigmoid router renormalises "
             "exactly when it picks more than one expert)",
             r.where, norm_topk, c.moe_router_topk);
  const double scale = r.number("routed_scaling_factor", 1.0);
  c.moe_router_topk_scaling_factor = scale == 1.0 ? 0.0 : scale;
  const std::int64_t shared = r.has("n_shared_experts") ? r.j["n_shared_experts"].get<std::int64_t>() : 0;
  KILN_CHECK(shared >= 0, "{}: n_shared_experts must be >= 0, got {}", r.where, shared);
  c.moe_shared_expert_intermediate_size = shared * c.moe_ffn_hidden_size;
  c.moe_aux_loss_coeff = r.number("aux_loss_alpha", 0);
  c.moe_router_load_balancing_type = c.moe_aux_loss_coeff == 0  ? MoeLoadBalancing::None
                                     : r.flag("seq_aux", false) ? MoeLoadBalancing::SeqAuxLoss
                                                                : MoeLoadBalancing::AuxLoss;
  return c;
}

void mla_to_hf(const GptConfig& c, const TensorDict& m, std::int64_t i, const std::string& p, TensorDict& hf) {
  const std::int64_t h = c.hidden_size, nh = c.num_attention_heads, pe = c.qk_pos_emb_head_dim;
  const std::int64_t q_width = nh * (c.qk_head_dim + pe), kvr = c.kv_lora_rank, qr = c.q_lora_rank;
  auto move = [&](const char* from, const std::string& to, const Shape& shape) {
    hf.insert(p + "self_attn." + to, compact(take(m, layer(i, std::string("self_attention.") + from), shape, kWhat)));
  };
  if (qr == 0) {
    move("linear_q_proj.weight", "q_proj.weight", {q_width, h});
  } else {
    move("linear_q_down_proj.weight", "q_a_proj.weight", {qr, h});
    move("q_layernorm.weight", "q_a_layernorm.weight", {qr});
    move("linear_q_up_proj.weight", "q_b_proj.weight", {q_width, qr});
  }
  move("linear_kv_down_proj.weight", "kv_a_proj_with_mqa.weight", {kvr + pe, h});
  move("kv_layernorm.weight", "kv_a_layernorm.weight", {kvr});
  move("linear_kv_up_proj.weight", "kv_b_proj.weight", {nh * (c.qk_head_dim + c.v_head_dim), kvr});
  move("linear_proj.weight", "o_proj.weight", {h, nh * c.v_head_dim});
}

void mla_from_hf(const GptConfig& c, HfTensors& hf, std::int64_t i, const std::string& p, bool rope_interleave,
                 TensorDict& m) {
  const std::int64_t h = c.hidden_size, nh = c.num_attention_heads, pe = c.qk_pos_emb_head_dim;
  const std::int64_t head = c.qk_head_dim + pe, kvr = c.kv_lora_rank, qr = c.q_lora_rank;
  auto move = [&](const std::string& from, const char* to, const Shape& shape) {
    m.insert(layer(i, std::string("self_attention.") + to), hf.take(p + "self_attn." + from, shape));
  };
  // The RoPE rows: the last pe of each head's query rows, the last pe of kv_a_proj_with_mqa.
  auto rope_rows = [&](Tensor w, std::int64_t block, std::int64_t offset) {
    return rope_interleave ? deinterleave_rope_rows(w, block, offset, pe) : w;
  };
  if (qr == 0) {
    m.insert(layer(i, "self_attention.linear_q_proj.weight"),
             rope_rows(hf.take(p + "self_attn.q_proj.weight", {nh * head, h}), head, c.qk_head_dim));
  } else {
    move("q_a_proj.weight", "linear_q_down_proj.weight", {qr, h});
    move("q_a_layernorm.weight", "q_layernorm.weight", {qr});
    m.insert(layer(i, "self_attention.linear_q_up_proj.weight"),
             rope_rows(hf.take(p + "self_attn.q_b_proj.weight", {nh * head, qr}), head, c.qk_head_dim));
  }
  m.insert(layer(i, "self_attention.linear_kv_down_proj.weight"),
           rope_rows(hf.take(p + "self_attn.kv_a_proj_with_mqa.weight", {kvr + pe, h}), kvr + pe, kvr));
  move("kv_a_layernorm.weight", "kv_layernorm.weight", {kvr});
  move("kv_b_proj.weight", "linear_kv_up_proj.weight", {nh * (c.qk_head_dim + c.v_head_dim), kvr});
  move("o_proj.weight", "linear_proj.weight", {h, nh * c.v_head_dim});
}

void moe_to_hf(const GptConfig& c, HfArchitecture arch, const TensorDict& m, std::int64_t i, const std::string& p,
               TensorDict& hf) {
  const std::int64_t e_count = c.num_experts, h = c.hidden_size, f = c.moe_ffn_hidden();
  const Tensor router = take(m, layer(i, "mlp.router.weight"), {e_count, h}, kWhat);
  const Tensor w1 = take(m, layer(i, "mlp.experts.weight1"), {e_count, 2 * f, h}, kWhat);
  const Tensor w2 = take(m, layer(i, "mlp.experts.weight2"), {e_count, h, f}, kWhat);
  const bool mixtral = arch == HfArchitecture::Mixtral;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  hf.insert(moe + "gate.weight", compact(router));
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::string x = fmt::format("{}experts.{}.", moe, e);
    const Tensor fc1 = w1.select(0, e);
    hf.insert(x + (mixtral ? "w1.weight" : "gate_proj.weight"), compact(fc1.narrow(0, 0, f)));
    hf.insert(x + (mixtral ? "w3.weight" : "up_proj.weight"), compact(fc1.narrow(0, f, f)));
    hf.insert(x + (mixtral ? "w2.weight" : "down_proj.weight"), compact(w2.select(0, e)));
  }
  if (mixtral) return;
  // transformers' router always has the correction bias; a model without --moe-router-enable-expert-bias
  // exports zeros, which choose as it does.
  const std::string bias = layer(i, "mlp.router.expert_bias");
  hf.insert(moe + "gate.e_score_correction_bias",
            m.contains(bias) ? compact(take(m, bias, {e_count}, kWhat)) : Tensor::zeros({e_count}, router.dtype()));
  const std::int64_t s = c.moe_shared_expert_intermediate_size;
  const Tensor fc1 = take(m, layer(i, "mlp.shared_experts.linear_fc1.weight"), {2 * s, h}, kWhat);
  hf.insert(moe + "shared_experts.gate_proj.weight", compact(fc1.narrow(0, 0, s)));
  hf.insert(moe + "shared_experts.up_proj.weight", compact(fc1.narrow(0, s, s)));
  hf.insert(moe + "shared_experts.down_proj.weight",
            compact(take(m, layer(i, "mlp.shared_experts.linear_fc2.weight"), {h, s}, kWhat)));
}

void moe_from_hf(const GptConfig& c, HfArchitecture arch, HfTensors& hf, std::int64_t i, const std::string& p,
                 TensorDict& m) {
  const std::int64_t e_count = c.num_experts, h = c.hidden_size, f = c.moe_ffn_hidden();
  const bool mixtral = arch == HfArchitecture::Mixtral;
  const std::string moe = p + (mixtral ? "block_sparse_moe." : "mlp.");
  m.insert(layer(i, "mlp.router.weight"), hf.take(moe + "gate.weight", {e_count, h}));
  Tensor w1 = Tensor::empty({e_count, 2 * f, h}), w2 = Tensor::empty({e_count, h, f});
  for (std::int64_t e = 0; e < e_count; ++e) {
    const std::string x = fmt::format("{}experts.{}.", moe, e);
    w1.select(0, e).narrow(0, 0, f).copy_(hf.take(x + (mixtral ? "w1.weight" : "gate_proj.weight"), {f, h}));
    w1.select(0, e).narrow(0, f, f).copy_(hf.take(x + (mixtral ? "w3.weight" : "up_proj.weight"), {f, h}));
    w2.select(0, e).copy_(hf.take(x + (mixtral ? "w2.weight" : "down_proj.weight"), {h, f}));
  }
  m.insert(layer(i, "mlp.experts.weight1"), w1);
  m.insert(layer(i, "mlp.experts.weight2"), w2);
  if (mixtral) return;
  const Tensor bias = hf.take(moe + "gate.e_score_correction_bias", {e_count});
  if (c.moe_router_enable_expert_bias) {
    m.insert(layer(i, "mlp.router.expert_bias"), bias);
  } else {
    const auto values = bias.to_vector<float>();
    KILN_CHECK(std::all_of(values.begin(), values.end(), [](float v) { return v == 0; }),
               "import-hf: {}gate.e_score_correction_bias is not zero, but the model has no expert bias "
               "(--moe-router-enable-expert-bias)",
               moe);
  }
  const std::int64_t s = c.moe_shared_expert_intermediate_size;
  if (s == 0) return;
  m.insert(layer(i, "mlp.shared_experts.linear_fc1.weight"),
           stack_rows(hf.take(moe + "shared_experts.gate_proj.weight", {s, h}),
                      hf.take(moe + "shared_experts.up_proj.weight", {s, h})));
  m.insert(layer(i, "mlp.shared_experts.linear_fc2.weight"), hf.take(moe + "shared_experts.down_proj.weight", {h, s}));
}

}  // namespace kiln::models::hf_detail
