// The report in the reference's layout (ReportResults: a YAML-like document, here a .txt file)
// plus Kiln's per-kernel bandwidth table and the bandwidth bound.
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <filesystem>

#include "kiln/hpc/hpcg/benchmark.h"
#include "kiln/runtime/error.h"

namespace kiln::hpcg {

namespace {

constexpr double kOfficialSeconds = 1800.0;  // the reference's minimum for an official result

class Doc {
 public:
  template <class T>
  void add(int depth, const std::string& key, const T& value) {
    text_ += std::string(static_cast<std::size_t>(2 * depth), ' ') + key + ": " + fmt::format("{}", value) + "\n";
  }
  void section(int depth, const std::string& key) {
    text_ += std::string(static_cast<std::size_t>(2 * depth), ' ') + key + ":\n";
  }
  const std::string& text() const { return text_; }

 private:
  std::string text_;
};

const char* pass_fail(bool ok) { return ok ? "PASSED" : "FAILED"; }

struct KernelRow {
  std::string name;
  std::int64_t calls = 0;
  double seconds = 0, bytes = 0, flops = 0;
};

std::vector<KernelRow> kernel_rows(const HpcgResults& R) {
  std::vector<KernelRow> rows;
  for (int k = 0; k < kKernelKinds; ++k) {
    for (int l = 0; l < kMgLevels; ++l) {
      const auto& e = R.profile.entries[static_cast<std::size_t>(k)][static_cast<std::size_t>(l)];
      if (e.calls == 0) continue;
      rows.push_back({fmt::format("{} level {}", kernel_name(static_cast<KernelKind>(k)), l), e.calls, e.seconds,
                      e.bytes, e.flops});
    }
  }
  return rows;
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%d_%H-%M-%S", std::localtime(&now));
  return buf;
}

std::string document(const HpcgResults& R) {
  const auto& g = R.geometry;
  double sets = R.cg_sets, iters = sets * R.opt_iterations;
  double n = static_cast<double>(R.rows[0]), nnz = static_cast<double>(R.nonzeros[0]);
  double f_ddot = (3.0 * iters + sets) * 2.0 * n, f_waxpby = f_ddot, f_spmv = (iters + sets) * 2.0 * nnz;
  double f_total = R.flops(), f_mg = f_total - f_ddot - f_waxpby - f_spmv;
  double penalty = R.ref_iterations / static_cast<double>(R.opt_iterations);
  Doc d;
  d.add(0, "HPCG-Benchmark", "3.1");
  d.add(0, "Implementation", fmt::format("Kiln HPCG, {} kernels", R.engine));
  d.section(0, "Machine Summary");
  d.add(1, "Distributed Processes", R.processes);
  d.add(1, "Threads per processes", 1);
  d.add(1, "Device", R.device_name);
  d.section(0, "Global Problem Dimensions");
  d.add(1, "Global nx", g.gnx());
  d.add(1, "Global ny", g.gny());
  d.add(1, "Global nz", g.gnz());
  d.section(0, "Processor Dimensions");
  d.add(1, "npx", g.npx);
  d.add(1, "npy", g.npy);
  d.add(1, "npz", g.npz);
  d.section(0, "Local Domain Dimensions");
  d.add(1, "nx", g.nx);
  d.add(1, "ny", g.ny);
  d.add(1, "nz", g.nz);
  d.section(0, "########## Problem Summary  ##########");
  d.section(0, "Setup Information");
  d.add(1, "Setup Time", R.setup_seconds);
  d.section(0, "Linear System Information");
  d.add(1, "Number of Equations", R.rows[0]);
  d.add(1, "Number of Nonzero Terms", R.nonzeros[0]);
  d.section(0, "Multigrid Information");
  d.add(1, "Number of coarse grid levels", R.rows.size() - 1);
  d.section(1, "Coarse Grids");
  for (std::size_t l = 1; l < R.rows.size(); ++l) {
    d.add(2, "Grid Level", l);
    d.add(2, "Number of Equations", R.rows[l]);
    d.add(2, "Number of Nonzero Terms", R.nonzeros[l]);
    d.add(2, "Number of Presmoother Steps", 1);
    d.add(2, "Number of Postsmoother Steps", 1);
  }
  d.section(0, "########## Memory Use Summary  ##########");
  d.section(0, "Memory Use Information");
  d.add(1, "Matrix and index data, all levels (Gbytes)", R.matrix_bytes / 1e9);
  d.add(1, "Bytes per equation (matrix data / Number of Equations)", R.matrix_bytes / n);
  d.section(0, "########## V&V Testing Summary  ##########");
  d.section(0, "Spectral Convergence Tests");
  d.add(1, "Result", pass_fail(R.spectral.failed == 0));
  d.section(1, "Unpreconditioned");
  d.add(2, "Maximum iteration count", R.spectral.max_unpreconditioned);
  d.add(2, "Expected iteration count", R.spectral.expected_unpreconditioned);
  d.section(1, "Preconditioned");
  d.add(2, "Maximum iteration count", R.spectral.max_preconditioned);
  d.add(2, "Expected iteration count", R.spectral.expected_preconditioned);
  d.section(0, "Departure from Symmetry |x'Ay-y'Ax|/(2*||x||*||A||*||y||)/epsilon");
  d.add(1, "Result", pass_fail(R.symmetry.failed == 0));
  d.add(1, "Departure for SpMV", R.symmetry.departure_spmv);
  d.add(1, "Departure for MG", R.symmetry.departure_mg);
  for (std::size_t i = 0; i < R.symmetry.exact_solution_residuals.size(); ++i)
    d.add(1, fmt::format("SpMV call [{}] exact-solution residual", i), R.symmetry.exact_solution_residuals[i]);
  d.section(0, "########## Iterations Summary  ##########");
  d.section(0, "Iteration Count Information");
  d.add(1, "Result", pass_fail(R.tolerance_failures == 0));
  d.add(1, "Reference CG iterations per set", R.ref_iterations);
  d.add(1, "Optimized CG iterations per set", R.opt_iterations);
  d.add(1, "Total number of reference iterations", R.ref_iterations * R.cg_sets);
  d.add(1, "Total number of optimized iterations", R.opt_iterations * R.cg_sets);
  d.add(1, "Reference residual reduction (50 iterations)", R.ref_tolerance);
  d.section(0, "########## Reproducibility Summary  ##########");
  d.section(0, "Reproducibility Information");
  d.add(1, "Result", pass_fail(R.norms.passed));
  d.add(1, "Scaled residual mean", R.norms.mean);
  d.add(1, "Scaled residual variance", R.norms.variance);
  d.section(0, "########## Performance Summary (times in sec) ##########");
  d.section(0, "Benchmark Time Summary");
  d.add(1, "Optimization phase", R.optimization_seconds);
  d.add(1, "DDOT", R.timed.dot);
  d.add(1, "WAXPBY", R.timed.waxpby);
  d.add(1, "SpMV", R.timed.spmv);
  d.add(1, "MG", R.timed.mg);
  d.add(1, "Total", R.timed.total);
  d.section(0, "Floating Point Operations Summary");
  d.add(1, "Raw DDOT", f_ddot);
  d.add(1, "Raw WAXPBY", f_waxpby);
  d.add(1, "Raw SpMV", f_spmv);
  d.add(1, "Raw MG", f_mg);
  d.add(1, "Total", f_total);
  d.add(1, "Total with convergence overhead", R.credited_flops());
  d.section(0, "GB/s Summary");
  double bytes_total = R.bytes_per_iteration() * iters;
  d.add(1, "Kiln model: bytes the kernels must move (GB)", bytes_total / 1e9);
  d.add(1, "Raw Total B/W", bytes_total / R.timed.total / 1e9);
  d.add(1, "Copy bandwidth (GB/s)", R.params.copy_bandwidth / 1e9);
  d.add(1, "Copy bandwidth source", R.params.copy_bandwidth_source);
  d.section(0, "GFLOP/s Summary");
  d.add(1, "Raw DDOT", f_ddot / R.timed.dot / 1e9);
  d.add(1, "Raw WAXPBY", f_waxpby / R.timed.waxpby / 1e9);
  d.add(1, "Raw SpMV", f_spmv / R.timed.spmv / 1e9);
  d.add(1, "Raw MG", f_mg / R.timed.mg / 1e9);
  d.add(1, "Raw Total", f_total / R.timed.total / 1e9);
  d.add(1, "Total with convergence overhead", R.credited_flops() / R.timed.total / 1e9);
  d.add(1, "Total with convergence and optimization phase overhead", R.rating_gflops());
  d.section(0, "Bandwidth Bound");
  d.add(1, "Flops per iteration (reference count)", R.flops_per_iteration());
  d.add(1, "Bytes per iteration, kernels as specified", R.kernel_bytes_per_iteration());
  d.add(1, "Working set per last-level cache (MB)", R.working_set_bytes / 1e6);
  d.add(1, "Last-level cache (MB)", R.cache_bytes / 1e6);
  d.add(1, "Bound applies (working set at least twice the cache)", R.bound_applies() ? "yes" : "no: runs from cache");
  d.add(1, "Bound at the copy bandwidth (GFLOP/s)", R.bound_gflops());
  d.add(1, "Rating as a fraction of the bound", R.bound_gflops() > 0 ? R.rating_gflops() / R.bound_gflops() : 0.0);
  d.add(1, "Bytes per iteration, Kiln's algorithm", R.bytes_per_iteration());
  d.add(1, "Stricter bound with Kiln's bytes (GFLOP/s)", R.strict_bound_gflops());
  d.add(1, "Rating as a fraction of the stricter bound",
        R.strict_bound_gflops() > 0 ? R.rating_gflops() / R.strict_bound_gflops() : 0.0);
  d.add(1, "Convergence penalty (50 / optimized iterations)", penalty);
  d.section(0, "Wall Time (sec)");
  d.add(1, "Setup", R.phases.setup);
  d.add(1, "Validation", R.phases.validation);
  d.add(1, "Optimization", R.phases.optimization);
  d.add(1, "Timed phase", R.phases.timed);
  d.add(1, "Requested run time (--rt)", R.params.run_seconds);
  d.add(1, "Profiled set", R.phases.profile);
  d.add(1, "Bandwidth measurement", R.phases.bandwidth);
  d.add(1, "Total", R.phases.total);
  d.section(0, "Kernel Profile (one extra set, every kernel synchronised)");
  for (const auto& k : kernel_rows(R)) {
    d.section(1, k.name);
    d.add(2, "Calls", k.calls);
    d.add(2, "Seconds", k.seconds);
    d.add(2, "Bytes moved (GB)", k.bytes / 1e9);
    d.add(2, "Bandwidth (GB/s)", k.seconds > 0 ? k.bytes / k.seconds / 1e9 : 0.0);
    d.add(2, "GFLOP/s", k.seconds > 0 ? k.flops / k.seconds / 1e9 : 0.0);
  }
  d.section(0, "User Optimization Overheads");
  d.add(1, "Optimization phase time (sec)", R.optimization_seconds);
  d.add(1, "Optimization phase time vs reference SpMV+MG time",
        R.reference_spmv_mg_seconds > 0 ? R.optimization_seconds / R.reference_spmv_mg_seconds : 0.0);
  d.add(1, "Note", "the optimised layout is generated directly; its cost is part of Setup Time");
  d.section(0, "__________ Final Summary __________");
  if (R.valid()) {
    d.add(1, "HPCG result is VALID with a GFLOP/s rating of", R.rating_gflops());
    if (R.timed.total < kOfficialSeconds) {
      d.add(1, "Results are valid but execution time (sec) is", R.timed.total);
      d.add(1, "Official results execution time (sec) must be at least", kOfficialSeconds);
    }
  } else {
    d.add(1, "HPCG result is", "INVALID.");
    d.add(1, "Please review the YAML file contents", "You may NOT submit these results for consideration.");
  }
  return d.text();
}

}  // namespace

std::string write_report(const HpcgResults& R) {
  std::error_code ec;
  std::filesystem::create_directories(R.params.report_dir, ec);
  KILN_CHECK(!ec, "hpcg: cannot create the report directory '{}': {}", R.params.report_dir, ec.message());
  auto path =
      (std::filesystem::path(R.params.report_dir) / fmt::format("HPCG-Benchmark_3.1_{}_{}.txt", R.engine, timestamp()))
          .string();
  // A temporary name, then rename: a full disk leaves no report cut at a buffer boundary.
  const std::string tmp = fmt::format("{}.tmp.{}", path, ::getpid());
  const std::string text = document(R);
  std::FILE* f = std::fopen(tmp.c_str(), "w");
  KILN_CHECK(f != nullptr, "hpcg: cannot create the report {}: {}", tmp, std::strerror(errno));
  errno = 0;
  bool ok = std::fwrite(text.data(), 1, text.size(), f) == text.size();
  ok = std::fflush(f) == 0 && ok && ::fsync(::fileno(f)) == 0;
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  if (err == 0) err = errno;
  if (!ok) {
    std::filesystem::remove(tmp, ec);
    KILN_FAIL("hpcg: cannot write the report {}: {} (the summary above is complete)", path,
              std::strerror(err ? err : EIO));
  }
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    KILN_FAIL("hpcg: cannot rename {} to {}: {}", tmp, path, ec.message());
  }
  return path;
}

