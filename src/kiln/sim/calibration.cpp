#include "kiln/sim/calibration.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "kiln/io/atomic_file.h"
#include "kiln/runtime/error.h"

namespace kiln::sim {

using json = nlohmann::json;

namespace {

double attention_flops(double b, double h, double sq, double skv, double d) {
  // QK^T and PV, causal: half of the square (the query block sees keys up to itself).
  const double pairs = sq * skv - (sq == skv ? sq * (sq - 1) / 2 : 0);
  return 4 * b * h * pairs * d;
}

Precision parse_precision(const std::string& s, const std::string& where) {
  if (s == "fp32") return Precision::FP32;
  if (s == "bf16") return Precision::BF16;
  if (s == "fp8") return Precision::FP8;
  KILN_FAIL("{}: unknown precision '{}' (fp32, bf16, fp8)", where, s);
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
    const double bytes =
        (static_cast<double>(m) * static_cast<double>(k) + static_cast<double>(k) * n + static_cast<double>(m) * n) *
        (p == Precision::FP32 ? 4 : 2);
    return std::max(flops / peak_flops, memory_bandwidth > 0 ? bytes / memory_bandwidth : 0.0);
  }
  const double rate =
      2.0 * static_cast<double>(best->m) * static_cast<double>(best->n) * static_cast<double>(best->k) / best->seconds;
  return flops / rate;
}

std::pair<double, double> CalibrationTable::attention_seconds(std::int64_t batch, std::int64_t heads,
                                                              std::int64_t seq_q, std::int64_t seq_kv,
                                                              std::int64_t head_dim, Precision p, double peak_flops,
                                                              bool dropout) const {
  const double flops =
      attention_flops(static_cast<double>(batch), static_cast<double>(heads), static_cast<double>(seq_q),
                      static_cast<double>(seq_kv), static_cast<double>(head_dim));
  const bool have_dropout_samples = std::any_of(
      attention.begin(), attention.end(), [&](const AttentionSample& s) { return s.precision == p && s.dropout; });
  const bool want_dropout = dropout && have_dropout_samples;
  auto usable = [&](const AttentionSample& s) { return s.precision == p && s.dropout == want_dropout; };
  // The samples of the nearest head size (a kernel's tiles are shaped by it).
  double best_dim = std::numeric_limits<double>::infinity();
  for (const auto& s : attention)
    if (usable(s))
      best_dim =
          std::min(best_dim, std::abs(std::log(static_cast<double>(head_dim) / static_cast<double>(s.head_dim))));
  struct Point {
    double flops, forward_rate, backward_rate;
  };
  std::vector<Point> points;
  for (const auto& s : attention) {
    if (!usable(s) || std::abs(std::log(static_cast<double>(head_dim) / static_cast<double>(s.head_dim))) > best_dim)
      continue;
    const double f =
        attention_flops(static_cast<double>(s.batch), static_cast<double>(s.heads), static_cast<double>(s.seq),
                        static_cast<double>(s.seq), static_cast<double>(s.head_dim));
    points.push_back({f, f / s.forward_seconds, f / s.backward_seconds});
  }
  if (points.empty()) {
    // Flash attention reaches about half the GEMM peak forward; its backward does 2.5x the work.
    const double fwd = flops / (0.5 * peak_flops);
    return {fwd, 2.5 * fwd};
  }
  // The rate (FLOP/s) as a function of the work: a flash kernel's rate rises with how many tiles it
  // spreads over the device and how long each tile's loop over the keys is, both set by the work.
  // Between two samples the rate is interpolated in log(work) (the nearest sample's rate alone jumped
  // between samples 16x apart, 3x in rate on the H200, at whichever sample was nearer); below the
  // smallest and above the largest sample its rate stands (the time scales with the work).
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.flops < b.flops; });
  // Samples of the same work (a longer sequence or a larger batch) stand as one, their rates'
  // geometric mean.
  std::vector<Point> merged;
  for (std::size_t i = 0; i < points.size();) {
    std::size_t j = i;
    double lf = 0, lb = 0;
    for (; j < points.size() && points[j].flops <= points[i].flops * 1.01; ++j) {
      lf += std::log(points[j].forward_rate);
      lb += std::log(points[j].backward_rate);
    }
    const double count = static_cast<double>(j - i);
    merged.push_back({points[i].flops, std::exp(lf / count), std::exp(lb / count)});
    i = j;
  }
  points = merged;
  auto at = [&](auto rate) {
    if (flops <= points.front().flops) return rate(points.front());
    if (flops >= points.back().flops) return rate(points.back());
    for (std::size_t i = 1; i < points.size(); ++i) {
      const Point &lo = points[i - 1], &hi = points[i];
      if (flops > hi.flops) continue;
      if (hi.flops <= lo.flops) return rate(hi);
      const double x = std::log(flops / lo.flops) / std::log(hi.flops / lo.flops);
      return std::exp((1 - x) * std::log(rate(lo)) + x * std::log(rate(hi)));
    }
    return rate(points.back());
  };
  return {flops / at([](const Point& q) { return q.forward_rate; }),
          flops / at([](const Point& q) { return q.backward_rate; })};
}

