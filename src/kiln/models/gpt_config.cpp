#include "kiln/models/gpt_config.h"

#include <fmt/format.h>

#include "kiln/models/gpt_config_mla_mtp.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

void check_positive(std::int64_t value, std::string_view flag) {
  KILN_CHECK(value > 0, "GPT config: {} must be positive, got {}", flag, value);
}

void check_probability(double p, std::string_view flag) {
  KILN_CHECK(p >= 0 && p < 1, "GPT config: {} must be in [0, 1), got {}", flag, p);
}

}  // namespace

void GptConfig::validate() const {
  check_positive(num_layers, "--num-layers");
  check_positive(hidden_size, "--hidden-size");
  check_positive(num_attention_heads, "--num-attention-heads");
  check_positive(seq_length, "--seq-length");
  KILN_CHECK(vocab_size > 0, "GPT config: the vocabulary size must be positive, got {} (it comes from the tokenizer)",
             vocab_size);
  check_positive(make_vocab_size_divisible_by, "--make-vocab-size-divisible-by");
  KILN_CHECK(ffn_hidden_size >= 0, "GPT config: --ffn-hidden-size must be positive, got {}", ffn_hidden_size);
  KILN_CHECK(num_query_groups >= 0, "GPT config: --num-query-groups must be positive, got {}", num_query_groups);
  KILN_CHECK(kv_channels >= 0, "GPT config: --kv-channels must be positive, got {}", kv_channels);
  KILN_CHECK(max_position_embeddings >= 0, "GPT config: --max-position-embeddings must be positive, got {}",
             max_position_embeddings);

  KILN_CHECK(kv_channels != 0 || multi_latent_attention || hidden_size % num_attention_heads == 0,
             "GPT config: --hidden-size ({}) is not divisible by --num-attention-heads ({}); change one of them or "
             "set the head size with --kv-channels",
             hidden_size, num_attention_heads);
  const std::int64_t groups = query_groups();
  KILN_CHECK(groups <= num_attention_heads && num_attention_heads % groups == 0,
             "GPT config: --num-attention-heads ({}) must be divisible by --num-query-groups ({})", num_attention_heads,
             groups);
  KILN_CHECK(seq_length <= max_positions(),
             "GPT config: --seq-length ({}) exceeds --max-position-embeddings ({}); raise "
             "--max-position-embeddings or shorten --seq-length",
             seq_length, max_positions());
  KILN_CHECK(ffn_hidden() > 0,
             "GPT config: --swiglu without --ffn-hidden-size gives Megatron's default int(4 * {} * 2 / 3 / 64) * 64 = "
             "0 for --hidden-size {}; set --ffn-hidden-size",
             hidden_size, hidden_size);

  if (position_embedding_type == PositionEmbedding::Rope) {
    KILN_CHECK(multi_latent_attention || head_dim() % 2 == 0,
               "GPT config: --position-embedding-type rope rotates pairs of channels: the head size ({}, "
               "--kv-channels or --hidden-size / --num-attention-heads) must be even",
               head_dim());
    KILN_CHECK(rotary_base > 0, "GPT config: --rotary-base must be positive, got {}", rotary_base);
    KILN_CHECK(!rope_llama3_scaling || rope_scaling_factor >= 1,
               "GPT config: --rope-scaling-factor must be at least 1, got {}", rope_scaling_factor);
  } else {
    KILN_CHECK(!rope_llama3_scaling, "GPT config: --use-rope-scaling needs --position-embedding-type rope (it is {})",
               to_string(position_embedding_type));
  }
  KILN_CHECK(norm_epsilon > 0, "GPT config: --norm-epsilon must be positive, got {}", norm_epsilon);
  check_probability(attention_dropout, "--attention-dropout");
  check_probability(hidden_dropout, "--hidden-dropout");
  KILN_CHECK(init_method_std > 0, "GPT config: --init-method-std must be positive, got {}", init_method_std);

  validate_mla_mtp(*this);  // MLA, MTP: gpt_config_mla_mtp.cpp

  if (recompute_granularity == RecomputeGranularity::Full) {
    KILN_CHECK(recompute_num_layers >= 1 && recompute_num_layers <= num_layers,
               "GPT config: --recompute-num-layers ({}) must be between 1 and --num-layers ({}) with "
               "--recompute-granularity full",
               recompute_num_layers, num_layers);
  }
  validate_moe_config(*this);               // MoE
  validate_fp8_config(*this);               // FP8
  validate_parallel_config(*this);          // TP, SP
  validate_context_parallel_config(*this);  // CP
}

std::int64_t GptConfig::ffn_hidden() const {
  if (ffn_hidden_size > 0) return ffn_hidden_size;
  if (swiglu) return (4 * hidden_size * 2 / 3) / 64 * 64;
  return 4 * hidden_size;
}