std::string summary(const HpcgResults& R) {
  std::string s;
  auto line = [&](const std::string& t) { s += t + "\n"; };
  const auto& g = R.geometry;
  line(fmt::format(
      "HPCG 3.1 (Kiln, {} kernels) on {}: {} process(es) in a {}x{}x{} grid, local {}x{}x{}, global {}x{}x{}", R.engine,
      R.device_name, R.processes, g.npx, g.npy, g.npz, g.nx, g.ny, g.nz, g.gnx(), g.gny(), g.gnz()));
  line(fmt::format("  equations {}, nonzeros {}, setup {:.3f} s", R.rows[0], R.nonzeros[0], R.setup_seconds));
  line(fmt::format("  spectral test:  {} (unpreconditioned {} <= {}, preconditioned {} <= {})",
                   pass_fail(R.spectral.failed == 0), R.spectral.max_unpreconditioned,
                   R.spectral.expected_unpreconditioned, R.spectral.max_preconditioned,
                   R.spectral.expected_preconditioned));
  line(fmt::format("  symmetry test:  {} (SpMV {:.3e}, MG {:.3e}; exact-solution residual {:.1e})",
                   pass_fail(R.symmetry.failed == 0), R.symmetry.departure_spmv, R.symmetry.departure_mg,
                   R.symmetry.exact_solution_residuals.empty() ? 0.0 : R.symmetry.exact_solution_residuals.back()));
  line(fmt::format("  iterations:     {} (reference 50 reach {:.6e}; optimized {} per set, penalty x{:.4f})",
                   pass_fail(R.tolerance_failures == 0), R.ref_tolerance, R.opt_iterations,
                   R.ref_iterations / static_cast<double>(R.opt_iterations)));
  line(fmt::format("  reproducibility:{} (mean {:.6e}, variance {:.3e} over {} sets)", pass_fail(R.norms.passed),
                   R.norms.mean, R.norms.variance, R.cg_sets));
  line(fmt::format("  timed phase:    {:.3f} s, {} sets (official runs need {} s)", R.timed.total, R.cg_sets,
                   kOfficialSeconds));
  line(fmt::format("  per kernel (one profiled set):"));
  line(fmt::format("    {:<28} {:>8} {:>10} {:>10} {:>10} {:>9}", "kernel", "calls", "seconds", "GB", "GB/s",
                   "GFLOP/s"));
  for (const auto& k : kernel_rows(R))
    line(fmt::format("    {:<28} {:>8} {:>10.4f} {:>10.3f} {:>10.1f} {:>9.2f}", k.name, k.calls, k.seconds,
                     k.bytes / 1e9, k.seconds > 0 ? k.bytes / k.seconds / 1e9 : 0.0,
                     k.seconds > 0 ? k.flops / k.seconds / 1e9 : 0.0));
  double rows0 = static_cast<double>(R.rows[0]);
  if (!R.bound_applies()) {
    // Data that stays in cache is read faster than the memory copy: the figure is no bound here.
    line(fmt::format(
        "  bandwidth bound: none at this size: the working set, {:.1f} MB per last-level cache, is under twice the "
        "{:.1f} MB cache, so kernels run from cache, faster than the {:.1f} GB/s memory copy (for a memory-bound "
        "figure use a box well beyond the cache; at the copy rate, {:.2f} GFLOP/s, rating {:.1f}% of that)",
        R.working_set_bytes / 1e6, R.cache_bytes / 1e6, R.params.copy_bandwidth / 1e9, R.bound_gflops(),
        R.bound_gflops() > 0 ? 100.0 * R.rating_gflops() / R.bound_gflops() : 0.0));
  } else {
    line(fmt::format(
        "  bandwidth bound: {:.2f} GFLOP/s ({:.0f} B/row/iteration, kernels as specified, at {:.1f} GB/s copy): "
        "rating is {:.1f}% of it",
        R.bound_gflops(), R.kernel_bytes_per_iteration() / rows0, R.params.copy_bandwidth / 1e9,
        R.bound_gflops() > 0 ? 100.0 * R.rating_gflops() / R.bound_gflops() : 0.0));
    line(fmt::format(
        "  stricter bound:  {:.2f} GFLOP/s ({:.0f} B/row/iteration, Kiln's algorithm): rating is {:.1f}% of it",
        R.strict_bound_gflops(), R.bytes_per_iteration() / rows0,
        R.strict_bound_gflops() > 0 ? 100.0 * R.rating_gflops() / R.strict_bound_gflops() : 0.0));
  }
  const auto& t = R.phases;
  line(fmt::format(
      "  wall time:      {:.1f} s: timed phase {:.1f} s (--rt {:g}; it ends at the first set boundary after that), "
      "setup {:.1f} s, validation {:.1f} s, optimisation {:.1f} s, profiled set {:.1f} s, bandwidth {:.1f} s (process "
      "and MPI start-up and exit come on top)",
      t.total, t.timed, R.params.run_seconds, t.setup, t.validation, t.optimization, t.profile, t.bandwidth));
  if (R.valid()) {
    line(fmt::format("HPCG result is VALID with a GFLOP/s rating of {:.4f}", R.rating_gflops()));
  } else {
    line("HPCG result is INVALID.");
  }
  return s;
}

}  // namespace kiln::hpcg