std::optional<std::pair<double, double>> CalibrationTable::unfused_attention_seconds(
    std::int64_t batch, std::int64_t heads, std::int64_t seq_q, std::int64_t seq_kv, std::int64_t head_dim, Precision p,
    bool dropout) const {
  // Its time is the traffic over the scores (casts, mask, softmax, dropout, the batched GEMMs'
  // outputs): proportional to B x H x T x S, scaled from the sample of the nearest sequence and head
  // size, and of those the nearest in score elements. The sequence first: the cost per score element
  // falls as the rows lengthen (each row of S scores also pays its share of the q, k, v and output
  // copies, T x D, and the softmax's per-row work): on the H100 on 2026-12-07 a score cost 14% more at
  // T 1024 than at T 2048 (39 against 34 ps, bf16), and a 1024-token layer scaled from the 2048 sample
  // with as many score elements came out 12-13% fast (configurations 1 and 3 of docs/simulate.md).
  const double scores = static_cast<double>(batch) * static_cast<double>(heads) * static_cast<double>(seq_q) *
                        static_cast<double>(seq_kv);
  const UnfusedAttentionSample* best = nullptr;
  std::pair<double, double> best_distance{std::numeric_limits<double>::infinity(), 0.0};
  for (const auto& s : unfused_attention) {
    if (s.precision != p || s.dropout != dropout) continue;
    const double sample = static_cast<double>(s.batch) * static_cast<double>(s.heads) * static_cast<double>(s.seq) *
                          static_cast<double>(s.seq);
    const std::pair<double, double> dist{
        std::abs(std::log(static_cast<double>(seq_kv) / static_cast<double>(s.seq))) +
            std::abs(std::log(static_cast<double>(head_dim) / static_cast<double>(s.head_dim))),
        std::abs(std::log(scores / sample))};
    if (dist < best_distance) {
      best_distance = dist;
      best = &s;
    }
  }
  if (!best) return std::nullopt;
  const double sample = static_cast<double>(best->batch) * static_cast<double>(best->heads) *
                        static_cast<double>(best->seq) * static_cast<double>(best->seq);
  return std::pair{best->forward_seconds * scores / sample, best->backward_seconds * scores / sample};
}

namespace {

// Of the samples that `usable` accepts, the one nearest to an m x n x k product (squared log ratios
// of each dimension), and the product's FLOPs over the sample's; {nullptr, 0} when none is usable.
template <class Sample, class Usable>
std::pair<const Sample*, double> nearest_product(const std::vector<Sample>& samples, std::int64_t m, std::int64_t n,
                                                 std::int64_t k, Usable usable) {
  const Sample* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  for (const auto& s : samples) {
    if (!usable(s)) continue;
    const double dist = std::pow(std::log(static_cast<double>(m) / static_cast<double>(s.m)), 2) +
                        std::pow(std::log(static_cast<double>(n) / static_cast<double>(s.n)), 2) +
                        std::pow(std::log(static_cast<double>(k) / static_cast<double>(s.k)), 2);
    if (dist < best_distance) {
      best_distance = dist;
      best = &s;
    }
  }
  if (!best) return {nullptr, 0.0};
  return {best, static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) /
                    (static_cast<double>(best->m) * static_cast<double>(best->n) * static_cast<double>(best->k))};
}

}  // namespace

