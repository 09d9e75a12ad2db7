#include "kiln/sim/calibration.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/io/atomic_file.h"
#include "kiln/models/transformer_core_ops.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::sim {

using json = nlohmann::json;

namespace {

double attention_flops(double b, double h, double sq, double skv, double d) {
  // QK^T and PV, causal: half of the square (the query block sees keys up to itself).
  const double pairs = sq * skv - (sq == skv ? sq * (sq - 1) / 2 : 0);
  return 4 * b * h * pairs * d;
}

DType dtype_of(Precision p) { return p == Precision::FP32 ? DType::F32 : DType::BF16; }

Precision parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32") return Precision::FP32;
  if (s == "bf16") return Precision::BF16;
  if (s == "fp8") return Precision::FP8;
  KILN_FAIL("{}: unknown precision '{}' (fp32, bf16, fp8)", where, s);
}

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

double CalibrationTable::gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, Precision p,
                                      double peak_flops) const {
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  const GemmSample* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  // FP8 GEMMs without FP8 samples: the bf16 ones at the FP8 peak's ratio.
  const Precision look = p;
  for (const auto& s : gemms) {
    if (s.precision != look) continue;
    const double dist = std::pow(std::log(static_cast<double>(m) / static_cast<double>(s.m)), 2) +
                        std::pow(std::log(static_cast<double>(n) / static_cast<double>(s.n)), 2) +
                        std::pow(std::log(static_cast<double>(k) / static_cast<double>(s.k)), 2);
    if (dist < best_distance) {
      best_distance = dist;
      best = &s;
    }
  }
  if (!best) {
    const double bytes = (static_cast<double>(m) * static_cast<double>(k) + static_cast<double>(k) * n +
                          static_cast<double>(m) * n) *
                         (p == Precision::FP32 ? 4 : 2);
    return std::max(flops / peak_flops, memory_bandwidth > 0 ? bytes / memory_bandwidth : 0.0);
  }
  const double rate = 2.0 * static_cast<double>(best->m) * static_cast<double>(best->n) *
                      static_cast<double>(best->k) / best->seconds;
  return flops / rate;
}

std::pair<double, double> CalibrationTable::attention_seconds(std::int64_t batch, std::int64_t heads,
                                                              std::int64_t seq_q, std::int64_t seq_kv,
                                                              std::int64_t head_dim, Precision p,
                                                              double peak_flops) const {
  const double flops = attention_flops(static_cast<double>(batch), static_cast<double>(heads),
                                       static_cast<double>(seq_q), static_cast<double>(seq_kv),
                                       static_cast<double>(head_dim));
  const AttentionSample* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  for (const auto& s : attention) {
    if (s.precision != p) continue;
    const double dist = std::abs(std::log(static_cast<double>(seq_kv) / static_cast<double>(s.seq))) +
                        std::abs(std::log(static_cast<double>(head_dim) / static_cast<double>(s.head_dim)));
    if (dist < best_distance) {
      best_distance = dist;
      best = &s;
    }
  }
  if (!best) {
    // Flash attention reaches about half the GEMM peak forward; its backward does 2.5x the work.
    const double fwd = flops / (0.5 * peak_flops);
    return {fwd, 2.5 * fwd};
  }
  const double sample_flops =
      attention_flops(static_cast<double>(best->batch), static_cast<double>(best->heads),
                      static_cast<double>(best->seq), static_cast<double>(best->seq), static_cast<double>(best->head_dim));
  return {best->forward_seconds * flops / sample_flops, best->backward_seconds * flops / sample_flops};
}

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
    NoGradGuard no_grad;
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
    // Kiln's local attention (the layers pretrain-gpt runs here), forward and backward.
    const std::vector<std::int64_t> seqs = o.device.is_cpu() ? std::vector<std::int64_t>{64, 256}
                                                              : std::vector<std::int64_t>{1024, 4096};
    for (std::int64_t seq : o.quick ? std::vector<std::int64_t>{seqs[0]} : seqs) {
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
  return t;
}

void save_calibration(const CalibrationTable& table, const std::filesystem::path& path) {
  json j;
  j["device"] = table.device;
  j["memory_bandwidth"] = table.memory_bandwidth;
  j["gemm"] = json::array();
  for (const auto& g : table.gemms)
    j["gemm"].push_back(
        {{"m", g.m}, {"n", g.n}, {"k", g.k}, {"precision", std::string(to_string(g.precision))}, {"seconds", g.seconds}});
  j["attention"] = json::array();
  for (const auto& a : table.attention)
    j["attention"].push_back({{"batch", a.batch},
                              {"heads", a.heads},
                              {"seq", a.seq},
                              {"head_dim", a.head_dim},
                              {"precision", std::string(to_string(a.precision))},
                              {"forward_seconds", a.forward_seconds},
                              {"backward_seconds", a.backward_seconds}});
  io::AtomicFile out(path);
  out.write(j.dump(1) + "\n");
  out.commit();
}

CalibrationTable load_calibration(const std::filesystem::path& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "--calibration: cannot read {}", path.string());
  CalibrationTable t;
  try {
    const json j = json::parse(in);
    t.device = j.at("device").get<std::string>();
    t.memory_bandwidth = j.at("memory_bandwidth").get<double>();
    for (const auto& g : j.at("gemm"))
      t.gemms.push_back({g.at("m").get<std::int64_t>(), g.at("n").get<std::int64_t>(), g.at("k").get<std::int64_t>(),
                         parse_precision(g.at("precision").get<std::string>(), path.string()),
                         g.at("seconds").get<double>()});
    for (const auto& a : j.at("attention"))
      t.attention.push_back({a.at("batch").get<std::int64_t>(), a.at("heads").get<std::int64_t>(),
                             a.at("seq").get<std::int64_t>(), a.at("head_dim").get<std::int64_t>(),
                             parse_precision(a.at("precision").get<std::string>(), path.string()),
                             a.at("forward_seconds").get<double>(), a.at("backward_seconds").get<double>()});
  } catch (const json::exception& e) {
    KILN_FAIL("--calibration: {} is not a calibration table: {}", path.string(), e.what());
  }
  for (const auto& g : t.gemms)
    KILN_CHECK(g.seconds > 0 && g.m > 0 && g.n > 0 && g.k > 0, "--calibration: {}: a GEMM sample is not positive",
               path.string());
  return t;
}

}  // namespace kiln::sim
