#include "kiln/models/gpt_config_mla_mtp.h"

#include <cmath>

#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

std::int64_t norm_parameters(const GptConfig& c, std::int64_t size) {
  return c.normalization == Normalization::LayerNorm ? 2 * size : size;
}

void validate_mla(const GptConfig& c) {
  KILN_CHECK(c.position_embedding_type == PositionEmbedding::Rope,
             "GPT config: --multi-latent-attention rotates its decoupled query/key channels (--qk-pos-emb-head-dim) "
             "with RoPE: it needs --position-embedding-type rope (it is {})",
             to_string(c.position_embedding_type));
  KILN_CHECK(c.num_query_groups == 0,
             "GPT config: --multi-latent-attention does not take --group-query-attention / --num-query-groups: MLA's "
             "keys and values are per head, up-projected from one shared latent (--kv-lora-rank)");
  KILN_CHECK(c.kv_channels == 0,
             "GPT config: --kv-channels does not apply with --multi-latent-attention: its head sizes are "
             "--qk-head-dim, --qk-pos-emb-head-dim and --v-head-dim");
  KILN_CHECK(c.qk_head_dim > 0, "GPT config: --qk-head-dim must be positive, got {}", c.qk_head_dim);
  KILN_CHECK(c.v_head_dim > 0, "GPT config: --v-head-dim must be positive, got {}", c.v_head_dim);
  KILN_CHECK(c.qk_pos_emb_head_dim > 0 && c.qk_pos_emb_head_dim % 2 == 0,
             "GPT config: --qk-pos-emb-head-dim must be positive and even (RoPE rotates pairs of channels), got {}",
             c.qk_pos_emb_head_dim);
  KILN_CHECK(c.kv_lora_rank > 0, "GPT config: --kv-lora-rank must be positive, got {}", c.kv_lora_rank);
  KILN_CHECK(c.q_lora_rank >= 0, "GPT config: --q-lora-rank must be 0 (no query compression) or positive, got {}",
             c.q_lora_rank);
  const std::int64_t nh = c.num_attention_heads;
  const std::int64_t q_width = nh * (c.qk_head_dim + c.qk_pos_emb_head_dim);
  const std::int64_t kv_width = nh * (c.qk_head_dim + c.v_head_dim);
  // A latent at least as wide as what it is up-projected to compresses nothing.
  KILN_CHECK(c.kv_lora_rank < kv_width,
             "GPT config: --kv-lora-rank ({}) must be smaller than the keys and values it is up-projected to, "
             "--num-attention-heads x (--qk-head-dim + --v-head-dim) = {} x ({} + {}) = {}",
             c.kv_lora_rank, nh, c.qk_head_dim, c.v_head_dim, kv_width);
  KILN_CHECK(c.q_lora_rank < q_width,
             "GPT config: --q-lora-rank ({}) must be smaller than the queries it is up-projected to, "
             "--num-attention-heads x (--qk-head-dim + --qk-pos-emb-head-dim) = {} x ({} + {}) = {} (0: no query "
             "compression)",
             c.q_lora_rank, nh, c.qk_head_dim, c.qk_pos_emb_head_dim, q_width);
}

}  // namespace

void validate_mla_mtp(const GptConfig& c) {
  if (c.multi_latent_attention) validate_mla(c);
  KILN_CHECK(c.mtp_num_layers >= 0, "GPT config: --mtp-num-layers must be 0 (no MTP) or more, got {}",
             c.mtp_num_layers);
  KILN_CHECK(std::isfinite(c.mtp_loss_scaling_factor) && c.mtp_loss_scaling_factor >= 0,
             "GPT config: --mtp-loss-scaling-factor must be a finite number >= 0, got {}", c.mtp_loss_scaling_factor);
  if (c.mtp_num_layers > 0) {
    KILN_CHECK(c.seq_length > c.mtp_num_layers,
               "GPT config: --mtp-num-layers ({}) must be smaller than --seq-length ({}): depth k predicts the token "
               "k + 1 ahead",
               c.mtp_num_layers, c.seq_length);
    KILN_CHECK(c.position_embedding_type != PositionEmbedding::LearnedAbsolute,
               "GPT config: --mtp-num-layers embeds the token k positions ahead with the shared word embeddings only; "
               "learned absolute positions (--position-embedding-type learned_absolute) are not supported with MTP: "
               "use --position-embedding-type rope or none");
  }
}

std::int64_t mla_attention_parameters(const GptConfig& c) {
  const std::int64_t h = c.hidden_size, nh = c.num_attention_heads;
  const std::int64_t qk = c.qk_head_dim, pe = c.qk_pos_emb_head_dim, v = c.v_head_dim;
  const std::int64_t qr = c.q_lora_rank, kvr = c.kv_lora_rank;
  const std::int64_t q = qr > 0 ? h * qr + norm_parameters(c, qr) + qr * nh * (qk + pe) : h * nh * (qk + pe);
  const std::int64_t kv = h * (kvr + pe) + norm_parameters(c, kvr) + kvr * nh * (qk + v);
  return q + kv + (nh * v + (c.add_bias_linear ? 1 : 0)) * h;
}

double mla_attention_multiply_adds(const GptConfig& c) {
  const double h = static_cast<double>(c.hidden_size), nh = static_cast<double>(c.num_attention_heads);
  const double qk = static_cast<double>(c.qk_head_dim), pe = static_cast<double>(c.qk_pos_emb_head_dim);
  const double v = static_cast<double>(c.v_head_dim), s = static_cast<double>(c.seq_length);
  const double qr = static_cast<double>(c.q_lora_rank), kvr = static_cast<double>(c.kv_lora_rank);
  const double q = c.q_lora_rank > 0 ? h * qr + qr * nh * (qk + pe) : h * nh * (qk + pe);
  const double kv = h * (kvr + pe) + kvr * nh * (qk + v);
  const double core = nh * (qk + pe) * s / 2 + nh * v * s / 2;
  return q + kv + core + nh * v * h;
}

std::int64_t mtp_parameters(const GptConfig& c, std::int64_t layer_parameters) {
  const std::int64_t h = c.hidden_size;
  return c.mtp_num_layers * (3 * norm_parameters(c, h) + 2 * h * h + layer_parameters);
}

double mtp_multiply_adds(const GptConfig& c, double layer_multiply_adds) {
  const double h = static_cast<double>(c.hidden_size), v = static_cast<double>(c.padded_vocab_size());
  return static_cast<double>(c.mtp_num_layers) * (layer_multiply_adds + 2 * h * h + h * v);
}

}  // namespace kiln::models
