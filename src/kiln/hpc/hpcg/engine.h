#pragma once
// Engine: one implementation of HPCG's kernels over one problem, on one device. The benchmark
// (CG, multigrid, validation, timing) is written once against this interface; engines differ in
// data layout and kernels only:
//   reference      natural order, the ComputeX_ref twins (reference.h), on the CPU
//   cpu-optimized  coloured sliced ELL, multi-coloured SymGS, fused kernels, on the CPU
//   cuda           the same layout and algorithms as GPU kernels
// Vectors are in the engine's own row order; upload/download speak the natural order.
#include <array>
#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/hpc/hpcg/geometry.h"
#include "kiln/hpc/hpcg/vector.h"

namespace kiln::hpcg {

// Which Gauss-Seidel order the smoother follows. Reference: natural (lexicographic) order, the
// reference's arithmetic exactly (used for the reference CG run that sets the residual target).
// Optimized: the engine's fastest order (multi-coloured), which may need more CG iterations.
enum class Ordering : std::uint8_t { Reference, Optimized };

enum class KernelKind : std::uint8_t { SpMV, SymGS, Restriction, Prolongation, Dot, Waxpby, CgUpdate, Halo, kCount };
inline constexpr int kKernelKinds = static_cast<int>(KernelKind::kCount);
const char* kernel_name(KernelKind kind);

// Per-kernel, per-level call counts, seconds and bytes moved (by the model in bytes_moved()).
struct KernelProfile {
  struct Entry {
    std::int64_t calls = 0;
    double seconds = 0.0;
    double bytes = 0.0;
    double flops = 0.0;
  };
  std::array<std::array<Entry, kMgLevels>, kKernelKinds> entries{};
  Entry& at(KernelKind k, int level) { return entries[static_cast<int>(k)][static_cast<std::size_t>(level)]; }
};

class Engine {
 public:
  Engine(std::vector<Geometry> levels, dist::Communicator comm);
  virtual ~Engine() = default;
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  virtual std::string name() const = 0;
  virtual Device device() const = 0;
  // True when the engine's optimised order is the reference's (so it needs no extra iterations).
  virtual bool natural_order_only() const { return false; }

  int levels() const { return static_cast<int>(levels_.size()); }
  const Geometry& geometry(int level) const { return levels_[static_cast<std::size_t>(level)]; }
  int local_rows(int level) const { return static_cast<int>(geometry(level).local_rows()); }
  virtual int local_columns(int level) const = 0;  // rows plus halo
  std::int64_t global_nonzeros(int level) const { return global_nonzeros_[static_cast<std::size_t>(level)]; }
  std::int64_t global_rows(int level) const { return geometry(level).global_rows(); }
  const dist::Communicator& comm() const { return comm_; }
  // Bytes of matrix and index data the engine holds (for the report's memory summary).
  virtual double matrix_bytes() const = 0;

  Vector make_vector(int level) const { return Vector(device(), static_cast<std::size_t>(local_columns(level))); }
  // Host transfers in natural order of local rows (halo excluded).
  virtual void upload(std::span<const double> natural, Vector& v, int level) = 0;
  virtual std::vector<double> download(const Vector& v, int level) = 0;
  virtual void rhs(Vector& b) = 0;  // the reference problem's right-hand side on the fine level
  virtual void fill(Vector& v, int level, double value) = 0;

  // The kernels (the reference's ComputeX; each engine's twins are in reference.h).
  void compute_spmv(int level, Vector& x, Vector& y);
  // x_is_zero: x is known to be zero on entry (the V-cycle's pre-smoothing); engines may skip the
  // terms that are zero (the result is the same).
  void compute_symgs(int level, const Vector& r, Vector& x, Ordering ordering, bool x_is_zero = false);
  // rc = (r - A x) injected onto the coarse grid: the fine-grid residual and ComputeRestriction.
  void compute_residual_restriction(int level, const Vector& r, Vector& x, Vector& rc);
  void compute_prolongation(int level, const Vector& xc, Vector& x);
  double compute_dot_product(int level, const Vector& x, const Vector& y);  // global sum
  void compute_waxpby(int level, double alpha, const Vector& x, double beta, const Vector& y, Vector& w);
  // CG's update of the iterate and residual, fused where the engine can: x += alpha p,
  // r -= alpha Ap; returns the global r.r.
  double compute_cg_update(double alpha, const Vector& p, const Vector& ap, Vector& x, Vector& r);
  // The multigrid V-cycle: x = M^-1 r on `level` (x is zeroed first).
  void compute_mg(int level, const Vector& r, Vector& x, Ordering ordering);

