#include "harness.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <set>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/fp8_kernels.h"
#include "kiln/ops/kernel_registry.h"
#include "kiln/runtime/backend.h"
#include "kiln/te/attention.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/moe_ops.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/vision/image_augment.h"

namespace kiln::backend_ops {

namespace {

// Normalised mean squared error, sum((got - want)^2) / sum(want^2), allowed per dtype. An f32
// kernel reaches about 1e-14 against float64, so the f64 bound catches a kernel that computes
// in f32; bf16 and f16 inputs are rounded before the op, which their bounds take in.
double nmse_tolerance(DType t) {
  switch (t) {
    case DType::F64: return 1e-24;
    case DType::F32: return 1e-10;
    case DType::F16: return 1e-5;
    case DType::BF16: return 3e-4;
    default: return 0;  // integer outputs: exact
  }
}

bool case_runs(const OpCase& c, const Options& o) {
  return o.op.empty() || std::find(c.kernels.begin(), c.kernels.end(), o.op) != c.kernels.end();
}

std::vector<Tensor> to_run(const std::vector<Tensor>& in, Device d, DType t, bool native) {
  std::vector<Tensor> out;
  for (const Tensor& x : in) {
    if (!x.defined()) {
      out.emplace_back();
      continue;
    }
    out.push_back(ops::to(x, d, !native && is_floating(x.dtype()) ? t : x.dtype()).clone());
  }
  return out;
}

// What one run yields: the outputs, then the gradients of the grad inputs (CPU, own dtypes).
struct RunResult {
  std::vector<Tensor> values;
  std::vector<std::string> labels;
};

RunResult run_case(const OpCase& c, Device d, DType t, bool with_grad) {
  std::vector<Tensor> in = to_run(c.inputs(false), d, t, c.native);
  const bool grad = with_grad && !c.grad_inputs.empty();
  if (grad)
    for (int i : c.grad_inputs) in[static_cast<std::size_t>(i)].requires_grad_(true);
  std::vector<Tensor> outs;
  {
    std::optional<NoGradGuard> no_grad;
    if (!grad) no_grad.emplace();
    outs = c.forward(in);
  }
  RunResult r;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    r.values.push_back(outs[k].detach().to(Device::cpu()));
    r.labels.push_back(fmt::format("output {}", k));
  }
  if (!grad) return r;
  // loss = sum_k sum(out_k * w_k), w_k fixed random weights, so every output element matters.
  Tensor loss;
  for (std::size_t k = 0; k < outs.size(); ++k) {
    if (!outs[k].requires_grad()) continue;
    Tensor w = ops::to(randn(outs[k].shape(), 9000 + k), d, outs[k].dtype());
    Tensor term = sum(mul(outs[k], w));
    loss = loss.defined() ? add(loss, term) : term;
  }
  KILN_CHECK(loss.defined(), "case {}: grad inputs are set but no output requires grad", c.name);
  loss.backward();
  for (int i : c.grad_inputs) {
    const Tensor& x = in[static_cast<std::size_t>(i)];
    Tensor g = x.grad().defined() ? x.grad() : Tensor::zeros(x.shape(), x.dtype(), d);
    r.values.push_back(g.to(Device::cpu()));
    r.labels.push_back(fmt::format("grad of input {}", i));
  }
  return r;
}

// Compares one value; returns an empty string when it matches.
std::string compare(const Tensor& got, const Tensor& want, DType run_dtype, double scale) {
  if (got.shape() != want.shape())
    return fmt::format("shape {} where the reference has {}", shape_str(got.shape()), shape_str(want.shape()));
  const auto g = got.to_vector<double>(), w = want.to_vector<double>();
  if (!is_floating(want.dtype()) || !is_floating(got.dtype())) {
    for (std::size_t i = 0; i < g.size(); ++i)
      if (g[i] != w[i]) return fmt::format("element {} is {}, the reference {} (integers must match)", i, g[i], w[i]);
    return "";
  }
  // An output stored in a lower precision than the run (a float32 statistic of a float64 run)
  // is held to its own dtype's bound.
  const double tol = std::max(nmse_tolerance(run_dtype), nmse_tolerance(got.dtype())) * scale;
  double err = 0, norm = 0, max_abs = 0;
  std::size_t worst = 0;
  for (std::size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(g[i]) != std::isnan(w[i]) || std::isinf(g[i]) != std::isinf(w[i]))
      return fmt::format("element {} is {}, the reference {}", i, g[i], w[i]);
    if (std::isnan(w[i]) || std::isinf(w[i])) continue;
    const double e = g[i] - w[i];
    err += e * e;
    norm += w[i] * w[i];
    if (std::abs(e) > max_abs) max_abs = std::abs(e), worst = i;
  }
  const double nmse = err / std::max(norm, 1e-30);
  if (nmse <= tol) return "";
  return fmt::format("NMSE {:.3g} > {:.3g} (max |error| {:.3g} at element {}: {} vs reference {})", nmse, tol, max_abs,
                     worst, g[worst], w[worst]);
}

