#include "kiln/hpc/hpcg/peers.h"

#include <fmt/format.h>

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

std::string describe(const SpmvPeerResult& r) {
  return fmt::format(
      "cuSPARSE CSR SpMV peer: {} rows, {} nonzeros, median of {} calls {:.3f} ms: {:.1f} GFLOP/s, {:.1f} GB/s "
      "(copy bandwidth in this run {:.1f} GB/s, {:.1f}% of it); max |y_cusparse - y_kiln| = {:.2e}\n",
      r.rows, r.nonzeros, r.repetitions, r.seconds_per_call * 1e3, r.gflops, r.bandwidth / 1e9, r.copy_bandwidth / 1e9,
      r.copy_bandwidth > 0 ? 100.0 * r.bandwidth / r.copy_bandwidth : 0.0, r.max_difference);
}

#if !KILN_WITH_CUDA
SpmvPeerResult run_cusparse_spmv_peer(int, int, int, int) {
  KILN_FAIL("hpcg: the cuSPARSE peer needs a CUDA build (configure with KILN_CUDA=ON)");
}
#endif

}  // namespace kiln::hpcg
