#include "kiln/models/tensor_parallel_overlap.h"

#include <functional>
#include <utility>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_accumulation_fusion.h"
#include "kiln/autograd/record.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/linalg.h"
#include "kiln/ops/reduce.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/stream.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

using autograd::Grads;
using autograd::SavedTensor;

// The ring's exchanges run beside the GEMMs: on a GPU a high-priority side stream (the collectives
// make it wait for the compute stream's work so far, and Work::wait() makes the compute stream wait
// for a receive); on the CPU its one stream, the MPI calls being non-blocking.
Stream exchange_stream(Device device) {
  return device.is_cuda() ? Stream::from_pool(device, StreamPriority::High) : Stream::current(device);
}

// [B, T, ..., k] -> [T * B * ..., k], contiguous and sequence first, so that the positions rank c
// holds are one block of rows (block c of tp).
Tensor sequence_first_rows(const Tensor& x, const char* call) {
  KILN_CHECK(x.dim() >= 3, "{}: expected [B, T, ..., features], got {}", call, x.describe());
  const Tensor t = x.transpose(0, 1).contiguous();
  const std::int64_t k = x.shape().back();
  return t.view({k == 0 ? 0 : t.numel() / k, k});
}

// The inverse: rows [T * B * ..., n] back to batch-first `shape` ([B, T, ..., n]).
Tensor batch_first(const Tensor& rows, Shape shape) {
  std::swap(shape[0], shape[1]);
  return rows.view(shape).transpose(0, 1).contiguous();
}

Tensor as_gemm_operand(const Tensor& rows) { return ops::contiguous_view(rows, {1, rows.size(0), rows.size(1)}); }

struct ExchangeRing {
  const dist::Communicator& group;
  int size, rank, next, prev;
  Stream stream;
  explicit ExchangeRing(const dist::Communicator& g, Device device)
      : group(g),
        size(g.size()),
        rank(g.rank()),
        next((g.rank() + 1) % g.size()),
        prev((g.rank() + g.size() - 1) % g.size()),
        stream(exchange_stream(device)) {
    if (device.is_cuda()) group.use_device(device.index);  // NCCL's point-to-point needs the communicator made
  }
  // Sends `out` to the next rank and receives `in` from the previous one.
  dist::Work exchange(const Tensor& out, const Tensor& in, int tag) const {
    const std::vector<dist::TensorPointToPoint> ops = {dist::TensorPointToPoint::send(out, next, tag),
                                                       dist::TensorPointToPoint::recv(in, prev, tag)};
    return dist::batch_send_recv(group, ops, stream);
  }
};

// All-gathers the row blocks of `full` ([size * rows, k]; block `rank` already holds this rank's
// rows) around the ring, calling on_block(c, block c) for every block once it is here: this rank's
// first, then the one received from the previous rank, ...; each call runs while the next block is
// in flight.
void ring_all_gather(const ExchangeRing& ring, const Tensor& full,
                     const std::function<void(int, const Tensor&)>& on_block) {
  const std::int64_t rows = full.size(0) / ring.size;
  auto block = [&](int c) { return full.narrow(0, c * rows, rows); };
  for (int s = 0; s < ring.size; ++s) {
    const int c = (ring.rank - s + ring.size) % ring.size;
    dist::Work arriving;
    if (s + 1 < ring.size) arriving = ring.exchange(block(c), block((c - 1 + ring.size) % ring.size), s);
    on_block(c, block(c));
    arriving.wait();
  }
}

// Reduce-scatter of row blocks: `partial(c)` is this rank's [rows, n] contribution to block c; the
// sum over the ranks of block `rank` comes back. The running sum of block c starts on rank c + 1
// and moves one rank on per step; each step's partial product is computed while the previous
// step's running sum is in flight, then added to it once it has arrived.
Tensor ring_reduce_scatter(const ExchangeRing& ring, const std::function<Tensor(int)>& partial) {
  // `outgoing` lives until its exchange has completed: on the CPU MPI reads it until then.
  Tensor outgoing, incoming;
  dist::Work arriving;
  for (int s = 0; s < ring.size; ++s) {
    const int c = (ring.rank - s - 1 + 2 * ring.size) % ring.size;
    Tensor mine = partial(c);
    if (s > 0) {
      arriving.wait();
      mine.add_(incoming);
    }
    if (s + 1 == ring.size) return mine;
    outgoing = mine;
    incoming = Tensor::empty(mine.shape(), mine.dtype(), mine.device());
    arriving = ring.exchange(outgoing, incoming, s);
  }
  KILN_FAIL("ring_reduce_scatter: a ring of {} ranks", ring.size);
}

