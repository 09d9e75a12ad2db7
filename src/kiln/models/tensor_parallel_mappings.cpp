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

// Sequence parallelism: dimension 1 of [B, T, ...]. The collectives work on flat buffers whose
// r-th block is rank r's, so the sequence is moved to the front ([T, B, ...], contiguous) around them.
Tensor sequence_first(const Tensor& x, const char* call) {
  KILN_CHECK(x.dim() >= 2, "{}: expected [B, T, ...], got {}", call, x.describe());
  return x.detach().transpose(0, 1).contiguous();
}

Tensor sequence_all_gathered(const Tensor& x, const dist::Communicator& tp) {
  NoGradGuard no_grad;
  const Tensor mine = sequence_first(x, "gather_from_sequence_parallel_region");
  Shape whole = mine.shape();
  whole[0] *= tp.size();
  Tensor out = Tensor::empty(whole, mine.dtype(), mine.device());
  dist::all_gather(tp, mine, out).wait();
  return out.transpose(0, 1).contiguous();
}

Tensor sequence_reduce_scattered(const Tensor& x, const dist::Communicator& tp) {
  NoGradGuard no_grad;
  const Tensor all = sequence_first(x, "reduce_scatter_to_sequence_parallel_region");
  KILN_CHECK(all.size(0) % tp.size() == 0,
             "reduce_scatter_to_sequence_parallel_region: the sequence ({}) of {} does not split over {} "
             "tensor-parallel ranks",
             all.size(0), x.describe(), tp.size());
  Shape part = all.shape();
  part[0] /= tp.size();
  Tensor out = Tensor::empty(part, all.dtype(), all.device());
  dist::reduce_scatter(tp, all, out, dist::ReduceOp::Sum).wait();
  return out.transpose(0, 1).contiguous();
}

Tensor sequence_own_part(const Tensor& x, const dist::Communicator& tp) {
  NoGradGuard no_grad;
  KILN_CHECK(x.dim() >= 2 && x.size(1) % tp.size() == 0,
             "scatter_to_sequence_parallel_region: the sequence (dimension 1) of {} does not split over {} "
             "tensor-parallel ranks",
             x.describe(), tp.size());
  const std::int64_t part = x.size(1) / tp.size();
  return x.detach().narrow(1, part * tp.rank(), part).contiguous();
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

Tensor gather_from_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = sequence_all_gathered(x, tp);
  if (autograd::needs_grad({x}))
    autograd::record("GatherFromSequenceParallelRegion", {x}, {&y}, [tp](const Grads& g) -> Grads {
      return {g[0].defined() ? sequence_reduce_scattered(g[0], tp) : Tensor()};
    });
  return y;
}

Tensor reduce_scatter_to_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = sequence_reduce_scattered(x, tp);
  if (autograd::needs_grad({x}))
    autograd::record("ReduceScatterToSequenceParallelRegion", {x}, {&y}, [tp](const Grads& g) -> Grads {
      return {g[0].defined() ? sequence_all_gathered(g[0], tp) : Tensor()};
    });
  return y;
}

Tensor scatter_to_sequence_parallel_region(const Tensor& x, const dist::Communicator& tp) {
  if (tp.size() == 1) return x;
  Tensor y = sequence_own_part(x, tp);
  if (autograd::needs_grad({x}))
    autograd::record("ScatterToSequenceParallelRegion", {x}, {&y}, [tp](const Grads& g) -> Grads {
      return {g[0].defined() ? sequence_all_gathered(g[0], tp) : Tensor()};
    });
  return y;
}

}  // namespace kiln::models