std::string device_label(Device d) { return device_kind_name(d.kind); }

}  // namespace

std::vector<Device> backends(const Options& o) {
  std::vector<Device> out;
  if (o.backend.empty() || o.backend == "cpu") out.push_back(Device::cpu());
  if ((o.backend.empty() || o.backend == "cuda") && device_count(DeviceKind::CUDA) > 0) out.push_back(Device::cuda(0));
  KILN_CHECK(o.backend.empty() || o.backend == "cpu" || o.backend == "cuda",
             "test_backend_ops: unknown backend '{}' (expected cpu or cuda)", o.backend);
  return out;
}

const std::vector<OpCase>& all_cases() {
  static const std::vector<OpCase> cases = [] {
    // Op families outside the core ops enter the registry explicitly; the harness registers
    // every family so that it enumerates (and must cover) every kernel.
    (void)vision::augment_images_op();
    (void)ops::fp8_ops();
    (void)te::attention_ops();
    (void)te::fused_ops();
    (void)te::moe_ops();
    std::vector<OpCase> c;
    add_elementwise_cases(c);
    add_reduce_linalg_cases(c);
    add_nn_cases(c);
    add_data_cases(c);
    add_fp8_cases(c);
    add_te_attention_cases(c);
    add_te_fused_cases(c);
    add_fp8_producer_cases(c);
    add_te_moe_cases(c);
    std::set<std::string> names;
    for (const auto& x : c) KILN_CHECK(names.insert(x.name).second, "test_backend_ops: case '{}' twice", x.name);
    return c;
  }();
  return cases;
}

Coverage coverage() {
  const auto& cases = all_cases();
  std::set<std::string> run;
  for (const auto& c : cases) run.insert(c.kernels.begin(), c.kernels.end());
  Coverage cov;
  const auto& registry = ops::kernel_registry();
  std::set<std::string> seen;
  for (const auto& k : registry.kernels()) {
    const std::string dev = device_kind_name(k.device);
    const std::string key = k.op + " on " + dev;
    if (!seen.insert(key).second) continue;  // one op on one device counts once, whatever its dtypes
    ++cov.kernels_per_backend[dev];
    if (run.count(k.op))
      ++cov.covered_per_backend[dev];
    else
      cov.uncovered.push_back(key);
  }
  for (const auto& name : run)
    if (!registry.find_id(name)) cov.unknown.push_back(name);
  return cov;
}

void print_coverage(const Coverage& c) {
  for (const auto& [dev, n] : c.kernels_per_backend) {
    auto it = c.covered_per_backend.find(dev);
    std::printf("test_backend_ops: %s: %d of %d registered kernels covered by %zu cases\n", dev.c_str(),
                it == c.covered_per_backend.end() ? 0 : it->second, n, all_cases().size());
  }
  for (const auto& u : c.uncovered) std::printf("test_backend_ops: NO CASE for kernel %s\n", u.c_str());
  for (const auto& u : c.unknown)
    std::printf("test_backend_ops: a case names '%s', which is not registered\n", u.c_str());
  std::fflush(stdout);
}

Report run_eval(const Options& o) { return run_eval(o, all_cases()); }