const char* to_string(OpKind kind) {
  switch (kind) {
    case OpKind::LayerNorm: return "layer_norm";
    case OpKind::LayerNormResidual: return "layer_norm_residual";
    case OpKind::RmsNorm: return "rms_norm";
    case OpKind::RmsNormResidual: return "rms_norm_residual";
    case OpKind::Add: return "add";
    case OpKind::BiasGrad: return "bias_grad";
    case OpKind::BiasAdd: return "bias_add";
    case OpKind::Rope: return "rope";
    case OpKind::Swiglu: return "swiglu";
    case OpKind::Gelu: return "gelu";
    case OpKind::Dropout: return "dropout";
    case OpKind::Copy: return "copy";
    case OpKind::Accumulate: return "accumulate";
  }
  return "?";
}

namespace {

std::optional<OpKind> parse_op_kind(const std::string& s) {
  for (int k = 0; k < kOpKinds; ++k)
    if (s == to_string(static_cast<OpKind>(k))) return static_cast<OpKind>(k);
  return std::nullopt;
}

}  // namespace

OpCost fit_op_cost(const std::vector<std::pair<double, double>>& points) {
  // Weighted least squares of seconds = a + b x with weights 1 / seconds^2.
  double sw = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : points) {
    if (y <= 0) continue;
    const double w = 1.0 / (y * y);
    sw += w;
    sx += w * x;
    sy += w * y;
    sxx += w * x * x;
    sxy += w * x * y;
  }
  OpCost c;
  if (sw == 0) return c;
  const double det = sw * sxx - sx * sx;
  if (std::abs(det) <= 1e-30 * sw * sxx) {  // one size: all of it per element
    c.per_element = sx > 0 ? sy / sx : 0;
    return c;
  }
  c.per_element = (sw * sxy - sx * sy) / det;
  c.fixed = (sy - c.per_element * sx) / sw;
  if (c.per_element < 0) {  // flat: a fixed cost only
    c.per_element = 0;
    c.fixed = sy / sw;
  } else if (c.fixed < 0) {  // through the origin
    c.fixed = 0;
    c.per_element = sxy / sxx;
  }
  return c;
}

const OpSample* CalibrationTable::op(OpKind kind, Precision p) const {
  for (const auto& s : ops)
    if (s.kind == kind && s.precision == p) return &s;
  return nullptr;
}

bool CalibrationTable::has_ops(Precision p) const {
  for (int k = 0; k < kOpKinds; ++k)
    if (!op(static_cast<OpKind>(k), p)) return false;
  return true;
}

std::optional<std::pair<double, double>> CalibrationTable::gelu_mlp_seconds(std::int64_t m, std::int64_t f,
                                                                            std::int64_t h, Precision p) const {
  const GeluMlpSample* best = nullptr;
  double best_distance = std::numeric_limits<double>::infinity();
  auto ld = [](std::int64_t a, std::int64_t b) {
    return std::pow(std::log(static_cast<double>(a) / static_cast<double>(b)), 2);
  };
  for (const auto& s : gelu_mlp) {
    if (s.precision != p) continue;
    const double dist = ld(m, s.m) + ld(f, s.f) + ld(h, s.h);
    if (dist < best_distance) {
      best_distance = dist;
      best = &s;
    }
  }
  if (!best) return std::nullopt;
  const double ratio = static_cast<double>(m) * static_cast<double>(f) * static_cast<double>(h) /
                       (static_cast<double>(best->m) * static_cast<double>(best->f) * static_cast<double>(best->h));
  return std::pair{best->forward_seconds * ratio, best->backward_seconds * ratio};
}

const Fp8MemorySample* CalibrationTable::fp8_memory_of(te::Fp8ScalingRecipe recipe) const {
  for (const auto& s : fp8_memory)
    if (s.recipe == recipe) return &s;
  return nullptr;
}

