#pragma once
// GptConfig: the one validated description of a GPT-2 or Llama style decoder (Megatron-core's
// TransformerConfig, kept small). Field names follow Megatron's command-line flags
// (--num-layers -> num_layers); a 0 in a sizing field means "Megatron's default", resolved by the
// accessors below (ffn_hidden(), query_groups(), head_dim(), max_positions()), so a config
// converted to flags and back is unchanged. validate() refuses inconsistent configs, naming the
// flags to change.
#include <cstdint>
#include <string_view>
#include <vector>

#include "kiln/te/fp8_recipe.h"

namespace kiln::models {

enum class PositionEmbedding { LearnedAbsolute, Rope, None };  // Megatron: learned_absolute, rope, none
enum class Normalization { LayerNorm, RMSNorm };
enum class TransformerImpl { Local, TransformerEngine };  // --transformer-impl local|transformer_engine
enum class RecomputeGranularity { None, Full, Selective };
enum class RecomputeMethod { Uniform, Block };
// MoE (Megatron's --moe-router-score-function, --moe-router-load-balancing-type, --moe-token-drop-policy)
enum class MoeRouterScore { Softmax, Sigmoid };
enum class MoeLoadBalancing { AuxLoss, SeqAuxLoss, None };
enum class MoeTokenDropPolicy { Probs, Position };
// Expert parallelism's token dispatcher (Megatron's --moe-token-dispatcher-type alltoall | allgather)
enum class MoeTokenDispatcher { AllToAll, AllGather };
// Context parallelism's attention (--cp-comm-type): ring attention over point-to-point sends, or
// Ulysses' all-to-all from sequence- to head-sharded (context_parallel_attention.h).
enum class CpCommType { P2P, A2A };

struct GptConfig {
  std::int64_t num_layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t ffn_hidden_size = 0;  // 0: 4 * hidden (Megatron's default; with --swiglu, see ffn_hidden())
  std::int64_t num_attention_heads = 0;
  std::int64_t num_query_groups = 0;  // 0: = heads (no --group-query-attention)
  std::int64_t kv_channels = 0;       // 0: hidden / heads
  std::int64_t seq_length = 0;
  std::int64_t max_position_embeddings = 0;  // 0: seq_length
  std::int64_t vocab_size = 0;               // the tokenizer's
  std::int64_t make_vocab_size_divisible_by = 128;

  PositionEmbedding position_embedding_type = PositionEmbedding::LearnedAbsolute;
  double rotary_base = 10000;
  // Llama-3.1 frequency scaling (low_freq_factor 1, high_freq_factor 4, original context 8192).
  bool rope_llama3_scaling = false;
  double rope_scaling_factor = 8;

  Normalization normalization = Normalization::LayerNorm;
  double norm_epsilon = 1e-5;
  bool swiglu = false;
  bool add_bias_linear = true;  // --disable-bias-linear sets false
  bool untie_embeddings_and_output_weights = false;

  double attention_dropout = 0.1;
  double hidden_dropout = 0.1;
  double init_method_std = 0.02;

  TransformerImpl transformer_impl = TransformerImpl::Local;
  RecomputeGranularity recompute_granularity = RecomputeGranularity::None;
  RecomputeMethod recompute_method = RecomputeMethod::Uniform;
  std::int64_t recompute_num_layers = 1;