Report run_eval(const Options& o, const std::vector<OpCase>& cases) {
  Report r;
  const auto devices = backends(o);
  for (const OpCase& c : cases) {
    if (!case_runs(c, o)) continue;
    ++r.cases_run;
    const bool with_grad = !c.grad_inputs.empty();
    // The reference: the CPU kernels at float64, or the case's own float64 computation.
    RunResult ref = run_case(c, Device::cpu(), DType::F64, with_grad);
    if (c.reference) {
      NoGradGuard no_grad;
      std::vector<Tensor> direct = c.reference(to_run(c.inputs(false), Device::cpu(), DType::F64, c.native));
      KILN_CHECK(direct.size() <= ref.values.size(), "case {}: its reference returns too many outputs", c.name);
      for (std::size_t k = 0; k < direct.size(); ++k) {
        // The CPU kernels at f64 must match the direct computation too.
        std::string why = compare(ref.values[k], direct[k], c.native ? DType::F32 : DType::F64, c.tol_scale);
        ++r.checks;
        ++r.checks_per_backend["cpu"];
        if (!why.empty()) {
          ++r.failures;
          r.messages.push_back(
              fmt::format("{} on cpu float64 (vs its direct reference): {}: {}", c.name, ref.labels[k], why));
        }
        ref.values[k] = direct[k];
      }
    }
    std::vector<DType> dtypes = c.native ? std::vector<DType>{DType::F64} : c.dtypes;
    if (!c.native) dtypes.insert(dtypes.begin(), DType::F64);
    for (Device d : devices) {
      for (DType t : dtypes) {
        // The CPU at f64 (or, for native cases, the CPU) is the reference, checked above against
        // the direct computation where the case has one.
        if (d.is_cpu() && t == DType::F64) continue;
        if (t == DType::F64 && !c.native && !c.f64_on_every_backend) continue;
        std::string label = fmt::format("{} on {} {}", c.name, device_label(d), c.native ? "native" : dtype_name(t));
        try {
          RunResult got = run_case(c, d, t, with_grad);
          KILN_CHECK(got.values.size() == ref.values.size(), "{} values where the reference has {}", got.values.size(),
                     ref.values.size());
          for (std::size_t k = 0; k < got.values.size(); ++k) {
            ++r.checks;
            ++r.checks_per_backend[device_label(d)];
            std::string why = compare(got.values[k], ref.values[k], c.native ? DType::F32 : t, c.tol_scale);
            if (!why.empty()) {
              ++r.failures;
              r.messages.push_back(fmt::format("{}: {}: {}", label, got.labels[k], why));
            }
          }
          if (o.verbose) std::printf("  ran %s (%zu values)\n", label.c_str(), got.values.size());
        } catch (const std::exception& e) {
          ++r.checks;
          ++r.failures;
          r.messages.push_back(fmt::format("{}: threw: {}", label, e.what()));
        }
      }
    }
  }
  return r;
}

Report run_grad(const Options& o) {
  Report r;
  const auto devices = backends(o);
  for (const OpCase& c : all_cases()) {
    if (!case_runs(c, o) || c.grad_inputs.empty() || !c.finite_differences) continue;
    ++r.cases_run;
    for (Device d : devices) {
      if (!d.is_cpu() && !c.f64_on_every_backend) continue;
      std::string label = fmt::format("{} on {} float64", c.name, device_label(d));
      ++r.checks;
      ++r.checks_per_backend[device_label(d)];
      try {
        const std::vector<Tensor> all = to_run(c.inputs(false), d, DType::F64, c.native);
        std::vector<Tensor> wrt;
        for (int i : c.grad_inputs) wrt.push_back(all[static_cast<std::size_t>(i)]);
        auto f = [&](const std::vector<Tensor>& xs) {
          std::vector<Tensor> in = all;
          for (std::size_t k = 0; k < xs.size(); ++k) in[static_cast<std::size_t>(c.grad_inputs[k])] = xs[k];
          return c.forward(in)[0];
        };
        autograd::GradcheckResult g = autograd::gradcheck(f, wrt, 1e-6, 1e-5 * c.tol_scale, 1e-4 * c.tol_scale);
        if (!g.ok) {
          ++r.failures;
          r.messages.push_back(fmt::format("{}: {}", label, g.message));
        }
      } catch (const std::exception& e) {
        ++r.failures;
        r.messages.push_back(fmt::format("{}: threw: {}", label, e.what()));
      }
    }
  }
  return r;
}

