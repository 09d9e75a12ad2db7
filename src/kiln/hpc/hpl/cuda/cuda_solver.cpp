// HPL on one GPU. [A|b] lives in device memory; every step of the right-looking LU is cuBLAS
// (DGEMM / DTRSM run on the FP64 tensor cores) plus the small kernels of hpl_kernels.cu.
//
// Look-ahead builds the overlap: the update stream first brings the next panel's columns up to
// date, hands them to the panel stream (a high-priority stream) through an event, and goes on
// with the rest of the trailing matrix while the panel stream factors the next panel. The next
// step's update waits for that factorisation through another event. With DEPTH 0 the panel
// stream waits for the whole update instead (no overlap), as HPL does without look-ahead.
//
// Each step's SWAP + UPDATE is: the panel's interchanges as one permutation (built on the panel
// stream) that gathers the new top rows into a contiguous buffer W, U12 = inv(L11) W as a DGEMM
// (inv(L11) also made on the panel stream; a triangular solve with cuBLAS ran at a tenth of the
// DGEMM rate), and the trailing DGEMM A22 -= L21 U12.
//
// The panel's leaves (NBMIN columns, at most kMaxLeafWidth) are each one cooperative kernel
// (panel_leaf.cu); KILN_HPL_PANEL=columns factors them column by column through cuBLAS instead,
// as before, for comparison.
#include "kiln/hpc/hpl/cuda/cuda_solver.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/hpc/hpl/panel_factorization.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/vendor/cuda.h"
// After the vendor header, which gives it the CUDA runtime types.
#include "kiln/hpc/hpl/cuda/hpl_kernels.h"
#include "kiln/hpc/hpl/cuda/panel_leaf.h"

