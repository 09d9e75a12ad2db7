#include "moe_flags.h"

#include <fmt/format.h>

#include "number_checks.h"

namespace kiln::cli {

void add_moe_flags(CLI::App* cmd, models::GptConfig& c, MoeFlags& f) {
  const char* group = "Mixture of experts";
  const auto non_negative = finite_number_above(0, true);
  cmd->add_option("--num-experts", c.num_experts, "routed experts per MoE layer (0: dense)")
      ->check(whole_number_at_least(0))
      ->group(group);
  cmd->add_option("--moe-ffn-hidden-size", c.moe_ffn_hidden_size, "each expert's MLP width (default --ffn-hidden-size)")
      ->check(whole_number_at_least(1))
      ->group(group);
  cmd->add_option("--moe-router-topk", c.moe_router_topk, "experts per token")
      ->check(whole_number_at_least(1))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-router-score-function", f.score_function, "softmax or sigmoid")
      ->check(CLI::IsMember({"softmax", "sigmoid"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_flag("--moe-router-pre-softmax", c.moe_router_pre_softmax, "softmax over all experts before the top-k")
      ->group(group);
  cmd->add_option("--moe-router-topk-scaling-factor", c.moe_router_topk_scaling_factor,
                  "multiplies the routing probabilities (0: none)")
      ->check(non_negative)
      ->group(group);
  cmd->add_flag("--moe-router-enable-expert-bias", c.moe_router_enable_expert_bias,
                "DeepSeek-V3's aux-loss-free balancing: a bias on the routing scores, moved after each step")
      ->group(group);
  cmd->add_option("--moe-router-bias-update-rate", c.moe_router_bias_update_rate, "the expert bias's step")
      ->check(non_negative)
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-router-load-balancing-type", f.load_balancing_type, "aux_loss, seq_aux_loss or none")
      ->check(CLI::IsMember({"aux_loss", "seq_aux_loss", "none"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-aux-loss-coeff", c.moe_aux_loss_coeff, "load-balancing loss coefficient")
      ->check(non_negative)
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-z-loss-coeff", c.moe_z_loss_coeff, "router z-loss coefficient")
      ->check(non_negative)
      ->group(group);
  cmd->add_option("--moe-expert-capacity-factor", c.moe_expert_capacity_factor,
                  "expert capacity as a multiple of the balanced load (tokens over it are dropped)")
      ->group(group);
  cmd->add_flag("--moe-pad-expert-input-to-capacity", c.moe_pad_expert_input_to_capacity,
                "pad every expert's input to its capacity")
      ->group(group);
  cmd->add_option("--moe-token-drop-policy", f.token_drop_policy, "probs or position")
      ->check(CLI::IsMember({"probs", "position"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-shared-expert-intermediate-size", c.moe_shared_expert_intermediate_size,
                  "a shared expert of this width (0: none)")
      ->check(whole_number_at_least(1))
      ->group(group);
  cmd->add_option("--moe-layer-freq", f.layer_freq, "N (every N-th layer is MoE) or a 0/1 list such as [1,0,1,0]")
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--moe-router-num-groups", c.moe_router_num_groups, "expert groups of device-limited routing")
      ->check(whole_number_at_least(1))
      ->group(group);
  cmd->add_option("--moe-router-group-topk", c.moe_router_group_topk, "groups a token may route to")
      ->check(whole_number_at_least(1))
      ->group(group);
  cmd->add_flag("--moe-grouped-gemm", c.moe_grouped_gemm, "experts through one grouped GEMM (te::grouped_linear)")
      ->group(group);
  cmd->add_flag("--moe-permute-fusion", c.moe_permute_fusion, "fused permute / unpermute kernels")->group(group);
}

void add_expert_parallel_flags(CLI::App* cmd, models::GptConfig& c, MoeFlags& f) {
  const char* group = "Expert parallelism (mpirun -np N, N a multiple of the size)";
  cmd->add_option("--expert-model-parallel-size", c.expert_model_parallel_size,
                  "ranks the experts of each MoE layer are split over (--num-experts / size each); tokens reach them "
                  "through --moe-token-dispatcher-type")
      ->check(whole_number_at_least(1))
      ->group(group);
  cmd->add_option("--moe-token-dispatcher-type", f.token_dispatcher_type,
                  "alltoall (tokens sent to their experts' ranks) or allgather (every rank's tokens gathered)")
      ->check(CLI::IsMember({"alltoall", "allgather"}))
      ->capture_default_str()
      ->group(group);
  cmd->add_option("--expert-tensor-parallel-size", c.expert_tensor_parallel_size,
                  "ranks each expert is split over (linear_fc1 by rows, linear_fc2 by columns); Megatron's default "
                  "is the tensor-parallel size, Kiln's 1 (whole experts)")
      ->check(whole_number_at_least(1))
      ->group(group);
}

void apply_moe_flags(const CLI::App* cmd, const MoeFlags& f, models::GptConfig& c) {
  c.moe_token_dispatcher_type = models::parse_moe_token_dispatcher(f.token_dispatcher_type);
  c.moe_router_score_function = models::parse_moe_router_score(f.score_function);
  c.moe_router_load_balancing_type = models::parse_moe_load_balancing(f.load_balancing_type);
  c.moe_token_drop_policy = models::parse_moe_token_drop_policy(f.token_drop_policy);
  c.moe_expert_capacity_factor_set = cmd->count("--moe-expert-capacity-factor") > 0;
  models::parse_moe_layer_freq(f.layer_freq, c);
}

}  // namespace kiln::cli
