#include "kiln/hpc/hpcg/engine.h"

#include <cmath>

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

const char* kernel_name(KernelKind kind) {
  switch (kind) {
    case KernelKind::SpMV: return "SpMV";
    case KernelKind::SymGS: return "SymGS";
    case KernelKind::Restriction: return "Residual+Restriction";
    case KernelKind::Prolongation: return "Prolongation";
    case KernelKind::Dot: return "DDOT";
    case KernelKind::Waxpby: return "WAXPBY";
    case KernelKind::CgUpdate: return "CG update (x,r,r.r)";
    case KernelKind::Halo: return "Halo exchange";
    case KernelKind::kCount: break;
  }
  return "?";
}

// Times one kernel call when profiling: synchronises so that the device's work is inside.
class Engine::Timer {
 public:
  Timer(Engine& engine, KernelKind kind, int level, double bytes = -1.0)
      : engine_(engine), kind_(kind), level_(level), bytes_(bytes < 0 ? engine.bytes_moved(kind, level) : bytes) {
    if (engine_.profiling_) {
      engine_.synchronize();
      start_ = std::chrono::steady_clock::now();
    }
  }
  ~Timer() {
    if (!engine_.profiling_) return;
    engine_.synchronize();
    auto& e = engine_.profile_.at(kind_, level_);
    e.calls += 1;
    e.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
    e.bytes += bytes_;
    e.flops += engine_.flops_of(kind_, level_);
  }
  Timer(const Timer&) = delete;
  Timer& operator=(const Timer&) = delete;

 private:
  Engine& engine_;
  KernelKind kind_;
  int level_;
  double bytes_;
  std::chrono::steady_clock::time_point start_{};
};

Engine::Engine(std::vector<Geometry> levels, dist::Communicator comm)
    : levels_(std::move(levels)), comm_(std::move(comm)) {
  KILN_CHECK(!levels_.empty() && static_cast<int>(levels_.size()) <= kMgLevels, "hpcg: {} multigrid levels",
             levels_.size());
}

void Engine::set_global_nonzeros(std::vector<std::int64_t> local) {
  local_nonzeros_ = local;
  global_nonzeros_ = local;
  comm_.all_reduce(std::span<std::int64_t>(global_nonzeros_));
}

double Engine::bytes_moved(KernelKind kind, int level) const {
  // Each pass over the matrix reads a value (8 B) and a 32-bit column index per nonzero; vectors
  // are read or written once per pass. Global counts: the figures are for the whole machine.
  auto nnz = static_cast<double>(global_nonzeros(level));
  auto n = static_cast<double>(global_rows(level));
  double nc = level + 1 < levels() ? static_cast<double>(global_rows(level + 1)) : 0.0;
  switch (kind) {
    case KernelKind::SpMV: return 12.0 * nnz + 16.0 * n;
    case KernelKind::SymGS: return 2.0 * (12.0 * nnz + 24.0 * n);  // forward and backward: r, x in, x out
    case KernelKind::Restriction: return 12.0 * nnz * (nc / n) + 8.0 * n + 16.0 * nc;  // coarse points' rows only
    case KernelKind::Prolongation: return 24.0 * nc;
    case KernelKind::Dot: return 16.0 * n;
    case KernelKind::Waxpby: return 24.0 * n;
    case KernelKind::CgUpdate: return 48.0 * n;
    case KernelKind::Halo:
    case KernelKind::kCount: break;
  }
  return 0.0;
}

double Engine::symgs_zero_guess_bytes(int level) const {
  // Forward sweep from zero: each off-diagonal slot is read in half the colours (slot offset m
  // flips parity p; of p and p^m exactly one is relaxed first), the diagonal always; no x read.
  auto nnz = static_cast<double>(global_nonzeros(level));
  auto n = static_cast<double>(global_rows(level));
  double forward = 12.0 * nnz * (13.0 / 27.0) + 8.0 * nnz / 27.0 + 16.0 * n;  // slots, diagonal value, r in, x out
  return forward + 12.0 * nnz + 24.0 * n;
}

double Engine::flops_of(KernelKind kind, int level) const {
  // The reference's operation counts (ReportResults): what the rating credits.
  auto nnz = static_cast<double>(global_nonzeros(level));
  auto n = static_cast<double>(global_rows(level));
  switch (kind) {
    case KernelKind::SpMV: return 2.0 * nnz;
    case KernelKind::SymGS: return 4.0 * nnz;
    case KernelKind::Restriction: return 2.0 * nnz;  // the fine-grid residual
    case KernelKind::Dot: return 2.0 * n;
    case KernelKind::Waxpby: return 2.0 * n;
    case KernelKind::CgUpdate: return 6.0 * n;  // two WAXPBYs and a dot product
    case KernelKind::Prolongation:
    case KernelKind::Halo:
    case KernelKind::kCount: break;
  }
  return 0.0;
}

