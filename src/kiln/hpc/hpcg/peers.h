#pragma once
// Peers run in the same process on the same matrix, so kiln hpcg's figures have a reference point:
// cuSPARSE's CSR SpMV on the fine-level 27-point matrix, and the device's copy bandwidth.
#include <cstdint>
#include <string>

namespace kiln::hpcg {

struct SpmvPeerResult {
  std::int64_t rows = 0, nonzeros = 0;
  int repetitions = 0;
  double seconds_per_call = 0;  // median
  double gflops = 0;            // 2 nnz / time
  double bandwidth = 0;  // bytes/s by the SpMV model: 12 B per nonzero (CSR value + column) + 4 B row pointer + x + y
  double copy_bandwidth = 0;  // device-to-device copy in the same run, bytes read + written per second
  double max_difference = 0;  // |y_cusparse - y_kiln| max over rows, Kiln's SpMV on the same x
};

// Builds the single-process nx x ny x nz reference matrix in CSR on device `device_index`, checks
// cuSPARSE's y = Ax against Kiln's SpMV and times it.
SpmvPeerResult run_cusparse_spmv_peer(int nx, int ny, int nz, int device_index);
std::string describe(const SpmvPeerResult& result);

}  // namespace kiln::hpcg