std::optional<double> CalibrationTable::fp8_linear_seconds(std::int64_t m, std::int64_t n, std::int64_t k,
                                                           te::Fp8ScalingRecipe recipe) const {
  const auto [best, ratio] =
      nearest_product(fp8_linear, m, n, k, [&](const Fp8LinearSample& s) { return s.recipe == recipe; });
  if (!best) return std::nullopt;
  // The calls' fixed cost (the casts' and scaling state's small kernels, the GEMMs' tails) does not
  // scale with the product: a layer of half the rows of its sample is not half as long.
  return fp8_linear_fixed_seconds(recipe, best->seconds) * (1 - ratio) + best->seconds * ratio;
}

double CalibrationTable::fp8_linear_fixed_seconds(te::Fp8ScalingRecipe recipe, double at_most) const {
  // Where two samples of the recipe differ only in their rows, the intercept of the line through
  // them: the fixed part as training meets it, kernels queued back to back on a busy GPU. Otherwise
  // the call sample (16 x 128 x 128), whose time on an idle GPU is the calls' launch latency and
  // host work as much as their kernels: on the H100 on 2026-12-07 it was 62 us for tensorwise,
  // against 29 us from the 4096- and 8192-row samples of 1024 x 1024, and took the tensorwise
  // layers of configuration 19 (4096 rows, scaled from 8192-row samples) 6% long.
  const Fp8LinearSample* lo = nullptr;
  const Fp8LinearSample* hi = nullptr;
  for (const auto& a : fp8_linear)
    for (const auto& b : fp8_linear)
      if (a.recipe == recipe && b.recipe == recipe && a.n == b.n && a.k == b.k && a.m < b.m && !lo) {
        lo = &a;
        hi = &b;
      }
  double fixed = -1;
  if (lo) {
    const double per_row = (hi->seconds - lo->seconds) / static_cast<double>(hi->m - lo->m);
    fixed = lo->seconds - per_row * static_cast<double>(lo->m);
  } else {
    for (const auto& c : fp8_linear_call)
      if (c.recipe == recipe) fixed = c.seconds;
  }
  return std::clamp(fixed, 0.0, at_most);
}

std::optional<std::pair<double, double>> CalibrationTable::linear_seconds(std::int64_t m, std::int64_t n,
                                                                          std::int64_t k, Precision p) const {
  // A linear layer's FLOP rate rises with its shape until the tensor cores are saturated, so the
  // nearest sample's rate alone misjudges shapes between samples (on the H200 table of 2026-12-03 a
  // hidden-1024 layer took the rate of the 768 x 768 projection, 183 TFLOP/s, and 24-layer models
  // came out 23-34% slow). The rate is interpolated instead: the samples' forward and backward
  // FLOP rates weighted by the inverse square of their squared distance in log-shape space (an
  // exact match is that sample); no constant is fitted.
  // A GEMM's rate does not fall when any of its dimensions grows (more tiles to fill the device,
  // longer loops over k per tile): the interpolated rate is kept at or above the fastest sample
  // the shape contains in every dimension and at or below the slowest sample that contains it, so a
  // near sample of a smaller shape (768 x 768 beside 1024 x 1024) cannot pull it below what a
  // smaller product already reached.
  double wsum = 0, fwd_rate = 0, bwd_rate = 0;
  double fwd_low = 0, bwd_low = 0;
  double fwd_high = std::numeric_limits<double>::infinity(), bwd_high = fwd_high;
  const double flops = 2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k);
  for (const auto& s : linear) {
    if (s.precision != p) continue;
    const double sample_flops = 2.0 * static_cast<double>(s.m) * static_cast<double>(s.n) * static_cast<double>(s.k);
    const double dist = std::pow(std::log(static_cast<double>(m) / static_cast<double>(s.m)), 2) +
                        std::pow(std::log(static_cast<double>(n) / static_cast<double>(s.n)), 2) +
                        std::pow(std::log(static_cast<double>(k) / static_cast<double>(s.k)), 2);
    if (dist < 1e-12)
      return std::pair{s.forward_seconds * flops / sample_flops, s.backward_seconds * flops / sample_flops};
    const double f = sample_flops / s.forward_seconds, b = 2.0 * sample_flops / s.backward_seconds;
    if (s.m <= m && s.n <= n && s.k <= k) {
      fwd_low = std::max(fwd_low, f);
      bwd_low = std::max(bwd_low, b);
    }
    if (s.m >= m && s.n >= n && s.k >= k) {
      fwd_high = std::min(fwd_high, f);
      bwd_high = std::min(bwd_high, b);
    }
    const double w = 1.0 / (dist * dist);
    wsum += w;
    fwd_rate += w * f;
    bwd_rate += w * b;
  }
  if (wsum == 0) return std::nullopt;
  // (Bounds that cross, from samples that are not monotone themselves, leave the interpolation be.)
  auto bounded = [](double r, double low, double high) { return low <= high ? std::clamp(r, low, high) : r; };
  return std::pair{flops / bounded(fwd_rate / wsum, fwd_low, fwd_high),
                   2.0 * flops / bounded(bwd_rate / wsum, bwd_low, bwd_high)};
}