void Engine::compute_spmv(int level, Vector& x, Vector& y) {
  Timer t(*this, KernelKind::SpMV, level);
  spmv(level, x, y);
}

void Engine::compute_symgs(int level, const Vector& r, Vector& x, Ordering ordering, bool x_is_zero) {
  bool skipping = x_is_zero && ordering == Ordering::Optimized && !natural_order_only();
  Timer t(*this, KernelKind::SymGS, level, skipping ? symgs_zero_guess_bytes(level) : -1.0);
  symgs(level, r, x, ordering, x_is_zero);
}

void Engine::compute_residual_restriction(int level, const Vector& r, Vector& x, Vector& rc) {
  Timer t(*this, KernelKind::Restriction, level);
  residual_restriction(level, r, x, rc);
}

void Engine::compute_prolongation(int level, const Vector& xc, Vector& x) {
  Timer t(*this, KernelKind::Prolongation, level);
  prolongation(level, xc, x);
}

double Engine::compute_dot_product(int level, const Vector& x, const Vector& y) {
  Timer t(*this, KernelKind::Dot, level);
  return comm_.all_reduce_value(local_dot(level, x, y));
}

void Engine::compute_waxpby(int level, double alpha, const Vector& x, double beta, const Vector& y, Vector& w) {
  Timer t(*this, KernelKind::Waxpby, level);
  waxpby(level, alpha, x, beta, y, w);
}

double Engine::compute_cg_update(double alpha, const Vector& p, const Vector& ap, Vector& x, Vector& r) {
  Timer t(*this, KernelKind::CgUpdate, 0);
  return comm_.all_reduce_value(local_cg_update(alpha, p, ap, x, r));
}

double Engine::local_cg_update(double alpha, const Vector& p, const Vector& ap, Vector& x, Vector& r) {
  waxpby(0, 1.0, x, alpha, p, x);
  waxpby(0, 1.0, r, -alpha, ap, r);
  return local_dot(0, r, r);
}

double Engine::max_abs_difference(const Vector& a, const Vector& b, int level) {
  return comm_.all_reduce_value(local_max_abs_difference(a, b, level), dist::ReduceOp::Max);
}

void Engine::compute_mg(int level, const Vector& r, Vector& x, Ordering ordering) {
  fill(x, level, 0.0);
  if (level + 1 >= levels()) {
    compute_symgs(level, r, x, ordering, true);  // the coarsest grid: one smoothing sweep
    return;
  }
  if (mg_r_.empty()) {
    mg_r_.resize(static_cast<std::size_t>(levels()));
    mg_x_.resize(static_cast<std::size_t>(levels()));
    for (int l = 1; l < levels(); ++l) {
      mg_r_[static_cast<std::size_t>(l)] = make_vector(l);
      mg_x_[static_cast<std::size_t>(l)] = make_vector(l);
    }
  }
  auto& rc = mg_r_[static_cast<std::size_t>(level + 1)];
  auto& xc = mg_x_[static_cast<std::size_t>(level + 1)];
  compute_symgs(level, r, x, ordering, true);  // pre-smoothing
  compute_residual_restriction(level, r, x, rc);
  compute_mg(level + 1, rc, xc, ordering);
  compute_prolongation(level, xc, x);
  compute_symgs(level, r, x, ordering);  // post-smoothing
}

EngineKind parse_engine_kind(const std::string& kernels, Device device) {
  if (kernels == "ref" || kernels == "reference") {
    KILN_CHECK(device.is_cpu(), "hpcg: the reference kernels run on the CPU only (asked for {})", device.str());
    return EngineKind::Reference;
  }
  KILN_CHECK(kernels == "optimized" || kernels == "opt", "hpcg: --kernels must be ref or optimized, not '{}'", kernels);
  return device.is_cuda() ? EngineKind::Cuda : EngineKind::CpuOptimized;
}

const char* engine_kind_name(EngineKind kind) {
  switch (kind) {
    case EngineKind::Reference: return "reference";
    case EngineKind::CpuOptimized: return "cpu-optimized";
    case EngineKind::Cuda: return "cuda";
  }
  return "?";
}

std::unique_ptr<Engine> make_engine(EngineKind kind, std::vector<Geometry> levels, dist::Communicator comm,
                                    int device_index) {
  switch (kind) {
    case EngineKind::Reference: return make_reference_engine(std::move(levels), std::move(comm));
    case EngineKind::CpuOptimized: return make_cpu_engine(std::move(levels), std::move(comm));
    case EngineKind::Cuda: return make_cuda_engine(std::move(levels), std::move(comm), device_index);
  }
  KILN_FAIL("hpcg: unknown engine");
}

#if !KILN_WITH_CUDA
std::unique_ptr<Engine> make_cuda_engine(std::vector<Geometry>, dist::Communicator, int) {
  KILN_FAIL("hpcg: this build has no CUDA backend (configure with KILN_CUDA=ON)");
}
#endif

}  // namespace kiln::hpcg
