#pragma once
// What a mixture-of-experts MLP is made of (Megatron-core's MoELayer: TopKRouter, token
// dispatcher, experts, shared experts), derived from a validated GptConfig by moe_spec().
#include <cstdint>

#include "kiln/models/gpt_config.h"
#include "kiln/models/transformer_spec.h"
#include "kiln/te/moe_ops.h"

namespace kiln::models {

struct MoeSpec {
  std::int64_t hidden_size = 0;
  std::int64_t num_experts = 0;
  std::int64_t ffn_hidden_size = 0;  // each expert's F (linear_fc1 has 2F rows with SwiGLU)
  MlpActivation activation = MlpActivation::GeluTanh;
  te::RouterTopkParams router;  // score, pre-softmax, top-k, groups, scaling factor
  bool expert_bias = false;     // --moe-router-enable-expert-bias
  double bias_update_rate = 1e-3;
  MoeLoadBalancing load_balancing = MoeLoadBalancing::AuxLoss;
  double aux_loss_coeff = 0, z_loss_coeff = 0;
  double capacity_factor = 0;  // 0: no capacity
  bool pad_to_capacity = false;
  MoeTokenDropPolicy drop_policy = MoeTokenDropPolicy::Probs;
  std::int64_t shared_expert_ffn = 0;  // 0: no shared expert
  bool grouped_gemm = false, permute_fusion = false;
  std::int64_t seq_length = 0;  // for the sequence-level aux loss
  // Expert parallelism (--moe-token-dispatcher-type): how tokens reach experts on other ranks.
  MoeTokenDispatcher dispatcher = MoeTokenDispatcher::AllToAll;
};

MoeSpec moe_spec(const GptConfig& config);

}  // namespace kiln::models