Report run_perf(const Options& o) {
  Report r;
  const auto devices = backends(o);
  for (const OpCase& c : all_cases()) {
    if (!case_runs(c, o)) continue;
    ++r.cases_run;
    const DType t = c.native || c.dtypes.empty() ? DType::F32 : c.dtypes.front();
    for (Device d : devices) {
      std::vector<Tensor> in = to_run(c.inputs(true), d, t, c.native);
      // Forward only, then forward + backward where the case is differentiable.
      for (bool backward : {false, true}) {
        if (backward && c.grad_inputs.empty()) continue;
        auto once = [&] {
          if (!backward) {
            NoGradGuard no_grad;
            (void)c.forward(in);
            return;
          }
          std::vector<Tensor> x = in;
          for (int i : c.grad_inputs)
            x[static_cast<std::size_t>(i)] = x[static_cast<std::size_t>(i)].detach().requires_grad_(true);
          std::vector<Tensor> outs = c.forward(x);
          Tensor loss;
          for (const Tensor& y : outs)
            if (y.requires_grad()) loss = loss.defined() ? add(loss, sum(y)) : sum(y);
          loss.backward();
        };
        try {
          once();  // warm-up: plans, caches, first-use registration
          synchronize(d);
          int iters = 0;
          auto t0 = std::chrono::steady_clock::now();
          double seconds = 0;
          while (iters < 3 || (seconds < 0.2 && iters < 10000)) {
            once();
            ++iters;
            synchronize(d);
            seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          }
          ++r.checks;
          ++r.checks_per_backend[device_label(d)];
          std::printf(
              "{\"bench\": \"backend_ops\", \"case\": \"%s\", \"backend\": \"%s\", \"dtype\": \"%s\", \"pass\": "
              "\"%s\", \"us_per_iter\": %.3f, \"iters\": %d}\n",
              c.name.c_str(), device_label(d).c_str(), c.native ? "native" : std::string(dtype_name(t)).c_str(),
              backward ? "forward+backward" : "forward", seconds * 1e6 / iters, iters);
        } catch (const std::exception& e) {
          ++r.failures;
          r.messages.push_back(fmt::format("{} on {}: threw: {}", c.name, device_label(d), e.what()));
        }
      }
    }
  }
  std::fflush(stdout);
  return r;
}

void print_report(const char* mode, const Report& r) {
  std::string per;
  for (const auto& [dev, n] : r.checks_per_backend) per += fmt::format(", {} {}", dev, n);
  std::printf("test_backend_ops --mode %s: %d cases, %d checks (%s), %d failed\n", mode, r.cases_run, r.checks,
              per.empty() ? "none" : per.substr(2).c_str(), r.failures);
  for (const auto& m : r.messages) std::printf("  FAIL %s\n", m.c_str());
  std::fflush(stdout);
}

// Kiln's generators draw 32-bit Philox words, so their float64 values are often exact in float32;
// a second stream fills the low-order bits, so that an input rounded to float32 is not the input
// (the float64 checks could not see a kernel that computes in float32 otherwise).
namespace {
std::vector<double> full_precision(const Tensor& t, std::uint64_t seed) {
  auto v = t.to_vector<double>();
  auto low = Tensor::rand(t.shape(), seed ^ 0x9e3779b97f4a7c15ULL, DType::F64).to_vector<double>();
  for (std::size_t i = 0; i < v.size(); ++i) v[i] += (low[i] - 0.5) * 0x1p-26 * (1.0 + std::abs(v[i]));
  return v;
}
}  // namespace

Tensor randn(Shape shape, std::uint64_t seed, double scale, double shift) {
  Tensor t = Tensor::randn(std::move(shape), seed, DType::F64);
  auto v = full_precision(t, seed);
  for (double& x : v) x = x * scale + shift;
  return Tensor::from_vector(v, t.shape());
}

Tensor rand_uniform(Shape shape, std::uint64_t seed, double lo, double hi) {
  Tensor t = Tensor::rand(std::move(shape), seed, DType::F64);
  auto v = full_precision(t, seed);
  for (double& x : v) x = lo + (hi - lo) * std::clamp(x, 0.0, 1.0);
  return Tensor::from_vector(v, t.shape());
}

Tensor distinct(Shape shape, std::uint64_t seed, double gap) {
  const std::int64_t n = numel_of(shape);
  auto keys = Tensor::rand({n}, seed, DType::F64).to_vector<double>();
  std::vector<std::int64_t> order(static_cast<std::size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](std::int64_t a, std::int64_t b) { return keys[a] < keys[b]; });
  std::vector<double> v(static_cast<std::size_t>(n));
  for (std::int64_t i = 0; i < n; ++i)
    v[static_cast<std::size_t>(order[static_cast<std::size_t>(i)])] = (static_cast<double>(i) - 0.5 * n) * gap;
  return Tensor::from_vector(v, shape);
}

Tensor rand_index(Shape shape, std::uint64_t seed, std::int64_t hi) {
  auto u = Tensor::rand(shape, seed, DType::F64).to_vector<double>();
  std::vector<std::int64_t> v(u.size());
  for (std::size_t i = 0; i < u.size(); ++i)
    v[i] = std::min<std::int64_t>(hi - 1, static_cast<std::int64_t>(u[i] * static_cast<double>(hi)));
  return Tensor::from_vector(v, shape);
}

}  // namespace kiln::backend_ops