double reference_bytes_per_element(KernelKind kind) {
  // f32 bytes per element of the op calibrate() times, forward and backward, as Kiln's kernels move
  // them (the harness around it, the sum and x's gradient accumulation, is measured apart):
  switch (kind) {
    case KernelKind::Copy: return 12 + 12;       // add(x, x); x's two gradients summed
    case KernelKind::Norm: return 8 + 12 + 8;    // y; dx from dy, x; dw, db reread dy, x
    case KernelKind::Activation: return 8 + 12;  // y; dx from dy, x
    case KernelKind::Dropout: return 24 + 20;    // mask, x * mask, * scale; g * mask, * scale
    case KernelKind::Softmax: return 8 + 12;     // y; dx from dy, y
    case KernelKind::Strided: return 12 + 12;    // as Copy (not timed on its own: kernel_bandwidth)
  }
  return 24;
}

double CalibrationTable::kernel_bandwidth(KernelKind kind) const {
  if (kind == KernelKind::Strided) {
    // The Copy op sample reads and writes each element of a strided [B, T, H, D] view once: its
    // per-element cost is the strided kernels' rate (on the H100 on 2026-12-07, 5 ps a bf16 element,
    // 0.8 TB/s, against about 2.8 TB/s for the contiguous kernels).
    for (Precision p : {Precision::BF16, Precision::FP32})
      if (const OpSample* s = op(OpKind::Copy, p); s && s->forward.per_element > 0)
        return (p == Precision::BF16 ? 4.0 : 8.0) / s->forward.per_element;
    return kernel_bandwidth(KernelKind::Copy);
  }
  // Per-element costs measured on too few elements (format-1 GPU tables) time the launch, not the
  // kernel: memory_bandwidth stands in for them.
  const bool trusted = elementwise_elements > 0 || device.rfind("cpu", 0) == 0;
  double per_element = 0;
  if (trusted) {
    switch (kind) {
      case KernelKind::Copy: per_element = elementwise.add; break;
      case KernelKind::Norm: per_element = elementwise.norm; break;
      case KernelKind::Activation: per_element = elementwise.activation; break;
      case KernelKind::Dropout: per_element = elementwise.dropout; break;
      case KernelKind::Softmax: per_element = elementwise.softmax; break;
      case KernelKind::Strided: break;
    }
  }
  if (per_element > 0)
    return reference_bytes_per_element(kind) / std::max(per_element - elementwise.harness, 0.1 * per_element);
  return memory_bandwidth;
}

