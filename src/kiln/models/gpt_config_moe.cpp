// GptConfig's MoE part: validation of the --moe-* flags, the MoE layer pattern and the names.
#include <fmt/format.h>

#include <string>

#include "kiln/models/gpt_config.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

bool GptConfig::is_moe_layer(std::int64_t layer) const {
  if (num_experts <= 0) return false;
  if (!moe_layer_pattern.empty())
    return layer < static_cast<std::int64_t>(moe_layer_pattern.size()) &&
           moe_layer_pattern[static_cast<std::size_t>(layer)] != 0;
  return moe_layer_freq > 0 && layer % moe_layer_freq == 0;
}

std::int64_t GptConfig::num_moe_layers() const {
  std::int64_t n = 0;
  for (std::int64_t i = 0; i < num_layers; ++i) n += is_moe_layer(i) ? 1 : 0;
  return n;
}

void validate_moe_config(const GptConfig& c) {
  KILN_CHECK(c.num_experts >= 0, "GPT config: --num-experts must be positive, got {}", c.num_experts);
  if (c.num_experts == 0) return;
  const std::int64_t e = c.num_experts;
  KILN_CHECK(!c.add_bias_linear,
             "GPT config: --num-experts needs --disable-bias-linear (the grouped experts have no biases, as "
             "Megatron's GroupedMLP)");
  KILN_CHECK(c.moe_ffn_hidden_size >= 0, "GPT config: --moe-ffn-hidden-size must be positive, got {}",
             c.moe_ffn_hidden_size);
  KILN_CHECK(c.moe_router_topk >= 1 && c.moe_router_topk <= e,
             "GPT config: --moe-router-topk ({}) must be between 1 and --num-experts ({})", c.moe_router_topk, e);
  KILN_CHECK(!c.moe_router_pre_softmax || c.moe_router_score_function == MoeRouterScore::Softmax,
             "GPT config: --moe-router-pre-softmax needs --moe-router-score-function softmax (it is {})",
             to_string(c.moe_router_score_function));
  KILN_CHECK(c.moe_router_topk_scaling_factor >= 0,
             "GPT config: --moe-router-topk-scaling-factor must be positive, got {}", c.moe_router_topk_scaling_factor);
  KILN_CHECK(!c.moe_router_enable_expert_bias || c.moe_router_score_function == MoeRouterScore::Sigmoid,
             "GPT config: --moe-router-enable-expert-bias needs --moe-router-score-function sigmoid (DeepSeek-V3's "
             "aux-loss-free balancing; it is {})",
             to_string(c.moe_router_score_function));
  KILN_CHECK(c.moe_router_bias_update_rate >= 0, "GPT config: --moe-router-bias-update-rate must be >= 0, got {}",
             c.moe_router_bias_update_rate);
  KILN_CHECK(c.moe_aux_loss_coeff >= 0, "GPT config: --moe-aux-loss-coeff must be >= 0, got {}", c.moe_aux_loss_coeff);
  KILN_CHECK(c.moe_z_loss_coeff >= 0, "GPT config: --moe-z-loss-coeff must be >= 0, got {}", c.moe_z_loss_coeff);
  KILN_CHECK(!c.moe_expert_capacity_factor_set || c.moe_expert_capacity_factor > 0,
             "GPT config: --moe-expert-capacity-factor must be positive, got {}", c.moe_expert_capacity_factor);
  KILN_CHECK(!c.moe_pad_expert_input_to_capacity || c.moe_expert_capacity_factor_set,
             "GPT config: --moe-pad-expert-input-to-capacity needs --moe-expert-capacity-factor");
  KILN_CHECK(c.moe_shared_expert_intermediate_size >= 0,
             "GPT config: --moe-shared-expert-intermediate-size must be positive, got {}",
             c.moe_shared_expert_intermediate_size);
  if (c.moe_router_num_groups > 0 || c.moe_router_group_topk > 0) {
    const std::int64_t g = c.moe_router_num_groups, gk = c.moe_router_group_topk;
    KILN_CHECK(g > 0 && gk > 0,
               "GPT config: group-limited routing needs both --moe-router-num-groups and --moe-router-group-topk "
               "(got {} and {})",
               g, gk);
    KILN_CHECK(g <= 64 && e % g == 0,
               "GPT config: --num-experts ({}) must be divisible by --moe-router-num-groups ({}, at most 64)", e, g);
    KILN_CHECK(gk <= g, "GPT config: --moe-router-group-topk ({}) exceeds --moe-router-num-groups ({})", gk, g);
    KILN_CHECK(c.moe_router_topk % gk == 0 && c.moe_router_topk / gk <= e / g,
               "GPT config: --moe-router-topk ({}) must be a multiple of --moe-router-group-topk ({}) with at most {} "
               "experts per group (--num-experts / --moe-router-num-groups)",
               c.moe_router_topk, gk, e / g);
  }
  if (!c.moe_layer_pattern.empty()) {
    KILN_CHECK(static_cast<std::int64_t>(c.moe_layer_pattern.size()) == c.num_layers,
               "GPT config: --moe-layer-freq lists {} layers, --num-layers is {}", c.moe_layer_pattern.size(),
               c.num_layers);
  } else {
    KILN_CHECK(c.moe_layer_freq >= 1, "GPT config: --moe-layer-freq must be positive, got {}", c.moe_layer_freq);
  }
}

