// The measurements of `kiln simulate --calibrate`, through Kiln's own ops on the device.
#include <algorithm>
#include <chrono>
#include <optional>

#include "kiln/autograd/functions.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/runtime/backend.h"
#include "kiln/sim/calibration.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::sim {

namespace {

DType dtype_of(Precision p) { return p == Precision::FP32 ? DType::F32 : DType::BF16; }

// Median seconds of `run` over a few repetitions after one warm-up, synchronising the device.
template <class F>
double time_it(Device device, int reps, F&& run) {
  run();
  synchronize(device);
  std::vector<double> t;
  for (int i = 0; i < reps; ++i) {
    const auto start = std::chrono::steady_clock::now();
    run();
    synchronize(device);
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

CalibrationTable calibrate(const CalibrateOptions& o) {
  CalibrationTable t;
  t.device = o.device.str();
  const int reps = o.quick ? 2 : 5;
  const std::vector<std::int64_t> sizes =
      o.device.is_cpu() ? (o.quick ? std::vector<std::int64_t>{32, 128} : std::vector<std::int64_t>{64, 128, 256, 512})
                        : std::vector<std::int64_t>{256, 1024, 4096, 8192};
  for (Precision p : o.precisions) {
    if (p == Precision::FP8) continue;  // FP8 GEMMs are te/'s, measured there; the roofline stands in
    const DType dt = dtype_of(p);
    std::optional<NoGradGuard> no_grad(std::in_place);  // GEMMs only: attention records its backward
    // Square and the skinny shapes of transformer layers (tokens x hidden by hidden x 4 hidden).
    for (std::int64_t m : sizes)
      for (std::int64_t n : sizes)
        for (std::int64_t k : sizes) {
          if (o.quick && !(m == n && n == k)) continue;
          if (!(m == n || n == k || m == k)) continue;
          Tensor a = Tensor::randn({m, k}, 1, DType::F32, o.device).to(dt);
          Tensor b = Tensor::randn({k, n}, 2, DType::F32, o.device).to(dt);
          const double s = time_it(o.device, reps, [&] { (void)matmul(a, b); });
          t.gemms.push_back({m, n, k, p, s});
        }
    no_grad.reset();
    // Kiln's local attention (the layers pretrain-gpt runs here), forward and backward.
    std::vector<std::int64_t> seqs{64, 256};
    if (!o.device.is_cpu()) seqs = {1024, 4096};
    if (o.quick) seqs.resize(1);
    for (std::int64_t seq : seqs) {
      const std::int64_t b = 1, heads = 4, d = 64;
      const auto& ops = models::core_ops_for(o.device.is_cpu() ? models::TransformerImpl::Local
                                                               : models::TransformerImpl::TransformerEngine);
      models::CoreAttentionOptions ao;
      ao.causal = true;
      Tensor q = Tensor::randn({b, seq, heads, d}, 3, DType::F32, o.device).to(dt).requires_grad_(true);
      Tensor k = Tensor::randn({b, seq, heads, d}, 4, DType::F32, o.device).to(dt).requires_grad_(true);
      Tensor v = Tensor::randn({b, seq, heads, d}, 5, DType::F32, o.device).to(dt).requires_grad_(true);
      const double fwd = time_it(o.device, reps, [&] {
        NoGradGuard ng;
        (void)ops.attention(q, k, v, ao);
      });
      const double both = time_it(o.device, reps, [&] { sum(ops.attention(q, k, v, ao)).backward(); });
      t.attention.push_back({b, heads, seq, d, p, fwd, std::max(both - fwd, fwd)});
    }
  }
  {
    NoGradGuard no_grad;
    const std::int64_t n = o.quick ? (1 << 20) : (1 << 24);
    Tensor x = Tensor::randn({n}, 6, DType::F32, o.device), y = Tensor::randn({n}, 7, DType::F32, o.device);
    const double s = time_it(o.device, reps, [&] { (void)add(x, y); });
    t.memory_bandwidth = 3.0 * 4.0 * static_cast<double>(n) / s;
  }
  {
    // The layers' memory-bound kernels, forward and backward through autograd, per element.
    const std::int64_t rows = o.quick ? 256 : 2048, cols = 256;
    const double elements = static_cast<double>(rows * cols);
    Tensor x = Tensor::randn({rows, cols}, 10, DType::F32, o.device).requires_grad_(true);
    Tensor w = Tensor::ones({cols}, DType::F32, o.device).requires_grad_(true);
    Tensor b = Tensor::zeros({cols}, DType::F32, o.device).requires_grad_(true);
    auto per_element = [&](auto&& op) { return time_it(o.device, reps, [&] { sum(op()).backward(); }) / elements; };
    auto& e = t.elementwise;
    e.norm = per_element([&] { return layer_norm(x, w, b); });
    e.activation = per_element([&] { return gelu(x, true); });
    e.dropout = per_element([&] { return dropout(x, 0.1, true, 11); });
    e.softmax = per_element([&] { return softmax(x, -1); });
    e.add = per_element([&] { return add(x, x); });
  }
  {
    // A small op recorded for the backward (autograd on, as in training): its time is the overhead.
    Tensor x = Tensor::randn({64, 64}, 8, DType::F32, o.device).requires_grad_(true);
    Tensor y = Tensor::randn({64, 64}, 9, DType::F32, o.device);
    const int ops = 50;
    t.op_overhead = time_it(o.device, reps,
                            [&] {
                              Tensor z = x;
                              for (int i = 0; i < ops; ++i) z = add(z, y);
                            }) /
                    ops;
  }
  return t;
}

}  // namespace kiln::sim