void check_operands(const Tensor& x, const Tensor& weight, const dist::Communicator& tp, const char* call) {
  KILN_CHECK(weight.dim() == 2 && x.dim() >= 3 && x.shape().back() == weight.size(1),
             "{}: input {} does not match weight {} (expected [B, T, ..., {}])", call, x.describe(), weight.describe(),
             weight.dim() == 2 ? weight.size(1) : -1);
  KILN_CHECK(x.dtype() == weight.dtype() && x.device() == weight.device(),
             "{}: input {} and weight {} differ in dtype or device", call, x.describe(), weight.describe());
  KILN_CHECK(tp.size() > 1, "{}: needs a tensor-parallel group of two or more ranks", call);
}

// Which weight and bias gradients a backward owes, and the parameters themselves where the
// zero-bubble store may take them (leaves only, as `linear`: capturing a non-leaf would keep its graph).
struct WeightGradTargets {
  bool weight = false, bias = false;
  Tensor leaf_weight, leaf_bias;
  Shape weight_shape;
  WeightGradTargets(const Tensor& w, const Tensor& b)
      : weight(w.requires_grad()), bias(b.defined() && b.requires_grad()), weight_shape(w.shape()) {
    if ((!weight || w.is_leaf()) && (!bias || b.is_leaf())) {
      if (weight) leaf_weight = w;
      if (bias) leaf_bias = b;
    }
  }
};

// The weight (and bias) gradients of y = a W^T (+ b) from rows: dW = dy^T a, db = the column sums
// of dy; into the zero-bubble store when one is active and the parameters are leaves, as `linear`.
void weight_gradients(const Tensor& dy_rows, const Tensor& a_rows, const WeightGradTargets& t, Grads& out,
                      std::size_t weight_slot, std::size_t bias_slot) {
  if (!t.weight && !t.bias) return;
  // Undefined when the GEMM added it into the leaf's fp32 main gradient (grad_accumulation_fusion.h).
  auto weight_grad = [dy_rows, a_rows, shape = t.weight_shape, leaf = t.leaf_weight] {
    const Tensor dy = as_gemm_operand(dy_rows), a = as_gemm_operand(a_rows);
    if (autograd::add_weight_grad_into_main_grad(leaf, dy, a)) return Tensor();
    return ops::contiguous_view(ops::gemm(dy, a, true, false), shape);
  };
  auto bias_grad = [dy_rows] { return ops::reduce(ops::ReduceOp::Sum, dy_rows, {0}, false); };
  autograd::WeightGradStore* store = autograd::WeightGradStore::active();
  if (store != nullptr && (t.leaf_weight.defined() || t.leaf_bias.defined())) {
    store->defer([=, w = t.leaf_weight, b = t.leaf_bias] {
      if (w.defined()) autograd::accumulate_leaf_grad(w, weight_grad());
      if (b.defined()) autograd::accumulate_leaf_grad(b, bias_grad());
    });
    return;
  }
  if (t.weight) out[weight_slot] = weight_grad();
  if (t.bias) out[bias_slot] = bias_grad();
}

}  // namespace

Tensor sequence_parallel_column_linear_overlapped(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                                  const dist::Communicator& tp) {
  constexpr const char* call = "sequence_parallel_column_linear_overlapped";
  check_operands(x, weight, tp, call);
  const ExchangeRing ring(tp, x.device());
  Tensor gathered, y_rows;
  const std::int64_t out_features = weight.size(0);
  {
    NoGradGuard no_grad;
    const Tensor mine = sequence_first_rows(x.detach(), call);
    const std::int64_t rows = mine.size(0);
    gathered = Tensor::empty({rows * ring.size, mine.size(1)}, mine.dtype(), mine.device());
    gathered.narrow(0, ring.rank * rows, rows).copy_(mine);
    y_rows = Tensor::empty({rows * ring.size, out_features}, x.dtype(), x.device());
    const Tensor w3 = ops::contiguous_view(weight.detach(), {1, out_features, weight.size(1)});
    ring_all_gather(ring, gathered, [&](int c, const Tensor& block) {
      const Tensor out = y_rows.narrow(0, c * rows, rows);
      ops::gemm_into(as_gemm_operand(block), w3, as_gemm_operand(out), false, true, 1.0, 0.0);
    });
    if (bias.defined()) y_rows.add_(bias.detach());
  }
  Shape y_shape = x.shape();
  y_shape[1] *= ring.size;
  y_shape.back() = out_features;
  Tensor y = batch_first(y_rows, y_shape);
  if (autograd::needs_grad({x, weight, bias})) {
    autograd::record("SequenceParallelColumnLinearOverlapped", {x, weight, bias}, {&y},
                     [tp, saved_x = SavedTensor(gathered), saved_w = SavedTensor(weight.detach()),
                      targets = WeightGradTargets(weight, bias), gx = x.requires_grad(),
                      x_shape = x.shape()](const Grads& g) -> Grads {
                       Grads out(3);
                       if (!g[0].defined()) return out;
                       NoGradGuard no_grad;
                       const Tensor dy = sequence_first_rows(g[0], "SequenceParallelColumnLinearOverlapped backward");
                       const Tensor w = saved_w.get("SequenceParallelColumnLinearOverlapped");
                       const Tensor w3 = ops::contiguous_view(w, {1, w.size(0), w.size(1)});
                       const ExchangeRing ring(tp, dy.device());
                       const std::int64_t rows = dy.size(0) / ring.size;
                       // dx: this rank's positions of dy W summed over the group, the GEMMs under the ring.
                       if (gx) {
                         const Tensor dx_rows = ring_reduce_scatter(ring, [&](int c) {
                           return ops::contiguous_view(
                               ops::gemm(as_gemm_operand(dy.narrow(0, c * rows, rows)), w3, false, false),
                               {rows, w.size(1)});
                         });
                         out[0] = batch_first(dx_rows, x_shape);
                       }
                       weight_gradients(dy, saved_x.get("SequenceParallelColumnLinearOverlapped"), targets, out, 1, 2);
                       return out;
                     });
  }
  return y;
}