  // MoE: mixture-of-experts MLPs (models/moe_layer.h); num_experts 0: dense MLPs only.
  std::int64_t num_experts = 0;
  std::int64_t moe_ffn_hidden_size = 0;  // 0: ffn_hidden()
  std::int64_t moe_router_topk = 2;
  MoeRouterScore moe_router_score_function = MoeRouterScore::Softmax;
  bool moe_router_pre_softmax = false;
  double moe_router_topk_scaling_factor = 0;  // 0: none
  bool moe_router_enable_expert_bias = false;
  double moe_router_bias_update_rate = 1e-3;
  MoeLoadBalancing moe_router_load_balancing_type = MoeLoadBalancing::AuxLoss;
  double moe_aux_loss_coeff = 0;
  double moe_z_loss_coeff = 0;
  double moe_expert_capacity_factor = 0;  // 0: unset (no capacity, no dropping); set values must be > 0
  bool moe_expert_capacity_factor_set = false;
  bool moe_pad_expert_input_to_capacity = false;
  MoeTokenDropPolicy moe_token_drop_policy = MoeTokenDropPolicy::Probs;
  std::int64_t moe_shared_expert_intermediate_size = 0;  // 0: no shared expert
  // --moe-layer-freq: an integer N (every N-th layer from layer 0 is MoE) or a per-layer 0/1 list.
  std::int64_t moe_layer_freq = 1;
  std::vector<int> moe_layer_pattern;      // non-empty: the list form, one entry per layer
  std::int64_t moe_router_num_groups = 0;  // 0: no group-limited routing
  std::int64_t moe_router_group_topk = 0;
  bool moe_grouped_gemm = false;                // experts through te::grouped_linear, else a loop of linear()s
  bool moe_permute_fusion = false;              // te::moe_permute / moe_unpermute, else index_select and sums
  bool is_moe_layer(std::int64_t layer) const;  // 0-based
  std::int64_t num_moe_layers() const;
  std::int64_t moe_ffn_hidden() const { return moe_ffn_hidden_size > 0 ? moe_ffn_hidden_size : ffn_hidden(); }
  // MLA: multi-head latent attention (DeepSeek-V2/V3, Megatron-core's MLASelfAttention), see
  // transformer_mla.h. Defaults are Megatron's; q_lora_rank 0 means no query compression.
  bool multi_latent_attention = false;
  std::int64_t q_lora_rank = 0;
  std::int64_t kv_lora_rank = 32;
  std::int64_t qk_head_dim = 128;
  std::int64_t qk_pos_emb_head_dim = 64;
  std::int64_t v_head_dim = 128;

  // FP8: the decoder layers' linears (QKV, projection, fc1, fc2) run their GEMMs in FP8
  // (te/fp8_linear.h) with this recipe; the embedding, output layer and attention core stay high
  // precision. --first-last-layers-bf16 keeps the first / last N layers' linears in bf16.
  bool fp8 = false;  // --fp8-format given
  te::Fp8Recipe fp8_recipe;
  // --fp8-param-gather: those linears' weights are kept in FP8 only, cast from the optimizer's fp32
  // masters after each step (te/fp8_primary_weights.h). Not a shape flag (checkpoints are the same).
  bool fp8_param_gather = false;
  bool first_last_layers_bf16 = false;
  std::int64_t num_layers_at_start_in_bf16 = 1;
  std::int64_t num_layers_at_end_in_bf16 = 1;
  bool is_fp8_layer(std::int64_t layer) const;  // 0-based

  // MTP: DeepSeek-V3's multi-token prediction modules (multi_token_prediction.h); 0: none.
  std::int64_t mtp_num_layers = 0;
  double mtp_loss_scaling_factor = 0.1;

  // Tensor parallelism (docs/parallel.md): the layers split over a group of this many ranks
  // (--tensor-model-parallel-size), with the activations outside attention and the MLP split along
  // the sequence (--sequence-parallel). Neither changes the parameters' whole shapes (a checkpoint
  // holds whole tensors), so neither is a shape flag. validate() refuses sizes that do not split.
  int tensor_model_parallel_size = 1;
  bool sequence_parallel = false;
  // --tp-comm-overlap: with --sequence-parallel, the linears' sequence all-gather / reduce-scatter
  // run in chunks under their GEMMs (tensor_parallel_overlap.h). Not FP8 (refused).
  bool tp_comm_overlap = false;
  // Expert parallelism (docs/parallel.md): the routed experts of every MoE layer split over a group of
  // this many ranks (--expert-model-parallel-size; num_experts / size each), the tokens reaching them
  // through the token dispatcher (--moe-token-dispatcher-type). Not shape flags either: a checkpoint
  // holds every expert. validate() refuses expert counts the size does not divide.
  int expert_model_parallel_size = 1;
  // Expert tensor parallelism (--expert-tensor-parallel-size): each expert's linear_fc1 split by rows
  // and linear_fc2 by columns over a group of this many ranks (Megatron-core's expert layout etp x ep
  // x edp), the routed rows gathered over that group before the experts and reduce-scattered after.
  // Megatron's default is the tensor-parallel size; Kiln's is 1 (whole experts). Not a shape flag.
  int expert_tensor_parallel_size = 1;
  MoeTokenDispatcher moe_token_dispatcher_type = MoeTokenDispatcher::AllToAll;
  // Context parallelism (docs/parallel.md): each sequence split over this many ranks with Megatron's
  // causal load balance (--context-parallel-size), attention by --cp-comm-type. Not a shape flag.
  int context_parallel_size = 1;
  CpCommType cp_comm_type = CpCommType::P2P;

  // Throws kiln::Error naming the Megatron flag(s) of the first inconsistency found.
  void validate() const;

