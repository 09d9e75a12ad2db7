#include "kiln/models/expert_parallel_mappings.h"

#include <numeric>

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

}  // namespace kiln::models