std::int64_t GptConfig::query_groups() const { return num_query_groups > 0 ? num_query_groups : num_attention_heads; }

std::int64_t GptConfig::head_dim() const {
  if (kv_channels > 0) return kv_channels;
  return num_attention_heads > 0 ? hidden_size / num_attention_heads : 0;
}

std::int64_t GptConfig::max_positions() const {
  return max_position_embeddings > 0 ? max_position_embeddings : seq_length;
}

std::int64_t GptConfig::padded_vocab_size() const {
  const std::int64_t multiple = make_vocab_size_divisible_by;  // x tensor-parallel size (1)
  return (vocab_size + multiple - 1) / multiple * multiple;
}

std::int64_t GptConfig::num_parameters() const {
  const std::int64_t h = hidden_size, v = padded_vocab_size(), f = ffn_hidden();
  const std::int64_t q = num_attention_heads * head_dim();
  const std::int64_t norm = normalization == Normalization::LayerNorm ? 2 * h : h;  // weight (+ bias)
  const std::int64_t bias = add_bias_linear ? 1 : 0;
  const std::int64_t fc1_rows = swiglu ? 2 * f : f;
  // MLA: its attention replaces linear_qkv and linear_proj (gpt_config_mla_mtp.h).
  const std::int64_t attention = multi_latent_attention ? mla_attention_parameters(*this)
                                                        : (h + bias) * qkv_size()  // linear_qkv
                                                              + (q + bias) * h;    // linear_proj
  const std::int64_t layer = norm + attention                                      // input norm, attention
                             + norm + (h + bias) * fc1_rows                        // pre-MLP norm, linear_fc1
                             + (f + bias) * h;                                     // linear_fc2
  std::int64_t total = v * h + num_layers * layer + norm;
  // MoE: a MoE layer's MLP is the router [E, H], E experts (no biases) and the shared expert.
  if (num_experts > 0) {
    const std::int64_t fm = moe_ffn_hidden(), fs = moe_shared_expert_intermediate_size;
    const std::int64_t dense_mlp = (h + bias) * fc1_rows + (f + bias) * h;
    const std::int64_t moe_mlp = num_experts * h + num_experts * (h * (swiglu ? 2 * fm : fm) + fm * h) +
                                 (fs > 0 ? (h + bias) * (swiglu ? 2 * fs : fs) + (fs + bias) * h : 0);
    total += num_moe_layers() * (moe_mlp - dense_mlp);
  }
  total += mtp_parameters(*this, layer);  // MTP: 0 without MTP layers
  if (position_embedding_type == PositionEmbedding::LearnedAbsolute) total += max_positions() * h;
  if (untie_embeddings_and_output_weights) total += v * h;
  return total;
}

// Megatron's num_floating_point_operations (megatron/training/training.py, transformer_flops(),
// dense layers, no MTP) divided by the tokens of a batch (batch_size * seq_length):
//
//   flops/token = 3 * 2 * [ L * ( H * F * (3 if swiglu else 2)          MLP GEMMs
//                               + H * (q + 2 * k)                        linear_qkv
//                               + q * S / 2 * 2                          QK^T and PV, causal half
//                               + q * H )                                linear_proj
//                         + H * Vpad ]                                   output layer
//
// with q = heads * kv_channels, k = query_groups * kv_channels, S = seq_length. 3: forward, wgrad and
// dgrad GEMMs; 2: multiply-add. Norms, softmax and elementwise work are not counted (as in Megatron).
// MLA replaces the attention terms by mla_attention_multiply_adds(); MTP adds, per depth, one layer,
// eh_proj (2H * H) and the output head (H * Vpad): mtp_multiply_adds() (gpt_config_mla_mtp.h).
double GptConfig::flops_per_token() const {
  const double h = static_cast<double>(hidden_size), f = static_cast<double>(ffn_hidden());
  const double q = static_cast<double>(num_attention_heads * head_dim());
  const double k = static_cast<double>(query_groups() * head_dim());
  const double s = static_cast<double>(seq_length), v = static_cast<double>(padded_vocab_size());
  const double mlp = h * f * (swiglu ? 3.0 : 2.0);
  const double attention =
      multi_latent_attention ? mla_attention_multiply_adds(*this) : h * (q + 2 * k) + q * s / 2 * 2 + q * h;
  // MoE: Megatron counts a MoE layer's MLP as moe_router_topk routed experts plus the shared
  // expert (the active parameters; the router's GEMM is not counted).
  const double moe_layers = static_cast<double>(num_moe_layers());
  const double moe_mlp = h *
                         (static_cast<double>(moe_ffn_hidden()) * static_cast<double>(moe_router_topk) +
                          static_cast<double>(moe_shared_expert_intermediate_size)) *
                         (swiglu ? 3.0 : 2.0);
  // MTP: its layers are counted as dense layers (mtp_multiply_adds).
  return 3.0 * 2.0 *
         ((static_cast<double>(num_layers) - moe_layers) * mlp + moe_layers * moe_mlp +
          static_cast<double>(num_layers) * attention + h * v + mtp_multiply_adds(*this, mlp + attention));
}

