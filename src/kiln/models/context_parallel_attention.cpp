#include "kiln/models/context_parallel_attention.h"

#include <array>
#include <cmath>
#include <limits>
#include <optional>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/models/transformer_attention.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/stream.h"
#include "kiln/te/attention.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

using autograd::Grads;
using autograd::SavedTensor;

constexpr const char* kRing = "ring_attention";

// The ring's neighbours: this rank sends to the next and receives from the previous.
struct Ring {
  const dist::Communicator& group;
  int size, rank, next, prev;
  explicit Ring(const dist::Communicator& cp)
      : group(cp),
        size(cp.size()),
        rank(cp.rank()),
        next((cp.rank() + 1) % cp.size()),
        prev((cp.rank() + cp.size() - 1) % cp.size()) {}
  // The rank whose keys and values this one holds at step i.
  int source(int step) const { return (rank - step + size) % size; }
};

// Sends `out` to the next rank and receives `in` (fresh tensors shaped as `out`) from the previous
// one, all posted at once (no ordering deadlock); the returned Work completes both.
dist::Work pass_on(const Ring& ring, const std::vector<Tensor>& out, std::vector<Tensor>& in) {
  std::vector<dist::TensorPointToPoint> ops;
  in.clear();
  for (const Tensor& t : out) {
    in.push_back(Tensor::empty(t.shape(), t.dtype(), t.device()));
    ops.push_back(dist::TensorPointToPoint::send(t, ring.next));
  }
  for (const Tensor& t : in) ops.push_back(dist::TensorPointToPoint::recv(t, ring.prev));
  return dist::batch_send_recv(ring.group, ops, Stream::current(out.front().device()));
}

// Which queries and keys one ring step's block covers (the load-balanced chunks' causal structure).
enum class Block { Diagonal, EarlierKeys, LaterKeys };
Block block_of(const Ring& ring, int step) {
  if (step == 0) return Block::Diagonal;
  return ring.source(step) < ring.rank ? Block::EarlierKeys : Block::LaterKeys;
}

te::AttentionOptions block_options(bool causal, double scale) {
  te::AttentionOptions o;
  o.causal = causal;
  o.softmax_scale = scale;
  return o;
}

// [B, H, T] -> [B, T, H, 1]: a per-row factor that broadcasts over an output [B, T, H, Dv].
Tensor per_row(const Tensor& lse) { return lse.transpose(1, 2).unsqueeze(3); }

// Merges a block's (out, lse) into the running (acc_out, acc_lse) rows it covers (views, written in
// place): lse = log(e^acc + e^block), out = acc_out e^(acc - lse) + out e^(block - lse).
void merge_into(Tensor acc_out, Tensor acc_lse, const Tensor& out, const Tensor& lse) {
  const Tensor m = maximum(acc_lse, lse);
  const Tensor merged = add(m, log(add(exp(sub(acc_lse, m)), exp(sub(lse, m)))));
  const Tensor o = add(mul(acc_out, exp(per_row(sub(acc_lse, merged)))),
                       mul(out.to(acc_out.dtype()), exp(per_row(sub(lse, merged)))));
  acc_out.copy_(o);
  acc_lse.copy_(merged);
}

// The forward: {out in q's dtype, lse [B, Hq, T] f32 (f64 for f64)}.
std::pair<Tensor, Tensor> ring_forward(const Tensor& q, const Tensor& k, const Tensor& v, const Ring& ring,
                                       double scale) {
  const std::int64_t half = q.size(1) / 2;
  Tensor acc_out, acc_lse;
  std::vector<Tensor> held{k, v}, incoming;
  for (int step = 0; step < ring.size; ++step) {
    // The next step's keys and values travel while this step computes.
    std::optional<dist::Work> exchange;
    if (step + 1 < ring.size) exchange.emplace(pass_on(ring, held, incoming));
    const Tensor &kb = held[0], &vb = held[1];
    switch (block_of(ring, step)) {
      case Block::Diagonal: {
        auto [o, l] = te::attention_forward(q, kb, vb, block_options(true, scale));
        acc_lse = l;
        acc_out = o.to(l.dtype());
        break;
      }
      case Block::EarlierKeys: {  // every query sees the first chunk of those keys, none of the second
        auto [o, l] =
            te::attention_forward(q, kb.narrow(1, 0, half), vb.narrow(1, 0, half), block_options(false, scale));
        merge_into(acc_out, acc_lse, o, l);
        break;
      }
      case Block::LaterKeys: {  // only the second chunk of queries sees them, all of them
        auto [o, l] = te::attention_forward(q.narrow(1, half, half), kb, vb, block_options(false, scale));
        merge_into(acc_out.narrow(1, half, half), acc_lse.narrow(2, half, half), o, l);
        break;
      }
    }
    if (exchange) {
      exchange->wait();
      held = incoming;
    }
  }
  return {acc_out.to(q.dtype()), acc_lse};
}