  virtual void copy(const Vector& from, Vector& to, int level) = 0;
  // max_i |a_i - b_i| over all processes (the reference's ComputeResidual).
  double max_abs_difference(const Vector& a, const Vector& b, int level);

  // TestCG: multiply the fine diagonal and b by the reference's exaggeration; restore_diagonal undoes
  // the matrix part (the caller keeps its own copy of b).
  virtual void exaggerate_diagonal(Vector& b) = 0;
  virtual void restore_diagonal() = 0;
  virtual void synchronize() {}

  // Bytes the kernel must move per call at `level` (the model in docs/hpcg.md).
  virtual double bytes_moved(KernelKind kind, int level) const;
  // SymGS's bytes when x starts at zero (the forward sweep skips the colours not yet relaxed).
  double symgs_zero_guess_bytes(int level) const;
  // The reference's floating-point operation count of one call (what the rating credits).
  double flops_of(KernelKind kind, int level) const;

  // Profiling times every kernel call (synchronising the device after each).
  void set_profiling(bool on) { profiling_ = on; }
  KernelProfile& profile() { return profile_; }
  void reset_profile() { profile_ = {}; }

 protected:
  virtual void spmv(int level, Vector& x, Vector& y) = 0;
  virtual void symgs(int level, const Vector& r, Vector& x, Ordering ordering, bool x_is_zero) = 0;
  virtual void residual_restriction(int level, const Vector& r, Vector& x, Vector& rc) = 0;
  virtual void prolongation(int level, const Vector& xc, Vector& x) = 0;
  virtual double local_dot(int level, const Vector& x, const Vector& y) = 0;
  virtual void waxpby(int level, double alpha, const Vector& x, double beta, const Vector& y, Vector& w) = 0;
  // Default: two WAXPBYs and a dot product.
  virtual double local_cg_update(double alpha, const Vector& p, const Vector& ap, Vector& x, Vector& r);
  virtual double local_max_abs_difference(const Vector& a, const Vector& b, int level) = 0;

  void set_global_nonzeros(std::vector<std::int64_t> local_nonzeros_per_level);
  std::int64_t local_nonzeros_of(int level) const { return local_nonzeros_[static_cast<std::size_t>(level)]; }

 private:
  class Timer;
  std::vector<Geometry> levels_;
  dist::Communicator comm_;
  std::vector<std::int64_t> global_nonzeros_;
  std::vector<std::int64_t> local_nonzeros_;
  std::vector<Vector> mg_r_, mg_x_;  // coarse-level right-hand sides and corrections
  bool profiling_ = false;
  KernelProfile profile_;
};

enum class EngineKind : std::uint8_t { Reference, CpuOptimized, Cuda };
EngineKind parse_engine_kind(const std::string& kernels, Device device);
const char* engine_kind_name(EngineKind kind);

std::unique_ptr<Engine> make_engine(EngineKind kind, std::vector<Geometry> levels, dist::Communicator comm,
                                    int device_index = 0);
std::unique_ptr<Engine> make_reference_engine(std::vector<Geometry> levels, dist::Communicator comm);
std::unique_ptr<Engine> make_cpu_engine(std::vector<Geometry> levels, dist::Communicator comm);
std::unique_ptr<Engine> make_cuda_engine(std::vector<Geometry> levels, dist::Communicator comm, int device_index);

}  // namespace kiln::hpcg