GptConfig GptConfig::gpt2_124m(std::int64_t vocab) {
  GptConfig c;
  c.num_layers = 12;
  c.hidden_size = 768;
  c.num_attention_heads = 12;
  c.seq_length = 1024;
  c.max_position_embeddings = 1024;
  c.vocab_size = vocab;
  return c;
}

GptConfig GptConfig::gpt2_350m(std::int64_t vocab) {
  GptConfig c = gpt2_124m(vocab);
  c.num_layers = 24;
  c.hidden_size = 1024;
  c.num_attention_heads = 16;
  return c;
}

namespace {

// What the Llama-3 family shares: RoPE base 500000, RMSNorm 1e-5, SwiGLU, GQA, no biases, no dropout.
GptConfig llama3_base(std::int64_t vocab) {
  GptConfig c;
  c.vocab_size = vocab;
  c.position_embedding_type = PositionEmbedding::Rope;
  c.rotary_base = 500000;
  c.normalization = Normalization::RMSNorm;
  c.norm_epsilon = 1e-5;
  c.swiglu = true;
  c.add_bias_linear = false;
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  c.num_attention_heads = 32;
  c.num_query_groups = 8;
  return c;
}

}  // namespace

GptConfig GptConfig::llama3_2_1b(std::int64_t vocab) {
  GptConfig c = llama3_base(vocab);
  c.num_layers = 16;
  c.hidden_size = 2048;
  c.ffn_hidden_size = 8192;
  c.kv_channels = 64;
  c.seq_length = 2048;
  c.max_position_embeddings = 131072;
  c.rope_llama3_scaling = true;
  c.rope_scaling_factor = 32;
  c.untie_embeddings_and_output_weights = false;  // Llama-3.2-1B ties them
  return c;
}

GptConfig GptConfig::llama3_8b(std::int64_t vocab) {
  GptConfig c = llama3_base(vocab);
  c.num_layers = 32;
  c.hidden_size = 4096;
  c.ffn_hidden_size = 14336;
  c.kv_channels = 128;
  c.seq_length = 8192;
  c.max_position_embeddings = 8192;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

std::string_view to_string(PositionEmbedding v) {
  switch (v) {
    case PositionEmbedding::LearnedAbsolute: return "learned_absolute";
    case PositionEmbedding::Rope: return "rope";
    case PositionEmbedding::None: return "none";
  }
  return "?";
}

std::string_view to_string(Normalization v) { return v == Normalization::LayerNorm ? "LayerNorm" : "RMSNorm"; }

std::string_view to_string(TransformerImpl v) { return v == TransformerImpl::Local ? "local" : "transformer_engine"; }

std::string_view to_string(RecomputeGranularity v) {
  switch (v) {
    case RecomputeGranularity::None: return "none";
    case RecomputeGranularity::Full: return "full";
    case RecomputeGranularity::Selective: return "selective";
  }
  return "?";
}

std::string_view to_string(RecomputeMethod v) { return v == RecomputeMethod::Uniform ? "uniform" : "block"; }

PositionEmbedding parse_position_embedding(std::string_view s) {
  if (s == "learned_absolute") return PositionEmbedding::LearnedAbsolute;
  if (s == "rope") return PositionEmbedding::Rope;
  if (s == "none") return PositionEmbedding::None;
  KILN_FAIL("--position-embedding-type: '{}' is not one of learned_absolute, rope, none", s);
}

Normalization parse_normalization(std::string_view s) {
  if (s == "LayerNorm") return Normalization::LayerNorm;
  if (s == "RMSNorm") return Normalization::RMSNorm;
  KILN_FAIL("--normalization: '{}' is not one of LayerNorm, RMSNorm", s);
}

TransformerImpl parse_transformer_impl(std::string_view s) {
  if (s == "local") return TransformerImpl::Local;
  if (s == "transformer_engine") return TransformerImpl::TransformerEngine;
  KILN_FAIL("--transformer-impl: '{}' is not one of local, transformer_engine", s);
}

RecomputeGranularity parse_recompute_granularity(std::string_view s) {
  if (s == "full") return RecomputeGranularity::Full;
  if (s == "selective") return RecomputeGranularity::Selective;
  KILN_FAIL("--recompute-granularity: '{}' is not one of full, selective", s);
}

RecomputeMethod parse_recompute_method(std::string_view s) {
  if (s == "uniform") return RecomputeMethod::Uniform;
  if (s == "block") return RecomputeMethod::Block;
  KILN_FAIL("--recompute-method: '{}' is not one of uniform, block", s);
}

}  // namespace kiln::models
