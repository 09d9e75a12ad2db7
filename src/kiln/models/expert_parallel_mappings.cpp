#include "kiln/models/expert_parallel_mappings.h"

#include <numeric>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/record.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

Tensor exchanged(const Tensor& x, const std::vector<std::int64_t>& send_rows,
                 const std::vector<std::int64_t>& recv_rows, const dist::Communicator& group) {
  NoGradGuard no_grad;
  const std::int64_t sent = std::accumulate(send_rows.begin(), send_rows.end(), std::int64_t{0});
  const std::int64_t received = std::accumulate(recv_rows.begin(), recv_rows.end(), std::int64_t{0});
  KILN_CHECK(x.dim() == 2 && x.size(0) == sent, "all_to_all_rows: {} rows to send, got {}", sent, x.describe());
  const Tensor in = x.detach().contiguous();
  Tensor out = Tensor::empty({received, x.size(1)}, x.dtype(), x.device());
  dist::all_to_all(group, in, send_rows, out, recv_rows, Stream::current(x.device())).wait();
  return out;
}

}  // namespace

Tensor all_to_all_rows(const Tensor& x, const std::vector<std::int64_t>& send_rows,
                       const std::vector<std::int64_t>& recv_rows, const dist::Communicator& group) {
  KILN_CHECK(static_cast<int>(send_rows.size()) == group.size() && static_cast<int>(recv_rows.size()) == group.size(),
             "all_to_all_rows: {} send and {} receive counts for a group of {} ranks", send_rows.size(),
             recv_rows.size(), group.size());
  Tensor y = exchanged(x, send_rows, recv_rows, group);
  if (autograd::needs_grad({x}))
    autograd::record("AllToAllRowsBackward", {x}, {&y},
                     [send_rows, recv_rows, group](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor()};
                       return {exchanged(g[0], recv_rows, send_rows, group)};
                     });
  return y;
}

ExpertMajorOrder expert_major_order(const std::vector<std::int64_t>& counts, int ranks, std::int64_t experts) {
  KILN_CHECK(static_cast<std::int64_t>(counts.size()) == ranks * experts,
             "expert_major_order: {} counts for {} ranks x {} experts", counts.size(), ranks, experts);
  auto count_of = [&](int p, std::int64_t e) { return counts[static_cast<std::size_t>(p * experts + e)]; };
  // Where each rank's rows start, rank-major.
  std::vector<std::int64_t> rank_start(static_cast<std::size_t>(ranks), 0);
  for (int p = 1; p < ranks; ++p)
    for (std::int64_t e = 0; e < experts; ++e) rank_start[static_cast<std::size_t>(p)] += count_of(p - 1, e);
  for (int p = 1; p < ranks; ++p)
    rank_start[static_cast<std::size_t>(p)] += rank_start[static_cast<std::size_t>(p) - 1];
  ExpertMajorOrder out;
  out.offsets.push_back(0);
  for (std::int64_t e = 0; e < experts; ++e) {
    for (int p = 0; p < ranks; ++p) {
      std::int64_t start = rank_start[static_cast<std::size_t>(p)];
      for (std::int64_t before = 0; before < e; ++before) start += count_of(p, before);
      for (std::int64_t i = 0; i < count_of(p, e); ++i) out.order.push_back(start + i);
    }
    out.offsets.push_back(static_cast<std::int64_t>(out.order.size()));
  }
  out.inverse.resize(out.order.size());
  for (std::size_t i = 0; i < out.order.size(); ++i)
    out.inverse[static_cast<std::size_t>(out.order[i])] = static_cast<std::int64_t>(i);
  return out;
}

std::vector<std::int64_t> counts_from_offsets(const std::vector<std::int64_t>& offsets) {
  KILN_CHECK(!offsets.empty(), "expert offsets: empty (they hold experts + 1 entries)");
  std::vector<std::int64_t> counts(offsets.size() - 1);
  for (std::size_t e = 0; e + 1 < offsets.size(); ++e) counts[e] = offsets[e + 1] - offsets[e];
  return counts;
}

Tensor index_tensor(const std::vector<std::int64_t>& v, Device device) {
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(device);
}

Tensor reordered(const Tensor& x, const Tensor& index) { return x.size(0) == 0 ? x : index_select(x, 0, index); }

}  // namespace kiln::models