void save_calibration(const CalibrationTable& table, const std::filesystem::path& path) {
  json j;
  j["device"] = table.device;
  j["timing"] = "amortized";
  j["elementwise_elements"] = table.elementwise_elements;
  if (table.linear_backward_direct) j["linear_backward"] = "gemms";
  if (table.fp8_weight_cached) j["fp8_weight_cache"] = true;
  if (table.fp8_linear_direct) j["fp8_linear_timing"] = "training";
  j["memory_bandwidth"] = table.memory_bandwidth;
  j["op_overhead"] = table.op_overhead;
  const auto& e = table.elementwise;
  j["elementwise_seconds_per_element"] = {{"norm", e.norm},       {"activation", e.activation},
                                          {"dropout", e.dropout}, {"softmax", e.softmax},
                                          {"add", e.add},         {"harness", e.harness}};
  j["gemm"] = json::array();
  for (const auto& g : table.gemms)
    j["gemm"].push_back({{"m", g.m},
                         {"n", g.n},
                         {"k", g.k},
                         {"precision", std::string(to_string(g.precision))},
                         {"seconds", g.seconds}});
  j["attention"] = json::array();
  for (const auto& a : table.attention)
    j["attention"].push_back({{"batch", a.batch},
                              {"heads", a.heads},
                              {"seq", a.seq},
                              {"head_dim", a.head_dim},
                              {"precision", std::string(to_string(a.precision))},
                              {"forward_seconds", a.forward_seconds},
                              {"backward_seconds", a.backward_seconds},
                              {"dropout", a.dropout}});
  j["unfused_attention"] = json::array();
  for (const auto& a : table.unfused_attention)
    j["unfused_attention"].push_back({{"batch", a.batch},
                                      {"heads", a.heads},
                                      {"seq", a.seq},
                                      {"head_dim", a.head_dim},
                                      {"precision", std::string(to_string(a.precision))},
                                      {"dropout", a.dropout},
                                      {"forward_seconds", a.forward_seconds},
                                      {"backward_seconds", a.backward_seconds}});
  for (const auto& [key, samples] :
       {std::pair{"fp8_linear", &table.fp8_linear}, std::pair{"fp8_linear_call", &table.fp8_linear_call}}) {
    j[key] = json::array();
    for (const auto& f : *samples)
      j[key].push_back({{"m", f.m},
                        {"n", f.n},
                        {"k", f.k},
                        {"recipe", std::string(te::to_string(f.recipe))},
                        {"seconds", f.seconds}});
  }
  j["linear"] = json::array();
  for (const auto& a : table.linear)
    j["linear"].push_back({{"m", a.m},
                           {"n", a.n},
                           {"k", a.k},
                           {"precision", std::string(to_string(a.precision))},
                           {"forward_seconds", a.forward_seconds},
                           {"backward_seconds", a.backward_seconds}});
  j["ops"] = json::array();
  for (const auto& o : table.ops)
    j["ops"].push_back({{"op", to_string(o.kind)},
                        {"precision", std::string(to_string(o.precision))},
                        {"forward_fixed", o.forward.fixed},
                        {"forward_per_element", o.forward.per_element},
                        {"backward_fixed", o.backward.fixed},
                        {"backward_per_element", o.backward.per_element},
                        {"points", o.points}});
  j["gelu_mlp"] = json::array();
  for (const auto& g : table.gelu_mlp)
    j["gelu_mlp"].push_back({{"m", g.m},
                             {"f", g.f},
                             {"h", g.h},
                             {"precision", std::string(to_string(g.precision))},
                             {"forward_seconds", g.forward_seconds},
                             {"backward_seconds", g.backward_seconds}});
  j["fp8_memory"] = json::array();
  for (const auto& f : table.fp8_memory)
    j["fp8_memory"].push_back({{"recipe", std::string(te::to_string(f.recipe))},
                               {"saved_bytes_per_input", f.saved_bytes_per_input},
                               {"cache_bytes_per_weight", f.cache_bytes_per_weight}});
  io::AtomicFile out(path);
  out.write(j.dump(1) + "\n");
  out.commit();
}

