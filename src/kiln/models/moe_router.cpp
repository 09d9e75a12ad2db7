#include "kiln/models/moe_router.h"

#include <algorithm>
#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/models/moe_aux_loss.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

TopKRouter::TopKRouter(const MoeSpec& spec, const dist::Communicator* sequence_partition, int context_parallel_size)
    : Module("TopKRouter"), spec(spec), aux_gradient_factor_(context_parallel_size) {
  KILN_CHECK(context_parallel_size == 1 ||
                 (sequence_partition != nullptr && sequence_partition->size() % context_parallel_size == 0),
             "TopKRouter: a context-parallel size of {} needs a sequence partition of a multiple of its ranks",
             context_parallel_size);
  if (sequence_partition != nullptr && sequence_partition->size() > 1) sequence_partition_ = *sequence_partition;
  weight = register_parameter("weight", Tensor::zeros({spec.num_experts, spec.hidden_size}));
  if (spec.expert_bias) expert_bias = register_buffer("expert_bias", Tensor::zeros({spec.num_experts}));
}

std::int64_t TopKRouter::capacity(std::int64_t num_tokens) const {
  if (spec.capacity_factor <= 0) return 0;
  const double per_expert = static_cast<double>(num_tokens * spec.router.topk) / static_cast<double>(spec.num_experts);
  return static_cast<std::int64_t>(std::ceil(per_expert * spec.capacity_factor));
}

RouterOutput TopKRouter::forward(const Tensor& x, std::int64_t seq_length) {
  // The router runs in f32 whatever the model's dtype (Megatron's --moe-router-dtype fp32).
  Tensor logits = linear(x.dtype() == DType::F32 ? x : x.to(DType::F32),
                         weight.dtype() == DType::F32 ? weight : weight.to(DType::F32));
  const bool training = is_training() && grad_enabled();
  Tensor z;
  if (training && spec.z_loss_coeff > 0) {
    // Under sequence parallelism the mean over this rank's tokens, divided by the group's size:
    // the shares add up to the mean over the group's tokens (Megatron's coefficient / tp_cp size).
    z = z_loss(logits, spec.z_loss_coeff / (sequence_partition_ ? sequence_partition_->size() : 1));
    logits = attach_aux_loss(logits, z, aux_gradient_factor_);
  }
  RouterOutput out;
  const Tensor bias = expert_bias.defined() ? expert_bias.to(DType::F32) : Tensor();
  out.routing = te::router_topk(logits, bias, spec.router);
  out.plan = te::dispatch_plan(
      out.routing, spec.num_experts, capacity(x.size(0)), spec.pad_to_capacity,
      spec.drop_policy == MoeTokenDropPolicy::Probs ? te::TokenDropPolicy::Probs : te::TokenDropPolicy::Position);
  Tensor aux;
  if (training && spec.load_balancing != MoeLoadBalancing::None && spec.aux_loss_coeff > 0) {
    const Tensor scores = routing_scores_for_aux_loss(logits, spec.router.score == te::RouterScore::Sigmoid);
    const Tensor map = aux_loss_routing_map(logits, spec.router.topk);
    aux = spec.load_balancing == MoeLoadBalancing::SeqAuxLoss
              ? seq_aux_loss(scores, map, spec.router.topk, seq_length, spec.aux_loss_coeff, partition())
              : switch_aux_loss(scores, map, spec.router.topk, spec.aux_loss_coeff, partition());
    out.routing.probs = attach_aux_loss(out.routing.probs, aux, aux_gradient_factor_);
  }
  if (training) count(out, aux, z);
  return out;
}

void TopKRouter::count(const RouterOutput& out, const Tensor& aux, const Tensor& z) {
  NoGradGuard no_grad;
  const Device d = out.plan.tokens.device();
  if (!stat_tokens_.defined() || stat_tokens_.device() != d) {
    stat_tokens_ = Tensor::zeros({spec.num_experts}, DType::I64, d);
    stat_dropped_ = Tensor::zeros({spec.num_experts}, DType::I64, d);
    kept_since_update_ = Tensor::zeros({spec.num_experts}, DType::I64, d);
    stat_aux_ = Tensor::zeros({}, DType::F32, d);
    stat_z_ = Tensor::zeros({}, DType::F32, d);
  }
  stat_tokens_.add_(out.plan.tokens);
  stat_dropped_.add_(out.plan.dropped);
  kept_since_update_.add_(sub(out.plan.tokens, out.plan.dropped));
  if (aux.defined()) stat_aux_.add_(aux.detach());
  if (z.defined()) stat_z_.add_(z.detach());
  ++stat_forwards_;
}

void TopKRouter::update_expert_bias(const dist::Communicator* group, const dist::Communicator* copies) {
  if (!expert_bias.defined()) return;
  NoGradGuard no_grad;
  // Collective: a rank that has not counted yet (no training forward) adds zeros. The sequence
  // partition's slices first (one sample's tokens), DualPipe's two copies of the layer (the two
  // directions' micro-batches), then the data-parallel ranks' samples.
  for (const dist::Communicator* g : {partition(), copies, group}) {
    if (g == nullptr || g->size() == 1) continue;
    if (!kept_since_update_.defined())
      kept_since_update_ = Tensor::zeros({spec.num_experts}, DType::I64, expert_bias.device());
    dist::all_reduce(*g, kept_since_update_, dist::ReduceOp::Sum).wait();
  }
  if (!kept_since_update_.defined()) return;
  // Megatron's get_updated_expert_bias: offset = mean load - load; bias += sign(offset) * rate.
  const Tensor load = kept_since_update_.to(DType::F32);
  const Tensor offset = sub(mean(load), load);
  const Tensor step = mul(sub(gt(offset, Tensor::zeros({}, DType::F32, load.device())).to(DType::F32),
                              gt(Tensor::zeros({}, DType::F32, load.device()), offset).to(DType::F32)),
                          spec.bias_update_rate);
  expert_bias.add_(step.to(expert_bias.dtype()));
  kept_since_update_.zero_();
}

RouterStats TopKRouter::take_stats() {
  RouterStats s;
  s.forwards = stat_forwards_;
  if (!stat_tokens_.defined()) {
    s.tokens.assign(static_cast<std::size_t>(spec.num_experts), 0);
    s.dropped = s.tokens;
  } else {
    s.tokens = stat_tokens_.to(Device::cpu()).to_vector<std::int64_t>();
    s.dropped = stat_dropped_.to(Device::cpu()).to_vector<std::int64_t>();
    s.load_balancing_loss = stat_aux_.item();
    s.z_loss = stat_z_.item();
    stat_tokens_.zero_();
    stat_dropped_.zero_();
    stat_aux_.zero_();
    stat_z_.zero_();
  }
  stat_forwards_ = 0;
  if (sequence_partition_) {
    // The slices of the same sequences: their loads, drops and loss shares add up to the whole
    // sequences' (the forwards are the same forwards on every rank, not summed).
    std::vector<std::int64_t> counts = s.tokens;
    counts.insert(counts.end(), s.dropped.begin(), s.dropped.end());
    sequence_partition_->all_reduce<std::int64_t>(counts);
    const auto e = static_cast<std::ptrdiff_t>(s.tokens.size());
    std::copy(counts.begin(), counts.begin() + e, s.tokens.begin());
    std::copy(counts.begin() + e, counts.end(), s.dropped.begin());
    std::vector<double> losses = {s.load_balancing_loss, s.z_loss};
    sequence_partition_->all_reduce<double>(losses);
    s.load_balancing_loss = losses[0];
    s.z_loss = losses[1];
  }
  return s;
}

}  // namespace kiln::models
