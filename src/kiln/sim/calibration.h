#pragma once
// CalibrationTable: what `kiln simulate --calibrate` measured on a device, through Kiln's own ops:
// GEMM seconds by shape and precision, attention forward and backward, the bandwidth of
// memory-bound kernels. Predictions look a GEMM up by its nearest measured shape (in log space)
// and take that shape's efficiency; without a table they fall back to the roofline.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/sim/system_spec.h"

namespace kiln::sim {

struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0;
  Precision precision = Precision::FP32;
  double seconds = 0;
};

struct AttentionSample {
  std::int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  Precision precision = Precision::FP32;
  double forward_seconds = 0, backward_seconds = 0;
};

struct CalibrationTable {
  std::string device;
  std::vector<GemmSample> gemms;
  std::vector<AttentionSample> attention;
  double memory_bandwidth = 0;  // bytes/s of an elementwise kernel (read two, write one)
  // Seconds one small recorded op costs beyond its arithmetic (dispatch, autograd recording, a
  // kernel launch or the CPU thread pool's fork and join): what dominates tiny models.
  double op_overhead = 0;
  // Seconds per element of the memory-bound kernels the layers run, forward and backward together
  // (0: not measured; the bandwidth model stands in).
  struct Elementwise {
    double norm = 0, activation = 0, dropout = 0, softmax = 0, add = 0;
  } elementwise;
  bool empty() const { return gemms.empty(); }
  // Seconds of an m x k by k x n GEMM: the nearest sample's FLOP/s; roofline if none.
  double gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, Precision p, double peak_flops) const;
  // Seconds of causal attention (forward, backward), scaled from the nearest sample by FLOPs.
  std::pair<double, double> attention_seconds(std::int64_t batch, std::int64_t heads, std::int64_t seq_q,
                                              std::int64_t seq_kv, std::int64_t head_dim, Precision p,
                                              double peak_flops) const;
};

struct CalibrateOptions {
  Device device = Device::cpu();
  bool quick = false;  // fewer and smaller shapes (tests)
  std::vector<Precision> precisions = {Precision::FP32};
};

// Runs the measurements (a few seconds on the CPU with quick).
CalibrationTable calibrate(const CalibrateOptions& options);
// Written atomically (io/atomic_file); read back with names in messages.
void save_calibration(const CalibrationTable& table, const std::filesystem::path& path);
CalibrationTable load_calibration(const std::filesystem::path& path);

}  // namespace kiln::sim