namespace {

// The samples timed through autograd, as `sum(op(inputs)).backward()` less the forward, include
// the harness around the op's backward: the sum over the output, its gradient filled into the
// output's shape, and from the second call on each input's gradient accumulated into its .grad
// (read both, write one). Training runs none of it (a layer's input gradient flows on to the
// layer below; its weight gradients accumulate into the fp32 buffers, which the simulator counts
// apart): the harness's traffic at the table's bandwidth comes off each such backward (at most
// half of it). The attention samples are timed so in every table; linear layers until the table
// says "linear_backward": "gemms" (their GEMMs timed directly); FP8 linear layers until it says
// "fp8_linear_timing": "training" (timed as training runs them, since 2026-12-07),
// and, until "fp8_weight_cache" is set, with their weight cast on every call (4 bytes moved per
// weight: a bf16 read, the rowwise and the columnwise FP8 casts), which training makes once per
// optimizer step (te/fp8_weight_cache.h; the simulator counts it there).
void remove_harness(CalibrationTable& t) {
  if (t.memory_bandwidth <= 0) return;
  auto less = [&](double seconds, double bytes) {
    return std::max(seconds - bytes / t.memory_bandwidth, 0.5 * seconds);
  };
  auto bytes_of = [](Precision p) { return p == Precision::FP32 ? 4.0 : 2.0; };
  auto linear_harness = [](double m, double n, double k, double e) { return (2 * m * n + 3 * m * k + 3 * n * k) * e; };
  if (!t.linear_backward_direct)
    for (auto& s : t.linear)
      s.backward_seconds = less(s.backward_seconds, linear_harness(static_cast<double>(s.m), static_cast<double>(s.n),
                                                                   static_cast<double>(s.k), bytes_of(s.precision)));
  auto attention_harness = [&](double b, double h, double seq, double d, Precision p) {
    return 11 * b * h * seq * d * bytes_of(p);  // out summed and filled; q, k, v accumulated
  };
  for (auto& s : t.attention)
    s.backward_seconds =
        less(s.backward_seconds,
             attention_harness(static_cast<double>(s.batch), static_cast<double>(s.heads), static_cast<double>(s.seq),
                               static_cast<double>(s.head_dim), s.precision));
  for (auto& s : t.unfused_attention)
    s.backward_seconds =
        less(s.backward_seconds,
             attention_harness(static_cast<double>(s.batch), static_cast<double>(s.heads), static_cast<double>(s.seq),
                               static_cast<double>(s.head_dim), s.precision));
  for (auto& s : t.fp8_linear) {
    if (t.fp8_linear_direct) break;
    const double m = static_cast<double>(s.m), n = static_cast<double>(s.n), k = static_cast<double>(s.k);
    s.seconds = less(s.seconds, linear_harness(m, n, k, 2) + (t.fp8_weight_cached ? 0 : 4 * n * k));
  }
}

}  // namespace

