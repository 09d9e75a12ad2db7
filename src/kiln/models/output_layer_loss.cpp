#include "kiln/models/output_layer_loss.h"

#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/models/context_parallel_layout.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/models/vocab_parallel.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

Tensor output_layer_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                  const Tensor& loss_mask, const GptConfig& config, const LayerContext& context) {
  const std::int64_t n = labels.numel();
  if (const dist::Communicator* tp = context.tensor_parallel_group()) {
    // The output layer's GEMM on this rank's vocabulary rows, then the vocabulary-parallel
    // cross-entropy (vocab_parallel.h): the logits never exist whole.
    const Tensor input = config.sequence_parallel ? gather_from_sequence_parallel_region(hidden, *tp)
                                                  : copy_to_tensor_parallel_region(hidden, *tp);
    const Tensor local_logits = linear(input.reshape({n, config.hidden_size}), weight).to(DType::F32);
    const Tensor per_token =
        vocab_parallel_cross_entropy_per_token(local_logits, labels.reshape({n}), config.padded_vocab_size(), *tp);
    if (!loss_mask.defined()) return mean(per_token);
    const Tensor mask = loss_mask.reshape({n}).to(DType::F32);
    return div(sum(mul(per_token, mask)), sum(mask));
  }
  return context.ops->linear_cross_entropy(hidden.reshape({n, config.hidden_size}), weight, labels.reshape({n}),
                                           loss_mask.defined() ? loss_mask.reshape({n}) : Tensor());
}

Tensor context_parallel_token_loss(const std::function<Tensor(const Tensor& mask)>& mean_loss, const Tensor& labels,
                                   const Tensor& loss_mask, const dist::Communicator& cp) {
  const double count =
      loss_mask.defined() ? sum(loss_mask.detach().to(DType::F32)).item() : static_cast<double>(labels.numel());
  const double total = cp.all_reduce_value(count);
  // Nothing of this rank's counts: a zero that keeps the graph (its gradients zero).
  if (count == 0 && total > 0) return mul(mean_loss(Tensor()), 0.0);
  const Tensor mean_here = mean_loss(loss_mask);
  return total > 0 ? mul(mean_here, static_cast<double>(cp.size()) * count / total)
                   : mean_here;  // 0 / 0: NaN, as one process
}

const RopeTable& context_parallel_rope(const RopeTable& whole, std::int64_t seq, int cp_size, int cp_rank,
                                       RopeTable& cached) {
  const std::int64_t local = seq / cp_size;
  const Device device = whole.cos.device();
  if (cached.cos.defined() && cached.cos.size(0) == local && cached.cos.device() == device) return cached;
  NoGradGuard no_grad;
  const std::vector<std::int64_t> ids = context_parallel_positions(seq, cp_size, cp_rank);
  const Tensor rows = Tensor::from_vector(ids, {local}, device);
  cached = {kiln::embedding(whole.cos, rows), kiln::embedding(whole.sin, rows)};
  return cached;
}

}  // namespace kiln::models