namespace kiln::hpl {

static_assert(kCudaMaxNb == cuda::kMaxPlanWidth, "the pivot plan's width limit is the solver's NB limit");

namespace {

long device_leading_dimension(long n) {
  long ld = (n + 31) / 32 * 32;  // 256-byte aligned columns
  if (ld % 1024 == 0) ld += 32;  // avoid every column starting on the same memory channel
  return ld;
}

// Device memory from kiln's caching allocator, returned when the run ends.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, std::size_t bytes) : device_(device) {
    ptr_ = backend_for(Device::cuda(device)).allocate(bytes, device);
  }
  ~DeviceBuffer() { backend_for(Device::cuda(device_)).deallocate(ptr_, device_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <class T>
  T* as() const {
    return static_cast<T*>(ptr_);
  }

 private:
  int device_;
  void* ptr_ = nullptr;
};

class CudaEvent {
 public:
  CudaEvent() { KILN_CUDA_CHECK(cudaEventCreateWithFlags(&e_, cudaEventDisableTiming)); }
  ~CudaEvent() { cudaEventDestroy(e_); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  void record(cudaStream_t s) { KILN_CUDA_CHECK(cudaEventRecord(e_, s)); }
  void wait_on(cudaStream_t s) { KILN_CUDA_CHECK(cudaStreamWaitEvent(s, e_, 0)); }

 private:
  cudaEvent_t e_ = nullptr;
};

// The panel factorisation's stream: high priority, so its small kernels are scheduled ahead of
// the trailing update's DGEMM blocks as soon as SMs free up.
class PanelStream {
 public:
  PanelStream() {
    int least = 0, greatest = 0;
    KILN_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
    KILN_CUDA_CHECK(cudaStreamCreateWithPriority(&s_, cudaStreamNonBlocking, greatest));
  }
  ~PanelStream() {
    cudaStreamSynchronize(s_);
    cudaStreamDestroy(s_);
  }
  PanelStream(const PanelStream&) = delete;
  PanelStream& operator=(const PanelStream&) = delete;
  operator cudaStream_t() const { return s_; }

 private:
  cudaStream_t s_ = nullptr;
};

class CublasHandle {
 public:
  CublasHandle(cudaStream_t stream, cublasPointerMode_t mode) {
    KILN_CUBLAS_CHECK(cublasCreate(&h_));
    KILN_CUBLAS_CHECK(cublasSetStream(h_, stream));
    KILN_CUBLAS_CHECK(cublasSetPointerMode(h_, mode));
  }
  ~CublasHandle() { cublasDestroy(h_); }
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  operator cublasHandle_t() const { return h_; }

 private:
  cublasHandle_t h_ = nullptr;
};

constexpr double kOne = 1.0;
constexpr double kMinusOne = -1.0;
constexpr double kZero = 0.0;

bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && value == v;
}

class CudaHpl {
 public:
  CudaHpl(const RunConfig& run, int device)
      : run_(run),
        device_(device),
        guard_(device),
        n_(run.n),
        nb_(run.nb),
        lda_(device_leading_dimension(run.n)),
        matrix_(device, sizeof(double) * static_cast<std::size_t>(lda_) * (run.n + 1)),
        ipiv_(device, sizeof(int) * static_cast<std::size_t>(run.n)),
        scalars_(device, 64),
        gathered_(device, sizeof(double) * static_cast<std::size_t>(run.nb) * (run.n + 1)),
        l11_inverse_{DeviceBuffer(device, sizeof(double) * static_cast<std::size_t>(run.nb) * run.nb),
                     DeviceBuffer(device, sizeof(double) * static_cast<std::size_t>(run.nb) * run.nb)},
        plans_{DeviceBuffer(device, sizeof(int) * (1 + 3 * static_cast<std::size_t>(run.nb))),
               DeviceBuffer(device, sizeof(int) * (1 + 3 * static_cast<std::size_t>(run.nb)))},
        leaf_blocks_max_(cuda::leaf_max_blocks(device)),
        // KILN_HPL_LEAF_TILE=off keeps leaves in the matrix (the path taken when rows do not fit).
        leaf_tile_bytes_(env_is("KILN_HPL_LEAF_TILE", "off") ? 0 : cuda::leaf_tile_capacity(device)),
        leaf_scratch_(device, sizeof(double) * cuda::leaf_scratch_doubles(leaf_blocks_max_)),
        update_stream_(cuda_stream(device)),
        panel_stream_(),
        update_blas_(update_stream_, CUBLAS_POINTER_MODE_HOST),
        panel_blas_(panel_stream_, CUBLAS_POINTER_MODE_HOST),
        pivot_blas_(panel_stream_, CUBLAS_POINTER_MODE_DEVICE) {}

  RunResult run() {
    KILN_CUDA_CHECK(cuda::generate_matrix(a(), lda_, n_, run_.seed, update_stream_));
    KILN_CUDA_CHECK(cudaDeviceSynchronize());
    auto start = std::chrono::steady_clock::now();
    factor();
    auto factored = std::chrono::steady_clock::now();
    std::vector<double> x = back_substitute();
    auto end = std::chrono::steady_clock::now();
    double seconds = std::chrono::duration<double>(end - start).count();
    if (phases_) {
      // Host clock from the start: the factorisation is fully enqueued at `factored`, so only
      // the total is exact; the panel sum says how much work the overlap had to hide.
      std::fprintf(stderr,
                   "kiln hpl phases (cuda, s): N=%ld NB=%ld panels (panel stream, summed) %.3f  enqueue %.3f  "
                   "total %.3f\n",
                   n_, nb_, panel_seconds(), std::chrono::duration<double>(factored - start).count(), seconds);
      print_update_phases();
    }
    RunResult result = check(x);
    result.seconds = seconds;
    result.gflops = hpl_flops(static_cast<double>(n_)) / seconds / 1e9;
    return result;
  }

 private:
  double* a() const { return matrix_.as<double>(); }
  double* at(long i, long j) const { return a() + j * lda_ + i; }
  int* amax_index() const { return scalars_.as<int>(); }
  double* inverse_pivot() const { return scalars_.as<double>() + 1; }

  // The panel engine (panel_factorization.h) on the panel stream. One GPU holds every row, so
  // Top is the pivot rows in place and "active rows" are simply the rows below.
  class PanelEngine {
   public:
    PanelEngine(CudaHpl& h, long j, int jb) : h_(h), j_(j), jb_(jb), m_(h.n_ - j) {}

    void factor_column(int k) {
      double* column = p(k, k);
      KILN_CUBLAS_CHECK(cublasIdamax(h_.pivot_blas_, static_cast<int>(m_ - k), column, 1, h_.amax_index()));
      KILN_CUDA_CHECK(cuda::swap_pivot_row(p(0, 0), h_.lda_, jb_, k, j_, h_.amax_index(), h_.ipiv_.as<int>(),
                                           h_.inverse_pivot(), h_.panel_stream_));
      if (m_ - k > 1)
        KILN_CUBLAS_CHECK(cublasDscal(h_.pivot_blas_, static_cast<int>(m_ - k - 1), h_.inverse_pivot(), column + 1, 1));
    }

    // A leaf in one cooperative kernel: enough blocks for leaf_rows_ rows each, at most one per SM.
    bool factor_leaf(int k0, int n) {
      if (!h_.fused_leaf_ || n > cuda::kMaxLeafWidth) return false;
      const long rows = m_ - k0;
      // Blocks of at most leaf_rows_ rows; more if that makes each block's rows fit in shared
      // memory (and one block per SM allows it).
      const long most = h_.leaf_blocks_max_;
      const long fit = std::max(1L, static_cast<long>(h_.leaf_tile_bytes_ / (sizeof(double) * n)));
      long wanted = (rows + h_.leaf_rows_ - 1) / h_.leaf_rows_;
      if ((rows + fit - 1) / fit <= most) wanted = std::max(wanted, (rows + fit - 1) / fit);
      const int blocks = static_cast<int>(std::clamp(wanted, 1L, most));
      KILN_CUDA_CHECK(cuda::factor_leaf(p(0, 0), h_.lda_, m_, jb_, k0, n, j_, h_.ipiv_.as<int>(),
                                        h_.leaf_scratch_.as<double>(), blocks, h_.panel_stream_, h_.leaf_tile_bytes_));
      return true;
    }

    void solve_top(int r0, int r1, int c0, int c1) {
      if (r1 - r0 <= 1 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDtrsm(h_.panel_blas_, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N,
                                    CUBLAS_DIAG_UNIT, r1 - r0, c1 - c0, &kOne, p(r0, r0), ld(), p(r0, c0), ld()));
    }

    void update_top(int r0, int r1, int k0, int k1, int c0, int c1) {
      if (r1 <= r0 || k1 <= k0 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDgemm(h_.panel_blas_, CUBLAS_OP_N, CUBLAS_OP_N, r1 - r0, c1 - c0, k1 - k0, &kMinusOne,
                                    p(r0, k0), ld(), p(k0, c0), ld(), &kOne, p(r0, c0), ld()));
    }

    void update_active(int first, int k0, int k1, int c0, int c1) {
      const long rows = m_ - first;
      if (rows <= 0 || k1 <= k0 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDgemm(h_.panel_blas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(rows), c1 - c0, k1 - k0,
                                    &kMinusOne, p(first, k0), ld(), p(k0, c0), ld(), &kOne, p(first, c0), ld()));
    }

   private:
    double* p(long r, long c) const { return h_.at(j_ + r, j_ + c); }
    int ld() const { return static_cast<int>(h_.lda_); }
    CudaHpl& h_;
    long j_;
    int jb_;
    long m_;
  };

  void factor_panel(long j, int jb) {
    // With KILN_HPL_PHASES=1 every panel is bracketed by timing events on the panel stream.
    if (phases_) {
      panel_events_.emplace_back();
      for (cudaEvent_t* e : {&panel_events_.back().first, &panel_events_.back().second})
        KILN_CUDA_CHECK(cudaEventCreate(e));
      KILN_CUDA_CHECK(cudaEventRecord(panel_events_.back().first, panel_stream_));
    }
    factor_panel_untimed(j, jb);
    prepare_update(j, jb);
    if (phases_) KILN_CUDA_CHECK(cudaEventRecord(panel_events_.back().second, panel_stream_));
  }

  // What the update of step j needs from its panel, made on the panel stream: the interchanges as
  // one permutation, and inv(L11) (unit lower, |L| <= 1 by partial pivoting) by a triangular
  // solve against the identity.
  void prepare_update(long j, int jb) {
    const int parity = static_cast<int>((j / nb_) & 1);
    KILN_CUDA_CHECK(cuda::build_pivot_plan(ipiv_.as<int>(), j, jb, plans_[parity].as<int>(), panel_stream_));
    double* inverse = l11_inverse_[parity].as<double>();
    KILN_CUDA_CHECK(cuda::set_identity(inverse, jb, panel_stream_));
    KILN_CUBLAS_CHECK(cublasDtrsm(panel_blas_, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_N, CUBLAS_DIAG_UNIT,
                                  jb, jb, &kOne, at(j, j), static_cast<int>(lda_), inverse, jb));
  }

  // Sum of the panel factorisations' device time; the events are released.
  double panel_seconds() {
    double total = 0;
    for (auto& [start, stop] : panel_events_) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      total += ms / 1e3;
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
    }
    panel_events_.clear();
    return total;
  }

  void factor_panel_untimed(long j, int jb) {
    PanelEngine engine(*this, j, jb);
    PanelOptions options{run_.pfact, run_.rfact, run_.nbmin, run_.ndiv};
    // Fused leaves are at most kMaxLeafWidth wide: a larger NBMIN recurses further down to them.
    if (fused_leaf_) options.nbmin = std::min(options.nbmin, cuda::kMaxLeafWidth);
    factor_panel_node(engine, 0, jb, options);
  }

  // SWAP + UPDATE of columns [c0, c1) with the panel at j on the update stream.
  void update(long j, int jb, long c0, long c1) {
    if (c1 <= c0) return;
    const int width = static_cast<int>(c1 - c0);
    const int ld = static_cast<int>(lda_);
    const long below = n_ - (j + jb);
    UpdateEvents* events = phases_ ? &update_events_.emplace_back() : nullptr;
    if (events) {
      for (cudaEvent_t& e : events->marks) KILN_CUDA_CHECK(cudaEventCreate(&e));
      events->gemm_flops = 2.0 * static_cast<double>(below) * width * jb;
    }
    auto mark = [&](int i) {
      if (events) KILN_CUDA_CHECK(cudaEventRecord(events->marks[i], update_stream_));
    };
    const int parity = static_cast<int>((j / nb_) & 1);
    double* w = gathered_.as<double>();
    mark(0);
    KILN_CUDA_CHECK(cuda::swap_gather(a(), lda_, j, jb, plans_[parity].as<int>(), w, c0, c1, update_stream_));
    mark(1);
    KILN_CUBLAS_CHECK(cublasDgemm(update_blas_, CUBLAS_OP_N, CUBLAS_OP_N, jb, width, jb, &kOne,
                                  l11_inverse_[parity].as<double>(), jb, w, jb, &kZero, at(j, c0), ld));
    mark(2);
    if (below > 0)
      KILN_CUBLAS_CHECK(cublasDgemm(update_blas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(below), width, jb,
                                    &kMinusOne, at(j + jb, j), ld, at(j, c0), ld, &kOne, at(j + jb, c0), ld));
    mark(3);
  }

  // KILN_HPL_PHASES=1: where the update stream's time went. Gaps between one update's end and the
  // next one's start are the update stream waiting (for a panel, or for the host to enqueue).
  void print_update_phases() {
    double swaps = 0, u12 = 0, gemm = 0, idle = 0, flops = 0;
    for (std::size_t i = 0; i < update_events_.size(); ++i) {
      auto& m = update_events_[i].marks;
      KILN_CUDA_CHECK(cudaEventSynchronize(m[3]));
      swaps += seconds_between(m[0], m[1]);
      u12 += seconds_between(m[1], m[2]);
      gemm += seconds_between(m[2], m[3]);
      flops += update_events_[i].gemm_flops;
      if (i > 0) idle += seconds_between(update_events_[i - 1].marks[3], m[0]);
    }
    std::fprintf(stderr,
                 "kiln hpl update stream (cuda, s): swaps %.3f  U12 %.3f  gemm %.3f (%.1f TFLOP/s)  idle between "
                 "updates %.3f\n",
                 swaps, u12, gemm, gemm > 0 ? flops / gemm / 1e12 : 0.0, idle);
    for (auto& u : update_events_)
      for (cudaEvent_t e : u.marks) cudaEventDestroy(e);
    update_events_.clear();
  }

  static double seconds_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms / 1e3;
  }

