#include "kiln/models/tensor_parallel_mappings.h"

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

using autograd::Grads;

// The sum of `x` over the group, in a new tensor.
Tensor all_reduced(const Tensor& x, const dist::Communicator& tp) {
  NoGradGuard no_grad;
  Tensor y = x.detach().contiguous().clone();
  dist::all_reduce(tp, y, dist::ReduceOp::Sum).wait();
  return y;
}

// Every rank's `x` side by side along the last dimension, rank order.
Tensor all_gathered(const Tensor& x, const dist::Communicator& tp) {
  NoGradGuard no_grad;
  const Tensor mine = x.detach().contiguous();
  std::vector<Tensor> parts;
  for (int r = 0; r < tp.size(); ++r) parts.push_back(Tensor::empty(mine.shape(), mine.dtype(), mine.device()));
  dist::all_gather(tp, mine, parts, Stream::current(mine.device())).wait();
  return cat(parts, mine.dim() - 1);
}

// This rank's slice of the last dimension.
Tensor own_part(const Tensor& x, const dist::Communicator& tp, const char* call) {
  NoGradGuard no_grad;
  const std::int64_t last = x.dim() - 1, n = x.size(last);
  KILN_CHECK(n % tp.size() == 0, "{}: the last dimension ({}) of {} does not split over {} tensor-parallel ranks", call,
             n, x.describe(), tp.size());
  const std::int64_t part = n / tp.size();
  return x.detach().narrow(last, part * tp.rank(), part).contiguous();
}

}  // namespace

Tensor copy_to_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = x.detach();
  if (autograd::needs_grad({x}))
    autograd::record("CopyToTensorParallelRegion", {x}, {&y},
                     [tp](const Grads& g) -> Grads { return {g[0].defined() ? all_reduced(g[0], tp) : Tensor()}; });
  return y;
}

Tensor reduce_from_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = all_reduced(x, tp);
  if (autograd::needs_grad({x}))
    autograd::record("ReduceFromTensorParallelRegion", {x}, {&y}, [](const Grads& g) -> Grads { return {g[0]}; });
  return y;
}

Tensor gather_from_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = all_gathered(x, tp);
  if (autograd::needs_grad({x}))
    autograd::record("GatherFromTensorParallelRegion", {x}, {&y}, [tp](const Grads& g) -> Grads {
      return {g[0].defined() ? own_part(g[0], tp, "gather_from_tensor_parallel_region backward") : Tensor()};
    });
  return y;
}

Tensor scatter_to_tensor_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = own_part(x, tp, "scatter_to_tensor_parallel_region");
  if (autograd::needs_grad({x}))
    autograd::record("ScatterToTensorParallelRegion", {x}, {&y},
                     [tp](const Grads& g) -> Grads { return {g[0].defined() ? all_gathered(g[0], tp) : Tensor()}; });
  return y;
}

}  // namespace kiln::models