CalibrationTable load_calibration(const std::filesystem::path& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "--calibration: cannot read {}", path.string());
  CalibrationTable t;
  try {
    const json j = json::parse(in);
    t.device = j.at("device").get<std::string>();
    t.memory_bandwidth = j.at("memory_bandwidth").get<double>();
    t.op_overhead = j.value("op_overhead", 0.0);
    if (j.contains("elementwise_seconds_per_element")) {
      const json& e = j["elementwise_seconds_per_element"];
      t.elementwise = {e.value("norm", 0.0),    e.value("activation", 0.0), e.value("dropout", 0.0),
                       e.value("softmax", 0.0), e.value("add", 0.0),        e.value("harness", 0.0)};
    }
    for (const auto& g : j.at("gemm"))
      t.gemms.push_back({g.at("m").get<std::int64_t>(), g.at("n").get<std::int64_t>(), g.at("k").get<std::int64_t>(),
                         parse_precision(g.at("precision").get<std::string>(), path.string()),
                         g.at("seconds").get<double>()});
    t.format = j.value("timing", std::string()) == "amortized" ? 2 : 1;
    t.elementwise_elements = j.value("elementwise_elements", std::int64_t{0});
    t.linear_backward_direct = j.value("linear_backward", std::string()) == "gemms";
    t.fp8_weight_cached = j.value("fp8_weight_cache", false);
    t.fp8_linear_direct = j.value("fp8_linear_timing", std::string()) == "training";
    if (j.contains("unfused_attention"))
      for (const auto& a : j["unfused_attention"])
        t.unfused_attention.push_back({a.at("batch").get<std::int64_t>(), a.at("heads").get<std::int64_t>(),
                                       a.at("seq").get<std::int64_t>(), a.at("head_dim").get<std::int64_t>(),
                                       parse_precision(a.at("precision").get<std::string>(), path.string()),
                                       a.at("dropout").get<bool>(), a.at("forward_seconds").get<double>(),
                                       a.at("backward_seconds").get<double>()});
    if (j.contains("linear"))
      for (const auto& a : j["linear"])
        t.linear.push_back({a.at("m").get<std::int64_t>(), a.at("n").get<std::int64_t>(), a.at("k").get<std::int64_t>(),
                            parse_precision(a.at("precision").get<std::string>(), path.string()),
                            a.at("forward_seconds").get<double>(), a.at("backward_seconds").get<double>()});
    for (const auto& [key, samples] :
         {std::pair{"fp8_linear", &t.fp8_linear}, std::pair{"fp8_linear_call", &t.fp8_linear_call}}) {
      if (!j.contains(key)) continue;
      for (const auto& f : j[key])
        samples->push_back({f.at("m").get<std::int64_t>(), f.at("n").get<std::int64_t>(), f.at("k").get<std::int64_t>(),
                            te::parse_fp8_recipe(f.at("recipe").get<std::string>()), f.at("seconds").get<double>()});
    }
    if (j.contains("ops"))
      for (const auto& o : j["ops"]) {
        const auto kind = parse_op_kind(o.at("op").get<std::string>());
        if (!kind) continue;  // an op this build does not price
        OpSample sample{*kind,
                        parse_precision(o.at("precision").get<std::string>(), path.string()),
                        OpCost{o.at("forward_fixed").get<double>(), o.at("forward_per_element").get<double>()},
                        OpCost{o.at("backward_fixed").get<double>(), o.at("backward_per_element").get<double>()},
                        {}};
        if (o.contains("points")) sample.points = o["points"].get<std::vector<std::array<double, 3>>>();
        t.ops.push_back(std::move(sample));
      }
    if (j.contains("gelu_mlp"))
      for (const auto& g : j["gelu_mlp"])
        t.gelu_mlp.push_back({g.at("m").get<std::int64_t>(), g.at("f").get<std::int64_t>(),
                              g.at("h").get<std::int64_t>(),
                              parse_precision(g.at("precision").get<std::string>(), path.string()),
                              g.at("forward_seconds").get<double>(), g.at("backward_seconds").get<double>()});
    if (j.contains("fp8_memory"))
      for (const auto& f : j["fp8_memory"])
        t.fp8_memory.push_back({te::parse_fp8_recipe(f.at("recipe").get<std::string>()),
                                f.at("saved_bytes_per_input").get<double>(),
                                f.at("cache_bytes_per_weight").get<double>()});
    for (const auto& a : j.at("attention"))
      t.attention.push_back(
          {a.at("batch").get<std::int64_t>(), a.at("heads").get<std::int64_t>(), a.at("seq").get<std::int64_t>(),
           a.at("head_dim").get<std::int64_t>(), parse_precision(a.at("precision").get<std::string>(), path.string()),
           a.at("forward_seconds").get<double>(), a.at("backward_seconds").get<double>(), a.value("dropout", false)});
  } catch (const json::exception& e) {
    KILN_FAIL("--calibration: {} is not a calibration table: {}", path.string(), e.what());
  }
  for (const auto& g : t.gemms)
    KILN_CHECK(g.seconds > 0 && g.m > 0 && g.n > 0 && g.k > 0, "--calibration: {}: a GEMM sample is not positive",
               path.string());
  remove_harness(t);
  if (t.format == 1 && !t.gemms.empty()) {
    // One call per synchronisation: every sample includes the launch and synchronisation latency,
    // which training's asynchronous launches hide. The fastest GEMM (a shape with next to no work)
    // is that latency; it comes off every GEMM and attention sample (a tenth of each kept).
    t.call_latency = std::numeric_limits<double>::infinity();
    for (const auto& g : t.gemms) t.call_latency = std::min(t.call_latency, g.seconds);
    auto device_time = [&](double s) { return std::max(s - t.call_latency, 0.1 * s); };
    for (auto& g : t.gemms) g.seconds = device_time(g.seconds);
    for (auto& a : t.attention) {
      a.forward_seconds = device_time(a.forward_seconds);
      a.backward_seconds = device_time(a.backward_seconds);
    }
  }
  return t;
}

}  // namespace kiln::sim
