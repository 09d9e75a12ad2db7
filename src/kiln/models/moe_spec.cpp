#include "kiln/models/moe_spec.h"

namespace kiln::models {

MoeSpec moe_spec(const GptConfig& c) {
  MoeSpec s;
  s.hidden_size = c.hidden_size;
  s.num_experts = c.num_experts;
  s.ffn_hidden_size = c.moe_ffn_hidden();
  s.activation = c.swiglu ? MlpActivation::SwiGLU : MlpActivation::GeluTanh;
  s.router.score =
      c.moe_router_score_function == MoeRouterScore::Softmax ? te::RouterScore::Softmax : te::RouterScore::Sigmoid;
  s.router.pre_softmax = c.moe_router_pre_softmax;
  s.router.topk = c.moe_router_topk;
  s.router.num_groups = c.moe_router_num_groups;
  s.router.group_topk = c.moe_router_group_topk;
  s.router.scaling_factor = c.moe_router_topk_scaling_factor;
  s.expert_bias = c.moe_router_enable_expert_bias;
  s.bias_update_rate = c.moe_router_bias_update_rate;
  s.load_balancing = c.moe_router_load_balancing_type;
  s.aux_loss_coeff = c.moe_aux_loss_coeff;
  s.z_loss_coeff = c.moe_z_loss_coeff;
  s.capacity_factor = c.moe_expert_capacity_factor_set ? c.moe_expert_capacity_factor : 0;
  s.pad_to_capacity = c.moe_pad_expert_input_to_capacity;
  s.drop_policy = c.moe_token_drop_policy;
  s.shared_expert_ffn = c.moe_shared_expert_intermediate_size;
  s.grouped_gemm = c.moe_grouped_gemm;
  s.permute_fusion = c.moe_permute_fusion;
  s.seq_length = c.seq_length;
  s.dispatcher = c.moe_token_dispatcher_type;
  return s;
}

}  // namespace kiln::models
