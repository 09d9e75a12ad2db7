#include "kiln/hpc/hpcg/benchmark.h"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "kiln/hpc/hpcg/cache_size.h"
#include "kiln/hpc/hpcg/layout.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/elapsed.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/event.h"

namespace kiln::hpcg {

namespace {

// Device-to-device copy bandwidth (bytes read + written per second), best of a few repetitions.
double measure_copy_bandwidth(Device device, std::size_t bytes) {
  auto& backend = backend_for(device);
  void* a = backend.allocate(bytes, device.index);
  void* b = backend.allocate(bytes, device.index);
  backend.memset_zero(a, bytes, device.index);
  backend.memset_zero(b, bytes, device.index);
  double best = 0.0;
  Event start(device), stop(device);
  for (int rep = 0; rep < 6; ++rep) {
    start.record();
    backend.copy_on_device(b, a, bytes, device.index);
    stop.record();
    double ms = stop.elapsed_ms(start);
    if (rep > 0 && ms > 0) best = std::max(best, 2.0 * static_cast<double>(bytes) / (ms * 1e-3));
  }
  backend.deallocate(a, device.index);
  backend.deallocate(b, device.index);
  return best;
}

}  // namespace

void check_params(const HpcgParams& p) {
  check_local_dimensions(p.nx, p.ny, p.nz);
  // The set count is an int and the timed phase a wall-clock span: -1, inf, nan or 1e300 would
  // overflow it ("-2147483647 sets") or never end.
  KILN_CHECK(std::isfinite(p.run_seconds) && p.run_seconds >= 0 && p.run_seconds <= kMaxRunSeconds,
             "hpcg: run time (--rt or hpcg.dat line 4) {} s is not a number of seconds in [0, {}] (official runs: at "
             "least 1800)",
             p.run_seconds, kMaxRunSeconds);
}

double estimated_bytes_per_process(int nx, int ny, int nz) {
  auto points = [](double x, double y, double z) { return x * y * z; };
  double bytes = 0;
  double x = nx, y = ny, z = nz;
  for (int level = 0; level < kMgLevels; ++level) {
    double rows = points(x, y, z);
    double slices = std::ceil(rows / kSlice);
    bytes += slices * kStencil * kSlice * (8.0 + 4.0);  // sliced ELL: value and column per slot
    if (level + 1 < kMgLevels) {
      double coarse_columns = points(x / 2 + 2, y / 2 + 2, z / 2 + 2);
      bytes += 4.0 * rows / 8 + 2 * 8.0 * coarse_columns;  // injection map; V-cycle r and x of the coarse level
    }
    x /= 2;
    y /= 2;
    z /= 2;
  }
  // b, x, xexact, CG's r z p Ap, the timing's y, the validation's four, the engine's right-hand side.
  return bytes + 13 * 8.0 * points(nx + 2.0, ny + 2.0, nz + 2.0);
}

std::string report_dir_problem(const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return fmt::format("cannot create the report directory '{}': {}", dir, ec.message());
  auto probe = std::filesystem::path(dir) / fmt::format(".kiln-hpcg-probe.{}", ::getpid());
  std::FILE* f = std::fopen(probe.c_str(), "w");
  if (f == nullptr) return fmt::format("cannot write in the report directory '{}': {}", dir, std::strerror(errno));
  bool ok = std::fputs("probe\n", f) >= 0 && std::fflush(f) == 0;
  int err = errno;
  ok = std::fclose(f) == 0 && ok;
  std::filesystem::remove(probe, ec);
  if (!ok) return fmt::format("cannot write in the report directory '{}': {}", dir, std::strerror(err ? err : EIO));
  return {};
}

bool HpcgResults::valid() const {
  return spectral.failed == 0 && symmetry.failed == 0 && norms.passed && tolerance_failures == 0;
}

double HpcgResults::flops() const {
  // The reference's count (ReportResults): per set, opt_iterations iterations plus the preamble.
  double sets = cg_sets, iters = sets * opt_iterations;
  double n = static_cast<double>(rows[0]), nnz = static_cast<double>(nonzeros[0]);
  double ddot = (3.0 * iters + sets) * 2.0 * n;
  double waxpby = (3.0 * iters + sets) * 2.0 * n;
  double spmv = (iters + sets) * 2.0 * nnz;
  double mg = 0.0;
  std::size_t levels = nonzeros.size();
  for (std::size_t l = 0; l + 1 < levels; ++l) mg += iters * (4.0 + 2.0 + 4.0) * static_cast<double>(nonzeros[l]);
  mg += iters * 4.0 * static_cast<double>(nonzeros[levels - 1]);
  return ddot + waxpby + spmv + mg;
}

double HpcgResults::credited_flops() const { return flops() * ref_iterations / static_cast<double>(opt_iterations); }

double HpcgResults::rating_gflops() const {
  double overhead = cg_sets * (optimization_seconds / 10.0 + setup_seconds / 10.0);
  return credited_flops() / (timed.total + overhead) / 1e9;
}

double HpcgResults::flops_per_iteration() const {
  double n = static_cast<double>(rows[0]), nnz = static_cast<double>(nonzeros[0]);
  double f = 6.0 * n + 6.0 * n + 2.0 * nnz;
  std::size_t levels = nonzeros.size();
  for (std::size_t l = 0; l + 1 < levels; ++l) f += 10.0 * static_cast<double>(nonzeros[l]);
  return f + 4.0 * static_cast<double>(nonzeros[levels - 1]);
}

double HpcgResults::kernel_bytes_per_iteration() const {
  double n = static_cast<double>(rows[0]), nnz = static_cast<double>(nonzeros[0]);
  double bytes = 12.0 * nnz + 16.0 * n;  // SpMV: matrix, x in, y out
  bytes += 3 * 16.0 * n + 3 * 24.0 * n;  // three dot products and three WAXPBYs
  std::size_t levels = nonzeros.size();
  for (std::size_t l = 0; l < levels; ++l) {
    double nl = static_cast<double>(rows[l]), zl = static_cast<double>(nonzeros[l]);
    double symgs = 2.0 * (12.0 * zl + 24.0 * nl);  // forward and backward: matrix, r, x in and out
    if (l + 1 == levels) {
      bytes += symgs;
      break;
    }
    double nc = static_cast<double>(rows[l + 1]);
    bytes += 2.0 * symgs + (12.0 * zl + 16.0 * nl) + 24.0 * nc +
             24.0 * nc;  // smoothers, residual, restriction, prolongation
  }
  return bytes;
}

double HpcgResults::bound_gflops() const {
  return params.copy_bandwidth > 0 ? flops_per_iteration() / kernel_bytes_per_iteration() * params.copy_bandwidth / 1e9
                                   : 0.0;
}

double HpcgResults::strict_bound_gflops() const {
  return params.copy_bandwidth > 0 ? flops_per_iteration() / bytes_per_iteration() * params.copy_bandwidth / 1e9 : 0.0;
}

double HpcgResults::bytes_per_iteration() const {
  // What one optimised iteration must move (docs/hpcg.md): every matrix pass reads 12 B per
  // nonzero; vectors are streamed once per kernel.
  double n = static_cast<double>(rows[0]), nnz = static_cast<double>(nonzeros[0]);
  double bytes = 12.0 * nnz + 16.0 * n;         // SpMV
  bytes += 2 * 16.0 * n + 24.0 * n + 48.0 * n;  // r.z and p.Ap, p = z + beta p, fused x/r update with r.r
  std::size_t levels = nonzeros.size();
  for (std::size_t l = 0; l < levels; ++l) {
    double nl = static_cast<double>(rows[l]), zl = static_cast<double>(nonzeros[l]);
    double sweep = 12.0 * zl + 24.0 * nl;
    // Every V-cycle level starts from zero: the first forward sweep reads the slots of relaxed
    // colours only (Engine::symgs_zero_guess_bytes), the other sweeps everything.
    double forward_from_zero = 12.0 * zl * (13.0 / 27.0) + 8.0 * zl / 27.0 + 16.0 * nl;
    if (l + 1 == levels) {  // the coarsest grid: one symmetric sweep
      bytes += forward_from_zero + sweep;
      break;
    }
    double nc = static_cast<double>(rows[l + 1]);
    bytes += forward_from_zero + 3.0 * sweep;               // pre- and post-smoothing
    bytes += 12.0 * zl * (nc / nl) + 8.0 * nl + 16.0 * nc;  // residual at the coarse points
    bytes += 24.0 * nc;                                     // prolongation
  }
  return bytes;
}

namespace {

// Rank 0 decides (it writes the report); every process throws the same way, so none waits alone.
void fail_together(const dist::Communicator& comm, const std::string& rank0_problem) {
  int failed = rank0_problem.empty() ? 0 : 1;
  comm.broadcast(std::span<int>(&failed, 1), 0);
  if (failed == 0) return;
  KILN_FAIL("{}", comm.rank() == 0 ? rank0_problem : std::string("hpcg: rank 0 refused the run (see its message)"));
}

// MemAvailable from /proc/meminfo: what the node can give without swapping (0 when unknown).
double available_host_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key, unit;
  double kib = 0;
  while (in >> key >> kib >> unit)
    if (key == "MemAvailable:") return kib * 1024;
  return 0;
}

// The problem must fit before it is generated: otherwise a bare bad_alloc (or the OOM killer)
// after minutes of setup.
void check_memory(const HpcgParams& p, const dist::Communicator& comm) {
  const double need = estimated_bytes_per_process(p.nx, p.ny, p.nz);
  std::string problem;
  if (p.device.is_cuda()) {
    auto props = backend_for(p.device).properties(p.device.index);
    if (need > static_cast<double>(props.free_memory)) {
      problem = fmt::format(
          "hpcg: local {}x{}x{} needs about {:.2f} GB on {} ({}) (the 27-point matrix of every level in sliced ELL and "
          "a dozen vectors), but only {:.2f} GB of its {:.2f} GB are free; choose a smaller --nx/--ny/--nz",
          p.nx, p.ny, p.nz, need / 1e9, p.device.str(), props.name, static_cast<double>(props.free_memory) / 1e9,
          static_cast<double>(props.total_memory) / 1e9);
    }
  } else {
    dist::Communicator node = comm.split_node_local();
    const double node_need = node.all_reduce_value(need);
    const double available = available_host_bytes();
    if (available > 0 && node_need > available) {
      problem = fmt::format(
          "hpcg: local {}x{}x{} needs about {:.2f} GB per process ({:.2f} GB for the {} process(es) on this node: the "
          "27-point matrix of every level in sliced ELL and a dozen vectors), but only {:.2f} GB are available "
          "(MemAvailable); choose a smaller --nx/--ny/--nz",
          p.nx, p.ny, p.nz, need / 1e9, node_need / 1e9, node.size(), available / 1e9);
    }
  }
  // Any rank short of memory stops every rank.
  int short_here = problem.empty() ? 0 : 1;
  int short_anywhere = comm.all_reduce_value(short_here, dist::ReduceOp::Max);
  if (short_anywhere == 0) return;
  KILN_FAIL("{}", problem.empty() ? std::string("hpcg: another process does not have the memory for its box (see its "
                                                "message)")
                                  : problem);
}

}  // namespace