  // ---- resolved sizes (valid after validate())
  // Megatron's default for --swiglu without --ffn-hidden-size: int(4 * hidden * 2 / 3 / 64) * 64,
  // which keeps the parameter count of the ungated 4 * hidden MLP.
  std::int64_t ffn_hidden() const;
  std::int64_t query_groups() const;
  std::int64_t head_dim() const;
  std::int64_t max_positions() const;
  // Rows of linear_qkv: (heads + 2 * groups) * head_dim.
  std::int64_t qkv_size() const { return (num_attention_heads + 2 * query_groups()) * head_dim(); }
  // vocab_size rounded up to a multiple of make_vocab_size_divisible_by, as megatron/training/
  // tokenizer's _vocab_size_with_padding but without Megatron's extra factor of the tensor-parallel
  // size: the padded vocabulary (and so a checkpoint) is the same whatever the layout; validate()
  // refuses a tensor-parallel size it does not divide.
  std::int64_t padded_vocab_size() const;
  // Every parameter of the model built from this config (the output layer only when untied).
  std::int64_t num_parameters() const;
  // Training (forward + backward) FLOPs per token, Megatron's formula; see gpt_config.cpp.
  double flops_per_token() const;
  // MLA: the channels RoPE rotates (qk_pos_emb_head_dim with MLA, else head_dim()).
  std::int64_t rope_dim() const { return multi_latent_attention ? qk_pos_emb_head_dim : head_dim(); }

  // ---- presets (vocab: the tokenizer's vocabulary size, padded by padded_vocab_size())
  static GptConfig gpt2_124m(std::int64_t vocab);    // 12 x 768, 12 heads, T 1024
  static GptConfig gpt2_350m(std::int64_t vocab);    // 24 x 1024, 16 heads, T 1024
  static GptConfig llama3_2_1b(std::int64_t vocab);  // 16 x 2048, 32 heads / 8 groups, tied, RoPE llama3 x32
  static GptConfig llama3_8b(std::int64_t vocab);    // 32 x 4096, 32 heads / 8 groups, untied, RoPE base 5e5
};

// Megatron's spellings, for messages and flags: "learned_absolute", "RMSNorm", "transformer_engine", ...
std::string_view to_string(PositionEmbedding v);
std::string_view to_string(Normalization v);
std::string_view to_string(TransformerImpl v);
std::string_view to_string(RecomputeGranularity v);
std::string_view to_string(RecomputeMethod v);
// Parse Megatron's spellings; throw kiln::Error naming the flag and the accepted values.
PositionEmbedding parse_position_embedding(std::string_view s);
Normalization parse_normalization(std::string_view s);
TransformerImpl parse_transformer_impl(std::string_view s);
RecomputeGranularity parse_recompute_granularity(std::string_view s);
RecomputeMethod parse_recompute_method(std::string_view s);
std::string_view to_string(CpCommType v);  // "p2p", "a2a"
CpCommType parse_cp_comm_type(std::string_view s);
// MoE
std::string_view to_string(MoeRouterScore v);
std::string_view to_string(MoeLoadBalancing v);
std::string_view to_string(MoeTokenDropPolicy v);
MoeRouterScore parse_moe_router_score(std::string_view s);
MoeLoadBalancing parse_moe_load_balancing(std::string_view s);
MoeTokenDropPolicy parse_moe_token_drop_policy(std::string_view s);
std::string_view to_string(MoeTokenDispatcher v);
MoeTokenDispatcher parse_moe_token_dispatcher(std::string_view s);
// The MoE flags' consistency (part of GptConfig::validate(); gpt_config_moe.cpp).
void validate_moe_config(const GptConfig& c);
// The FP8 flags' consistency (part of GptConfig::validate(); gpt_config_fp8.cpp).
void validate_fp8_config(const GptConfig& c);
// Tensor and sequence parallelism (gpt_config_parallel.cpp): heads, query groups, the MLP width and
// the padded vocabulary must divide by --tensor-model-parallel-size; MoE, MLA, MTP and FP8 are
// refused with it; --sequence-parallel needs it above 1 and a --seq-length it divides.
void validate_parallel_config(const GptConfig& c);
// Context parallelism (gpt_config_parallel.cpp): --seq-length divisible by 2 x CP, a2a's heads and
// query groups (per tensor-parallel rank) divisible by CP; what is not composed with it refused.
void validate_context_parallel_config(const GptConfig& c);
// "4" -> freq 4; "[1,0,1,0]" (or "1,0,1,0") -> the pattern.
void parse_moe_layer_freq(std::string_view s, GptConfig& config);

}  // namespace kiln::models