std::string_view to_string(MoeRouterScore v) { return v == MoeRouterScore::Softmax ? "softmax" : "sigmoid"; }

std::string_view to_string(MoeLoadBalancing v) {
  switch (v) {
    case MoeLoadBalancing::AuxLoss: return "aux_loss";
    case MoeLoadBalancing::SeqAuxLoss: return "seq_aux_loss";
    case MoeLoadBalancing::None: return "none";
  }
  return "?";
}

std::string_view to_string(MoeTokenDropPolicy v) { return v == MoeTokenDropPolicy::Probs ? "probs" : "position"; }

MoeRouterScore parse_moe_router_score(std::string_view s) {
  if (s == "softmax") return MoeRouterScore::Softmax;
  if (s == "sigmoid") return MoeRouterScore::Sigmoid;
  KILN_FAIL("--moe-router-score-function: '{}' is not one of softmax, sigmoid", s);
}

MoeLoadBalancing parse_moe_load_balancing(std::string_view s) {
  if (s == "aux_loss") return MoeLoadBalancing::AuxLoss;
  if (s == "seq_aux_loss") return MoeLoadBalancing::SeqAuxLoss;
  if (s == "none") return MoeLoadBalancing::None;
  KILN_FAIL("--moe-router-load-balancing-type: '{}' is not one of aux_loss, seq_aux_loss, none", s);
}

MoeTokenDropPolicy parse_moe_token_drop_policy(std::string_view s) {
  if (s == "probs") return MoeTokenDropPolicy::Probs;
  if (s == "position") return MoeTokenDropPolicy::Position;
  KILN_FAIL("--moe-token-drop-policy: '{}' is not one of probs, position", s);
}

std::string_view to_string(MoeTokenDispatcher v) {
  return v == MoeTokenDispatcher::AllToAll ? "alltoall" : "allgather";
}

MoeTokenDispatcher parse_moe_token_dispatcher(std::string_view s) {
  if (s == "alltoall") return MoeTokenDispatcher::AllToAll;
  if (s == "allgather") return MoeTokenDispatcher::AllGather;
  KILN_FAIL("--moe-token-dispatcher-type: '{}' is not one of alltoall, allgather", s);
}

void parse_moe_layer_freq(std::string_view s, GptConfig& config) {
  KILN_CHECK(!s.empty(), "--moe-layer-freq: empty value");
  std::string body(s);
  if (!body.empty() && body.front() == '[' && body.back() == ']') body = body.substr(1, body.size() - 2);
  const bool list = body.find(',') != std::string::npos || s.front() == '[';
  std::vector<int> values;
  std::size_t start = 0;
  while (start <= body.size()) {
    const std::size_t end = std::min(body.find(',', start), body.size());
    std::string item = body.substr(start, end - start);
    while (!item.empty() && item.front() == ' ') item.erase(item.begin());
    while (!item.empty() && item.back() == ' ') item.pop_back();
    KILN_CHECK(!item.empty() && item.find_first_not_of("0123456789") == std::string::npos,
               "--moe-layer-freq: '{}' is neither an integer nor a list of 0/1 such as [1,0,1,0]", s);
    values.push_back(std::stoi(item));
    start = end + 1;
  }
  if (!list) {
    config.moe_layer_freq = values[0];
    config.moe_layer_pattern.clear();
    return;
  }
  for (int v : values) KILN_CHECK(v == 0 || v == 1, "--moe-layer-freq: the list form takes 0 and 1 only, got '{}'", s);
  config.moe_layer_pattern = values;
}

}  // namespace kiln::models