// The backward: {dq, dk, dv} in the inputs' dtype.
std::vector<Tensor> ring_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k, const Tensor& v,
                                  const Tensor& out, const Tensor& lse, const Ring& ring, double scale) {
  const std::int64_t half = q.size(1) / 2;
  const DType acc = lse.dtype();
  Tensor dq = Tensor::zeros(q.shape(), acc, q.device());
  // The gradient of the keys and values held, accumulated by every rank they have visited so far.
  std::vector<Tensor> dkv{Tensor::zeros(k.shape(), acc, k.device()), Tensor::zeros(v.shape(), acc, v.device())};
  std::vector<Tensor> held{k, v}, incoming, dkv_incoming;
  for (int step = 0; step < ring.size; ++step) {
    std::optional<dist::Work> exchange;
    if (step + 1 < ring.size) exchange.emplace(pass_on(ring, held, incoming));
    const Tensor &kb = held[0], &vb = held[1];
    switch (block_of(ring, step)) {
      case Block::Diagonal: {
        const auto g = te::attention_backward(grad_out, q, kb, vb, out, lse, block_options(true, scale));
        dq.add_(g[0].to(acc));
        dkv[0].add_(g[1].to(acc));
        dkv[1].add_(g[2].to(acc));
        break;
      }
      case Block::EarlierKeys: {
        const auto g = te::attention_backward(grad_out, q, kb.narrow(1, 0, half), vb.narrow(1, 0, half), out, lse,
                                              block_options(false, scale));
        dq.add_(g[0].to(acc));
        dkv[0].narrow(1, 0, half).add_(g[1].to(acc));
        dkv[1].narrow(1, 0, half).add_(g[2].to(acc));
        break;
      }
      case Block::LaterKeys: {
        const auto g =
            te::attention_backward(grad_out.narrow(1, half, half), q.narrow(1, half, half), kb, vb,
                                   out.narrow(1, half, half), lse.narrow(2, half, half), block_options(false, scale));
        dq.narrow(1, half, half).add_(g[0].to(acc));
        dkv[0].add_(g[1].to(acc));
        dkv[1].add_(g[2].to(acc));
        break;
      }
    }
    // The gradient follows its keys and values to the next rank; after the last step it reaches
    // their owner (this rank receives its own keys' and values' gradient from the previous one).
    dist::Work grads = pass_on(ring, dkv, dkv_incoming);
    if (exchange) {
      exchange->wait();
      held = incoming;
    }
    grads.wait();
    dkv = dkv_incoming;
  }
  return {dq.to(q.dtype()), dkv[0].to(k.dtype()), dkv[1].to(v.dtype())};
}

void check_ring_inputs(const Tensor& q, const Tensor& k, const Tensor& v) {
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(1) == k.size(1) && k.size(1) == v.size(1),
             "{}: expected this rank's q [B, T/C, Hq, D], k [B, T/C, Hkv, D] and v [B, T/C, Hkv, Dv], got q {}, k "
             "{}, v {}",
             kRing, q.describe(), k.describe(), v.describe());
  KILN_CHECK(q.size(1) % 2 == 0,
             "{}: this rank's {} tokens are not two equal chunks (the load-balanced layout of "
             "context_parallel_layout.h)",
             kRing, q.size(1));
}

// ---- Ulysses ---------------------------------------------------------------------------------------

// Rank order of the gathered chunks (rank j's two chunks j and 2C-1-j side by side: position 2j + h)
// against sequence order (chunk n).
std::int64_t rank_order_index(std::int64_t chunk, std::int64_t cp) {
  return chunk < cp ? 2 * chunk : 2 * (2 * cp - 1 - chunk) + 1;
}

// x [B, 2C, c, ...] in rank order -> sequence order (to_sequence) or back.
Tensor reorder_chunks(const Tensor& x, std::int64_t cp, bool to_sequence) {
  std::vector<Tensor> parts(static_cast<std::size_t>(2 * cp));
  for (std::int64_t n = 0; n < 2 * cp; ++n) {
    const std::int64_t r = rank_order_index(n, cp);
    if (to_sequence)
      parts[static_cast<std::size_t>(n)] = x.narrow(1, r, 1);
    else
      parts[static_cast<std::size_t>(r)] = x.narrow(1, n, 1);
  }
  return cat(parts, 1);
}

Tensor exchanged(const Tensor& send, const dist::Communicator& cp) {
  Tensor recv = Tensor::empty(send.shape(), send.dtype(), send.device());
  const std::vector<std::int64_t> splits(static_cast<std::size_t>(cp.size()), 1);
  dist::all_to_all(cp, send, splits, recv, splits, Stream::current(send.device())).wait();
  return recv;
}

Tensor sequence_to_heads_raw(const Tensor& x, const dist::Communicator& cp) {
  NoGradGuard no_grad;
  const std::int64_t c = cp.size(), b = x.size(0), t = x.size(1), h = x.size(2), d = x.size(3);
  KILN_CHECK(x.dim() == 4 && h % c == 0 && t % 2 == 0,
             "context_parallel_sequence_to_heads: expected [B, T/C, H, D] with H divisible by {} and two equal "
             "chunks, got {}",
             c, x.describe());
  // Row j: the head group rank j takes.
  const Tensor send = x.detach().reshape({b, t, c, h / c, d}).permute({2, 0, 1, 3, 4}).contiguous();
  const Tensor recv = exchanged(send, cp);  // row j: rank j's tokens of this rank's head group
  const Tensor rank_order = recv.permute({1, 0, 2, 3, 4}).reshape({b, 2 * c, t / 2, h / c, d});
  return reorder_chunks(rank_order, c, /*to_sequence=*/true).reshape({b, c * t, h / c, d});
}