bool HpcgResults::bound_applies() const { return cache_bytes <= 0 || working_set_bytes >= 2.0 * cache_bytes; }

HpcgResults run_hpcg(const HpcgParams& params, const dist::Communicator& comm) {
  check_params(params);
  // Found before the run, not after it: where the report goes, and whether the problem fits.
  fail_together(comm, comm.rank() == 0 ? report_dir_problem(params.report_dir) : std::string());
  check_memory(params, comm);
  HpcgResults R;
  R.params = params;
  R.processes = comm.size();
  auto t_start = std::chrono::steady_clock::now();
  auto t_setup = t_start;

  // Problem setup (GenerateGeometry, GenerateProblem, SetupHalo, coarse grids, OptimizeProblem:
  // the optimised engines build their layout directly, so it is all setup time).
  ProcessGrid grid = choose_process_grid(comm.size(), params.process_grid);
  R.geometry = make_geometry(params.nx, params.ny, params.nz, grid, comm.rank());
  EngineKind kind = parse_engine_kind(params.kernels, params.device);
  auto engine_ptr = make_engine(kind, make_hierarchy(R.geometry), comm, params.device.index);
  Engine& e = *engine_ptr;
  R.engine = e.name();
  R.device_name = params.device.str() + " (" + backend_for(params.device).properties(params.device.index).name + ")";
  for (int l = 0; l < e.levels(); ++l) {
    R.rows.push_back(e.global_rows(l));
    R.nonzeros.push_back(e.global_nonzeros(l));
  }
  R.matrix_bytes = comm.all_reduce_value(e.matrix_bytes());
  Vector b = e.make_vector(0), x = e.make_vector(0), xexact = e.make_vector(0);
  e.rhs(b);
  e.fill(xexact, 0, 1.0);
  CgWorkspace work(e);
  e.synchronize();
  R.setup_seconds = comm.all_reduce_value(seconds_since(t_setup), dist::ReduceOp::Max);
  R.optimization_seconds = 0.0;

  R.phases.setup = seconds_since(t_setup);

  // Reference SpMV+MG timing phase (natural-order smoother).
  auto t_validation = std::chrono::steady_clock::now();
  {
    int calls = e.local_rows(0) <= (1 << 21) ? 10 : 2;
    Vector y = e.make_vector(0);
    e.synchronize();
    auto t = std::chrono::steady_clock::now();
    for (int i = 0; i < calls; ++i) {
      e.compute_spmv(0, x, y);
      e.compute_mg(0, y, x, Ordering::Reference);
    }
    e.synchronize();
    R.reference_spmv_mg_seconds = seconds_since(t) / calls;
  }

  // Reference CG: the residual reduction of 50 iterations in natural order sets the target.
  e.fill(x, 0, 0.0);
  CgResult ref = cg(e, work, b, x, R.ref_iterations, 0.0, true, Ordering::Reference);
  R.ref_tolerance = ref.scaled_residual();

  // Validation.
  R.spectral = test_cg(e, work, b, x);
  R.symmetry = test_symmetry(e, b, xexact, params.seed);

  R.phases.validation = seconds_since(t_validation);

  // Optimised CG setup: iterations the optimised smoother needs to reach the reference's reduction.
  auto t_optimization = std::chrono::steady_clock::now();
  int max_iterations = 10 * R.ref_iterations;
  R.opt_iterations = R.ref_iterations;
  {
    e.fill(x, 0, 0.0);
    CgResult opt = cg(e, work, b, x, max_iterations, R.ref_tolerance, true, Ordering::Optimized);
    if (opt.scaled_residual() > R.ref_tolerance * (1.0 + 1.0e-6)) ++R.tolerance_failures;
    R.opt_iterations = std::max(R.opt_iterations, opt.iterations);
  }
  R.phases.optimization = seconds_since(t_optimization);

  // Timed phase: sets of opt_iterations until the phase's wall time reaches the run time (at least
  // one set). The reference fixes the count beforehand from the first optimised solve, which
  // includes warm-up and misses what is outside CG's timers, so its timed phase ran well past
  // --rt; here the clock decides after each set, and the phase ends within one set of --rt. The
  // slowest process's clock decides, so every process runs the same sets.
  auto t_timed = std::chrono::steady_clock::now();
  std::vector<double> scaled;
  R.cg_sets = 0;
  while (true) {
    e.fill(x, 0, 0.0);
    CgResult r = cg(e, work, b, x, R.opt_iterations, 0.0, true, Ordering::Optimized, &R.timed);
    scaled.push_back(r.scaled_residual());
    ++R.cg_sets;
    e.synchronize();
    double elapsed = comm.all_reduce_value(seconds_since(t_timed), dist::ReduceOp::Max);
    if (elapsed >= params.run_seconds || R.cg_sets == INT_MAX) break;
  }
  R.phases.timed = seconds_since(t_timed);
  R.norms = test_norms(scaled);
  R.timed.total = comm.all_reduce_value(R.timed.total, dist::ReduceOp::Max);

  // One more set with every kernel timed (outside the rated time).
  auto t_profile = std::chrono::steady_clock::now();
  e.reset_profile();
  e.set_profiling(true);
  e.fill(x, 0, 0.0);
  R.profiled_iterations = cg(e, work, b, x, R.opt_iterations, 0.0, true, Ordering::Optimized).iterations;
  e.set_profiling(false);
  R.profile = e.profile();
  R.phases.profile = seconds_since(t_profile);

  auto t_bandwidth = std::chrono::steady_clock::now();
  if (R.params.copy_bandwidth <= 0.0) {
    std::size_t bytes = params.device.is_cuda() ? (std::size_t{1} << 31) : (std::size_t{1} << 27);
    R.params.copy_bandwidth = comm.all_reduce_value(measure_copy_bandwidth(params.device, bytes));
    R.params.copy_bandwidth_source =
        fmt::format("device copy of {} MiB, measured in this run, summed over ranks", bytes >> 20);
  }
  R.phases.bandwidth = seconds_since(t_bandwidth);
  R.phases.total = seconds_since(t_start);
  for (double* phase : {&R.phases.setup, &R.phases.validation, &R.phases.optimization, &R.phases.timed,
                        &R.phases.profile, &R.phases.bandwidth, &R.phases.total}) {
    *phase = comm.all_reduce_value(*phase, dist::ReduceOp::Max);
  }

  // The processes of a node share its CPU caches; each GPU has its own L2.
  R.cache_bytes = static_cast<double>(last_level_cache_bytes(params.device));
  const int sharing = params.device.is_cuda() ? 1 : comm.split_node_local().size();
  R.working_set_bytes = sharing * estimated_bytes_per_process(params.nx, params.ny, params.nz);
  return R;
}

}  // namespace kiln::hpcg