  void factor() {
    CudaEvent panel_done, next_ready;
    // The first panel: nothing to overlap with.
    next_ready.record(update_stream_);
    next_ready.wait_on(panel_stream_);
    factor_panel(0, static_cast<int>(std::min(nb_, n_)));
    panel_done.record(panel_stream_);
    for (long j = 0; j < n_; j += nb_) {
      const int jb = static_cast<int>(std::min(nb_, n_ - j));
      const long next = j + jb;
      panel_done.wait_on(update_stream_);
      if (next >= n_) {
        update(j, jb, n_, n_ + 1);  // only b is left
        break;
      }
      const int jbn = static_cast<int>(std::min(nb_, n_ - next));
      if (run_.depth >= 1) {
        update(j, jb, next, next + jbn);
        next_ready.record(update_stream_);
        next_ready.wait_on(panel_stream_);
        factor_panel(next, jbn);
        panel_done.record(panel_stream_);
        update(j, jb, next + jbn, n_ + 1);
      } else {
        update(j, jb, next, n_ + 1);
        next_ready.record(update_stream_);
        next_ready.wait_on(panel_stream_);
        factor_panel(next, jbn);
        panel_done.record(panel_stream_);
      }
    }
  }

  // U x = y, y being the transformed b (column n): block by block from the bottom, a small
  // triangular solve on the diagonal block and a matrix-vector product for the rows above.
  std::vector<double> back_substitute() {
    double* y = at(0, n_);
    const int ld = static_cast<int>(lda_);
    const long blocks = (n_ + nb_ - 1) / nb_;
    for (long kb = blocks - 1; kb >= 0; --kb) {
      const long k0 = kb * nb_;
      const int kbs = static_cast<int>(std::min(nb_, n_ - k0));
      KILN_CUBLAS_CHECK(cublasDtrsv(update_blas_, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_NON_UNIT, kbs,
                                    at(k0, k0), ld, y + k0, 1));
      if (k0 > 0)
        KILN_CUBLAS_CHECK(cublasDgemv(update_blas_, CUBLAS_OP_N, static_cast<int>(k0), kbs, &kMinusOne, at(0, k0), ld,
                                      y + k0, 1, &kOne, y, 1));
    }
    std::vector<double> x(static_cast<std::size_t>(n_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(x.data(), y, sizeof(double) * n_, cudaMemcpyDeviceToHost, update_stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(update_stream_));
    return x;
  }

  RunResult check(const std::vector<double>& x) {
    // The factors are no longer needed: their memory holds x and the three vectors of the check.
    double* d_x = a();
    double* d_r = d_x + n_;
    double* d_abs = d_r + n_;
    double* d_b = d_abs + n_;
    KILN_CUDA_CHECK(cudaMemcpyAsync(d_x, x.data(), sizeof(double) * n_, cudaMemcpyHostToDevice, update_stream_));
    KILN_CUDA_CHECK(cudaMemsetAsync(d_r, 0, sizeof(double) * 3 * n_, update_stream_));
    KILN_CUDA_CHECK(cuda::residual_parts(d_x, n_, run_.seed, d_r, d_abs, d_b, update_stream_));
    std::vector<double> host(static_cast<std::size_t>(3 * n_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(host.data(), d_r, sizeof(double) * 3 * n_, cudaMemcpyDeviceToHost, update_stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(update_stream_));
    RunResult r;
    for (long i = 0; i < n_; ++i) {
      r.norm_r = std::max(r.norm_r, std::fabs(host[i]));
      r.norm_a = std::max(r.norm_a, host[n_ + i]);
      r.norm_b = std::max(r.norm_b, std::fabs(host[2 * n_ + i]));
    }
    for (double v : x) r.norm_x = std::max(r.norm_x, std::fabs(v));
    const double eps = std::numeric_limits<double>::epsilon() / 2;
    r.residual = r.norm_r / (eps * (r.norm_a * r.norm_x + r.norm_b) * static_cast<double>(n_));
    r.passed = std::isfinite(r.residual) && r.residual < run_.threshold;
    return r;
  }

  const RunConfig& run_;
  bool phases_ = std::getenv("KILN_HPL_PHASES") != nullptr;
  // Rows per block of a fused leaf (KILN_HPL_LEAF_ROWS): fewer blocks leave more SMs to the
  // concurrent update, more finish the leaf sooner.
  long leaf_rows_ =
      std::getenv("KILN_HPL_LEAF_ROWS") ? std::max(64L, std::atol(std::getenv("KILN_HPL_LEAF_ROWS"))) : 1024;
  bool fused_leaf_ = !env_is("KILN_HPL_PANEL", "columns");
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> panel_events_;
  struct UpdateEvents {
    cudaEvent_t marks[4];  // before the swaps, after them, after U12 = inv(L11) W, after the GEMM
    double gemm_flops = 0;
  };
  std::vector<UpdateEvents> update_events_;
  int device_;
  DeviceGuard guard_;
  long n_, nb_, lda_;
  DeviceBuffer matrix_, ipiv_, scalars_;
  DeviceBuffer gathered_;        // W: the new top rows of the columns being updated (nb x width)
  DeviceBuffer l11_inverse_[2];  // inv(L11) of the panel, by step parity (the panel stream makes
  DeviceBuffer plans_[2];        // step s+1's while the update stream still uses step s's)
  int leaf_blocks_max_;
  std::size_t leaf_tile_bytes_;
  DeviceBuffer leaf_scratch_;
  cudaStream_t update_stream_;  // kiln's compute stream of the device
  PanelStream panel_stream_;
  CublasHandle update_blas_, panel_blas_, pivot_blas_;
};

}  // namespace

RunResult solve_on_cuda(const RunConfig& run, int device_index) {
  RunResult result;
  {
    CudaHpl hpl(run, device_index);
    result = hpl.run();
  }
  // Give the matrix back to the driver so the next run of a sweep (another N) can have it.
  backend_for(Device::cuda(device_index)).empty_cache(device_index);
  return result;
}

std::size_t cuda_bytes(const RunConfig& run) {
  const std::size_t matrix = sizeof(double) * static_cast<std::size_t>(device_leading_dimension(run.n)) * (run.n + 1);
  const std::size_t pivots = sizeof(int) * static_cast<std::size_t>(run.n);
  const std::size_t gathered = sizeof(double) * static_cast<std::size_t>(run.nb) * (run.n + 1);
  const std::size_t inverses = 2 * sizeof(double) * static_cast<std::size_t>(run.nb) * run.nb;
  // Plus the plans, the leaf scratch, cuBLAS workspaces and the allocator's 2 MiB rounding.
  return matrix + pivots + gathered + inverses + (std::size_t{256} << 20);
}

}  // namespace kiln::hpl
