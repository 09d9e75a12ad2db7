#include "kiln/models/moe_aux_loss.h"

#include <atomic>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/te/moe.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {
std::atomic<double> g_aux_loss_scale{1.0};
}  // namespace

void set_moe_aux_loss_scale(double scale) { g_aux_loss_scale.store(scale); }
double moe_aux_loss_scale() { return g_aux_loss_scale.load(); }

Tensor attach_aux_loss(const Tensor& x, const Tensor& aux, double gradient_factor) {
  Tensor y = x.detach();
  if (autograd::needs_grad({x, aux}))
    autograd::record("MoeAuxLossBackward", {x, aux}, {&y},
                     [shape = aux.shape(), device = aux.device(), dtype = aux.dtype(),
                      gradient_factor](const autograd::Grads& g) -> autograd::Grads {
                       return {g[0], Tensor::full(shape, moe_aux_loss_scale() * gradient_factor, dtype, device)};
                     });
  return y;
}

Tensor routing_scores_for_aux_loss(const Tensor& logits, bool sigmoid) {
  if (!sigmoid) return softmax(logits, -1);
  Tensor s = kiln::sigmoid(logits);
  return div(s, add(sum(s, {-1}, true), 1e-20));
}

Tensor aux_loss_routing_map(const Tensor& logits, std::int64_t topk) {
  te::RouterTopkParams p;
  p.score = te::RouterScore::Softmax;
  p.pre_softmax = true;  // a top-k of softmax(logits) = of the logits = of the normalised sigmoids
  p.topk = topk;
  const te::RouterTopk r = te::router_topk(logits.detach(), Tensor(), p);
  Tensor map = Tensor::zeros(logits.shape(), DType::F32, logits.device());
  return scatter_add(map, 1, r.indices, Tensor::ones(r.indices.shape(), DType::F32, logits.device()));
}

namespace {

// The ranks of a sequence-partition group (1 without one).
double ranks_of(const dist::Communicator* group) { return group != nullptr ? group->size() : 1; }

// Routing-map counts summed over the sequence-partition group (constants: the map has no gradient).
Tensor summed_counts(const Tensor& counts, const dist::Communicator* group) {
  if (group == nullptr || group->size() == 1) return counts;
  NoGradGuard no_grad;
  Tensor all = counts.detach().contiguous().clone();
  dist::all_reduce(*group, all, dist::ReduceOp::Sum).wait();
  return all;
}

}  // namespace

Tensor switch_aux_loss(const Tensor& scores, const Tensor& routing_map, std::int64_t topk, double coeff,
                       const dist::Communicator* sequence_partition) {
  const double n = static_cast<double>(scores.size(0)) * ranks_of(sequence_partition),
               e = static_cast<double>(scores.size(1));
  const Tensor tokens = summed_counts(sum(routing_map, {0}), sequence_partition);
  return mul(sum(mul(sum(scores, {0}), tokens)), e * coeff / (static_cast<double>(topk) * n * n));
}

Tensor seq_aux_loss(const Tensor& scores, const Tensor& routing_map, std::int64_t topk, std::int64_t seq_length,
                    double coeff, const dist::Communicator* sequence_partition) {
  const std::int64_t e = scores.size(1), b = scores.size(0) / seq_length;
  const Tensor per_seq_scores = sum(scores.reshape({b, seq_length, e}), {1});  // [B, E]
  const Tensor per_seq_tokens =
      summed_counts(sum(routing_map.reshape({b, seq_length, e}), {1}), sequence_partition);  // [B, E]
  const double t = static_cast<double>(seq_length) * ranks_of(sequence_partition);
  return mul(sum(mul(per_seq_scores, per_seq_tokens)),
             static_cast<double>(e) * coeff / (static_cast<double>(topk) * t * t * static_cast<double>(b)));
}

Tensor z_loss(const Tensor& logits, double coeff) {
  const Tensor m = amax(logits, {-1}, true).detach();
  const Tensor lse = add(log(sum(exp(sub(logits, m)), {-1}, true)), m);
  return mul(mean(square(lse)), coeff);
}

}  // namespace kiln::models