Tensor sequence_parallel_row_linear_overlapped(const Tensor& x, const Tensor& weight, const dist::Communicator& tp) {
  constexpr const char* call = "sequence_parallel_row_linear_overlapped";
  check_operands(x, weight, tp, call);
  const ExchangeRing ring(tp, x.device());
  KILN_CHECK(x.size(1) % ring.size == 0, "{}: the sequence (dimension 1) of {} does not split over {} ranks", call,
             x.describe(), ring.size);
  const std::int64_t out_features = weight.size(0);
  Tensor x_rows, y_rows;
  {
    NoGradGuard no_grad;
    x_rows = sequence_first_rows(x.detach(), call);
    const std::int64_t rows = x_rows.size(0) / ring.size;
    const Tensor w3 = ops::contiguous_view(weight.detach(), {1, out_features, weight.size(1)});
    y_rows = ring_reduce_scatter(ring, [&](int c) {
      return ops::contiguous_view(ops::gemm(as_gemm_operand(x_rows.narrow(0, c * rows, rows)), w3, false, true),
                                  {rows, out_features});
    });
  }
  Shape y_shape = x.shape();
  y_shape[1] /= ring.size;
  y_shape.back() = out_features;
  Tensor y = batch_first(y_rows, y_shape);
  if (autograd::needs_grad({x, weight})) {
    autograd::record("SequenceParallelRowLinearOverlapped", {x, weight}, {&y},
                     [tp, saved_x = SavedTensor(x_rows), saved_w = SavedTensor(weight.detach()),
                      targets = WeightGradTargets(weight, Tensor()), gx = x.requires_grad(),
                      x_shape = x.shape()](const Grads& g) -> Grads {
                       Grads out(2);
                       if (!g[0].defined()) return out;
                       NoGradGuard no_grad;
                       const Tensor mine = sequence_first_rows(g[0], "SequenceParallelRowLinearOverlapped backward");
                       const Tensor w = saved_w.get("SequenceParallelRowLinearOverlapped");
                       const Tensor w3 = ops::contiguous_view(w, {1, w.size(0), w.size(1)});
                       const ExchangeRing ring(tp, mine.device());
                       const std::int64_t rows = mine.size(0);
                       // dy gathered block by block; dx's rows of each block computed as it arrives.
                       Tensor dy = Tensor::empty({rows * ring.size, mine.size(1)}, mine.dtype(), mine.device());
                       dy.narrow(0, ring.rank * rows, rows).copy_(mine);
                       Tensor dx_rows;
                       if (gx) dx_rows = Tensor::empty({rows * ring.size, w.size(1)}, mine.dtype(), mine.device());
                       ring_all_gather(ring, dy, [&](int c, const Tensor& block) {
                         if (!gx) return;
                         ops::gemm_into(as_gemm_operand(block), w3, as_gemm_operand(dx_rows.narrow(0, c * rows, rows)),
                                        false, false, 1.0, 0.0);
                       });
                       if (gx) out[0] = batch_first(dx_rows, x_shape);
                       weight_gradients(dy, saved_x.get("SequenceParallelRowLinearOverlapped"), targets, out, 1, 1);
                       return out;
                     });
  }
  return y;
}

}  // namespace kiln::models