Tensor heads_to_sequence_raw(const Tensor& y, const dist::Communicator& cp) {
  NoGradGuard no_grad;
  const std::int64_t c = cp.size(), b = y.size(0), t = y.size(1), hc = y.size(2), d = y.size(3);
  KILN_CHECK(y.dim() == 4 && t % (2 * c) == 0,
             "context_parallel_heads_to_sequence: expected [B, T, H/C, D] with T divisible by 2 x {}, got {}", c,
             y.describe());
  const Tensor rank_order = reorder_chunks(y.detach().reshape({b, 2 * c, t / (2 * c), hc, d}), c, false);
  // Row j: rank j's tokens.
  const Tensor send = rank_order.reshape({b, c, t / c, hc, d}).permute({1, 0, 2, 3, 4}).contiguous();
  const Tensor recv = exchanged(send, cp);  // row j: head group j of this rank's tokens
  return recv.permute({1, 2, 0, 3, 4}).reshape({b, t / c, c * hc, d});
}

}  // namespace

Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v, const dist::Communicator& cp,
                      double softmax_scale) {
  check_ring_inputs(q, k, v);
  const double scale = softmax_scale > 0 ? softmax_scale : 1.0 / std::sqrt(static_cast<double>(q.size(3)));
  // Device tensors travel through NCCL, whose point-to-point calls need the group's communicator
  // made first (collectively: every rank of the group runs this layer's attention together).
  if (q.device().is_cuda()) cp.use_device(q.device().index);
  const Ring ring(cp);
  const Tensor qc = q.detach().contiguous(), kc = k.detach().contiguous(), vc = v.detach().contiguous();
  std::pair<Tensor, Tensor> result;
  {
    NoGradGuard no_grad;
    result = ring_forward(qc, kc, vc, ring, scale);
  }
  Tensor out = result.first;
  if (autograd::needs_grad({q, k, v})) {
    autograd::record("RingAttentionBackward", {q, k, v}, {&out},
                     [sq = SavedTensor(qc), sk = SavedTensor(kc), sv = SavedTensor(vc), so = SavedTensor(out.detach()),
                      lse = result.second, cp, scale](const Grads& g) -> Grads {
                       if (!g[0].defined()) return {Tensor(), Tensor(), Tensor()};
                       NoGradGuard no_grad;
                       const Tensor& qs = sq.get(kRing);
                       const Tensor go = (g[0].dtype() == qs.dtype() ? g[0] : g[0].to(qs.dtype())).contiguous();
                       return ring_backward(go, qs, sk.get(kRing), sv.get(kRing), so.get(kRing), lse, Ring(cp), scale);
                     });
  }
  return out;
}

Tensor context_parallel_sequence_to_heads(const Tensor& x, const dist::Communicator& cp) {
  if (cp.size() == 1) return x;
  Tensor y = sequence_to_heads_raw(x, cp);
  if (autograd::needs_grad({x}))
    autograd::record("ContextParallelSequenceToHeads", {x}, {&y}, [cp](const Grads& g) -> Grads {
      return {g[0].defined() ? heads_to_sequence_raw(g[0], cp) : Tensor()};
    });
  return y;
}

Tensor context_parallel_heads_to_sequence(const Tensor& x, const dist::Communicator& cp) {
  if (cp.size() == 1) return x;
  Tensor y = heads_to_sequence_raw(x, cp);
  if (autograd::needs_grad({x}))
    autograd::record("ContextParallelHeadsToSequence", {x}, {&y}, [cp](const Grads& g) -> Grads {
      return {g[0].defined() ? sequence_to_heads_raw(g[0], cp) : Tensor()};
    });
  return y;
}

Tensor context_parallel_attention(CpCommType type, const CoreOps& ops, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const dist::Communicator& cp,
                                  const std::shared_ptr<nn::Dropout>& dropout, bool recompute, double softmax_scale) {
  if (type == CpCommType::P2P) {
    // The ring keeps only q, k, v, the output and the log-sum-exp: selective recompute has nothing
    // to drop. Dropout is refused with context parallelism (GptConfig::validate).
    KILN_CHECK(!(dropout && dropout->is_training() && dropout->p > 0),
               "ring attention: attention dropout is not supported with context parallelism");
    return ring_attention(q, k, v, cp, softmax_scale);
  }
  const Tensor qh = context_parallel_sequence_to_heads(q, cp);
  const Tensor kh = context_parallel_sequence_to_heads(k, cp);
  const Tensor vh = context_parallel_sequence_to_heads(v, cp);
  return context_parallel_heads_to_sequence(run_core_attention(ops, qh, kh, vh, dropout, recompute, softmax_scale), cp);
}

}  // namespace kiln::models
