// HPL on one GPU. [A|b] lives in device memory; every step of the right-looking LU is cuBLAS
// (DGEMM / DTRSM run on the FP64 tensor cores) plus the small kernels of hpl_kernels.cu.
//
// [A|b] is stored by rows: entry (i, c) at a[i * ld + c], i.e. column-major storage of its
// transpose. Partial pivoting moves rows, and a row is then contiguous: the row swaps copy whole
// rows instead of one 8-byte entry per column, each in its own 32-byte sector (0.62 of 23.6 s at
// N=120000 when the matrix was stored by columns). Every BLAS call below is the column-major call
// for the transposed blocks: C -= X Y on blocks of A is C^T -= Y^T X^T, a lower triangle of A is an
// upper one of A^T, and a block's top-left entry at(r, c) is the same address either way.
//
// Look-ahead builds the overlap: the update stream first brings the next panel's columns up to
// date, hands them to the panel stream (a high-priority stream) through an event, and goes on
// with the rest of the trailing matrix while the panel stream factors the next panel. The next
// step's update waits for that factorisation through another event. With DEPTH 0 the panel
// stream waits for the whole update instead (no overlap), as HPL does without look-ahead.
//
// Each step's SWAP + UPDATE is: the panel's interchanges as one permutation (built on the panel
// stream) that gathers the new top rows into a buffer W (a chunk of columns at a time when W is
// narrower than the matrix: w_columns), U12 = inv(L11) W as a DGEMM
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
#include <memory>
#include <optional>
#include <string_view>
#include <utility>
#include <vector>

#include "kiln/hpc/hpl/panel_factorization.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/event.h"
#include "kiln/runtime/stream.h"
#include "kiln/runtime/vendor/cuda.h"
// After the vendor header, which gives it the CUDA runtime types.
#include "kiln/hpc/hpl/cuda/hpl_kernels.h"
#include "kiln/hpc/hpl/cuda/lt_dgemm.h"
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

// The CUDA stream behind a runtime Stream, for kernel launches and library calls.
cudaStream_t native(const Stream& s) { return static_cast<cudaStream_t>(s.handle); }

// An ordering event (no timing) on the solver's device.
Event ordering_event(int device) { return Event(Device::cuda(device), /*timing=*/false); }

// A side stream from the runtime's pool. The panel factorisation's and the swap stream's are high
// priority, so their small kernels are scheduled ahead of the trailing update's DGEMM blocks as
// soon as SMs free up (at equal priority a chunk's swaps would wait for every block of the DGEMM
// before them).
Stream side_stream(int device, bool high_priority) {
  return Stream::from_pool(Device::cuda(device), high_priority ? StreamPriority::High : StreamPriority::Normal);
}

// A cuBLAS handle bound to one stream (cuBLAS's own object, not the runtime's).
class CublasHandle {
 public:
  CublasHandle(const Stream& stream, cublasPointerMode_t mode) {
    KILN_CUBLAS_CHECK(cublasCreate(&h_));
    KILN_CUBLAS_CHECK(cublasSetStream(h_, native(stream)));
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

// Between the starts of consecutive rows of [A|b], stored by rows: n + 1 entries and one column of
// padding (see update_end), rounded as above.
long row_stride(long n) { return device_leading_dimension(n + 2); }

// W's width in columns, its leading dimension. The update gathers and solves the columns it
// updates in chunks of at most this many, one after another on a stream, so W need not span the
// matrix. It does when memory allows (the U12 products are fastest at full width: 0.438 s against
// 0.52 s in chunks of 32768 columns at N=120000, NB=2048); otherwise it is as wide as the free
// memory leaves, and never narrower than kNarrowestW columns, which the fit check counts on: a full
// W (NB x ld doubles, 2.2 GB at N=136000, NB=2048) kept N=136000 off a 141 GB H200.
// KILN_HPL_W_COLUMNS sets it (the tests use a few hundred to have many chunks at small N).
constexpr long kNarrowestW = 32768;
constexpr std::size_t kReserveBytes = std::size_t{256} << 20;  // plans, leaf scratch, cuBLAS, rounding
// What a W wider than the narrowest leaves free besides the reserve, which is an estimate.
constexpr std::size_t kWMargin = std::size_t{512} << 20;

std::size_t bytes_besides_w(long n, long nb) {
  const std::size_t matrix = sizeof(double) * static_cast<std::size_t>(row_stride(n)) * static_cast<std::size_t>(n);
  const std::size_t pivots = sizeof(int) * static_cast<std::size_t>(n);
  const std::size_t inverses = 2 * sizeof(double) * static_cast<std::size_t>(nb) * static_cast<std::size_t>(nb);
  return matrix + pivots + inverses + kReserveBytes;
}

// W holds nb rows of `columns`, and after the factorisation the n entries of y.
std::size_t w_bytes(long n, long nb, long columns) {
  return sizeof(double) * static_cast<std::size_t>(std::max(nb * columns, n));
}

long w_columns(long n, long nb, std::size_t free_bytes) {
  const long full = row_stride(n);
  if (const char* text = std::getenv("KILN_HPL_W_COLUMNS")) {
    char* end = nullptr;
    const long columns = std::strtol(text, &end, 10);
    KILN_CHECK(end != text && *end == '\0' && columns > 0, "KILN_HPL_W_COLUMNS='{}': expected a positive integer",
               text);
    return std::min(device_leading_dimension(columns), full);
  }
  const std::size_t besides = bytes_besides_w(n, nb) + kWMargin;
  if (besides + w_bytes(n, nb, full) <= free_bytes) return full;
  const long fits = free_bytes > besides ? static_cast<long>((free_bytes - besides) / sizeof(double)) / nb : 0;
  return std::min(full, std::max(kNarrowestW, fits / 32 * 32));
}

bool env_is(const char* name, std::string_view value) {
  const char* v = std::getenv(name);
  return v != nullptr && value == v;
}

// An integer knob from the environment, or `fallback` when it is not set.
long env_long(const char* name, long fallback) {
  const char* v = std::getenv(name);
  return v != nullptr ? std::atol(v) : fallback;
}

class CudaHpl {
 public:
  CudaHpl(const RunConfig& run, int device)
      : run_(run),
        device_(device),
        guard_(device),
        n_(run.n),
        nb_(run.nb),
        ld_(row_stride(run.n)),
        ldw_(w_columns(run.n, run.nb, backend_for(Device::cuda(device)).properties(device).free_memory)),
        matrix_(device, sizeof(double) * static_cast<std::size_t>(ld_) * run.n),
        ipiv_(device, sizeof(int) * static_cast<std::size_t>(run.n)),
        scalars_(device, 64),
        gathered_(device, w_bytes(run.n, run.nb, ldw_)),
        l11_inverse_{DeviceBuffer(device, sizeof(double) * static_cast<std::size_t>(run.nb) * run.nb),
                     DeviceBuffer(device, sizeof(double) * static_cast<std::size_t>(run.nb) * run.nb)},
        plans_{DeviceBuffer(device, sizeof(int) * (1 + 3 * static_cast<std::size_t>(run.nb))),
               DeviceBuffer(device, sizeof(int) * (1 + 3 * static_cast<std::size_t>(run.nb)))},
        leaf_blocks_max_(cuda::leaf_max_blocks(device)),
        // KILN_HPL_LEAF_TILE=off keeps leaves in the matrix (the path taken when rows do not fit).
        leaf_tile_bytes_(env_is("KILN_HPL_LEAF_TILE", "off") ? 0 : cuda::leaf_tile_capacity(device)),
        leaf_scratch_(device, sizeof(double) * cuda::leaf_scratch_doubles(leaf_blocks_max_)),
        update_stream_(Stream::current(Device::cuda(device))),
        panel_stream_(side_stream(device, true)),
        // KILN_HPL_SWAP_PRIORITY=low: the swap stream's blocks queue behind the DGEMM's.
        swap_stream_(side_stream(device, !env_is("KILN_HPL_SWAP_PRIORITY", "low"))),
        update_blas_(update_stream_, CUBLAS_POINTER_MODE_HOST),
        panel_blas_(panel_stream_, CUBLAS_POINTER_MODE_HOST),
        swap_blas_(swap_stream_, CUBLAS_POINTER_MODE_HOST),
        pivot_blas_(panel_stream_, CUBLAS_POINTER_MODE_DEVICE) {
    if (const char* tail = std::getenv("KILN_HPL_TAIL")) {
      char* rest = nullptr;
      tail_rows_ = std::strtol(tail, &rest, 10);
      if (rest != nullptr && *rest == ':') tail_width_ = std::strtol(rest + 1, &rest, 10);
      KILN_CHECK(rest != nullptr && *rest == '\0' && tail_rows_ > 0 && tail_width_ > 0 && tail_width_ <= nb_,
                 "KILN_HPL_TAIL='{}': expected ROWS:WIDTH with 0 < WIDTH <= NB ({})", tail, nb_);
    }
  }

  // The side streams belong to the runtime's pool and outlive the solver: their work must be done
  // before the buffers it uses go back to the allocator (as the streams' own destructor did).
  ~CudaHpl() {
    try {
      panel_stream_.synchronize();
      swap_stream_.synchronize();
    } catch (...) {  // a destructor must not throw; the error was reported by the failing call
    }
  }
  CudaHpl(const CudaHpl&) = delete;
  CudaHpl& operator=(const CudaHpl&) = delete;

  RunResult run() {
    KILN_CUDA_CHECK(cuda::generate_matrix_rows(a(), ld_, n_, run_.seed, native(update_stream_)));
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
      const double panels = panel_seconds();  // sets first_panel_seconds_
      std::fprintf(stderr,
                   "kiln hpl phases (cuda, s): N=%ld NB=%ld panels (panel stream, summed) %.3f (first %.3f)  "
                   "enqueue %.3f  total %.3f\n",
                   n_, nb_, panels, first_panel_seconds_, std::chrono::duration<double>(factored - start).count(),
                   seconds);
      print_update_phases();
    }
    RunResult result = check(x);
    result.seconds = seconds;
    result.gflops = hpl_flops(static_cast<double>(n_)) / seconds / 1e9;
    return result;
  }

 private:
  double* a() const { return matrix_.as<double>(); }
  double* at(long i, long j) const { return a() + i * ld_ + j; }  // entry (i, j) of [A|b], stored by rows
  int* amax_index() const { return scalars_.as<int>(); }
  double* inverse_pivot() const { return scalars_.as<double>() + 1; }

  // The panel engine (panel_factorization.h) on the panel stream. One GPU holds every row, so
  // Top is the pivot rows in place and "active rows" are simply the rows below.
  class PanelEngine {
   public:
    PanelEngine(CudaHpl& h, long j, int jb) : h_(h), j_(j), jb_(jb), m_(h.n_ - j) {}

    void factor_column(int k) {
      double* column = p(k, k);  // down a column: one row (ld) per entry
      KILN_CUBLAS_CHECK(cublasIdamax(h_.pivot_blas_, static_cast<int>(m_ - k), column, ld(), h_.amax_index()));
      KILN_CUDA_CHECK(cuda::swap_pivot_row(p(0, 0), h_.ld_, jb_, k, j_, h_.amax_index(), h_.ipiv_.as<int>(),
                                           h_.inverse_pivot(), native(h_.panel_stream_)));
      if (m_ - k > 1)
        KILN_CUBLAS_CHECK(
            cublasDscal(h_.pivot_blas_, static_cast<int>(m_ - k - 1), h_.inverse_pivot(), p(k + 1, k), ld()));
    }

    // A leaf in one cooperative kernel: enough blocks for leaf_rows_ rows each, at most one per SM.
    bool factor_leaf(int k0, int n) {
      if (!h_.fused_leaf_ || n > cuda::kMaxLeafWidth) return false;
      const long rows = m_ - k0;
      // Blocks of at most leaf_rows_ rows; more if that makes each block's rows fit in shared
      // memory (and one block per SM allows it).
      const long most = h_.leaf_blocks_max_;
      // (one row less than the bytes allow: the tile's columns are padded to an odd length)
      const long fit = std::max(1L, static_cast<long>(h_.leaf_tile_bytes_ / (sizeof(double) * n)) - 1);
      long wanted = (rows + h_.leaf_rows_ - 1) / h_.leaf_rows_;
      if ((rows + fit - 1) / fit <= most) wanted = std::max(wanted, (rows + fit - 1) / fit);
      const int blocks = static_cast<int>(std::clamp(wanted, 1L, most));
      KILN_CUDA_CHECK(cuda::factor_leaf(p(0, 0), h_.ld_, m_, jb_, k0, n, j_, h_.ipiv_.as<int>(),
                                        h_.leaf_scratch_.as<double>(), blocks, native(h_.panel_stream_),
                                        h_.leaf_tile_bytes_, h_.leaf_swap_blocks_));
      return true;
    }

    // Top = L^-1 Top is Top^T = Top^T L^-T: L^T is upper in the row storage.
    void solve_top(int r0, int r1, int c0, int c1) {
      if (r1 - r0 <= 1 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDtrsm(h_.panel_blas_, CUBLAS_SIDE_RIGHT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N,
                                    CUBLAS_DIAG_UNIT, c1 - c0, r1 - r0, &kOne, p(r0, r0), ld(), p(r0, c0), ld()));
    }

    void update_top(int r0, int r1, int k0, int k1, int c0, int c1) {
      if (r1 <= r0 || k1 <= k0 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDgemm(h_.panel_blas_, CUBLAS_OP_N, CUBLAS_OP_N, c1 - c0, r1 - r0, k1 - k0, &kMinusOne,
                                    p(k0, c0), ld(), p(r0, k0), ld(), &kOne, p(r0, c0), ld()));
    }

    void update_active(int first, int k0, int k1, int c0, int c1) {
      const long rows = m_ - first;
      if (rows <= 0 || k1 <= k0 || c1 <= c0) return;
      KILN_CUBLAS_CHECK(cublasDgemm(h_.panel_blas_, CUBLAS_OP_N, CUBLAS_OP_N, c1 - c0, static_cast<int>(rows), k1 - k0,
                                    &kMinusOne, p(k0, c0), ld(), p(first, k0), ld(), &kOne, p(first, c0), ld()));
    }

   private:
    double* p(long r, long c) const { return h_.at(j_ + r, j_ + c); }
    int ld() const { return static_cast<int>(h_.ld_); }
    CudaHpl& h_;
    long j_;
    int jb_;
    long m_;
  };

  void factor_panel(long j, int jb, int parity) {
    // With KILN_HPL_PHASES=1 every panel is bracketed by timing events on the panel stream.
    if (phases_) {
      panel_events_.emplace_back();
      for (cudaEvent_t* e : {&panel_events_.back().first, &panel_events_.back().second})
        KILN_CUDA_CHECK(cudaEventCreate(e));
      KILN_CUDA_CHECK(cudaEventRecord(panel_events_.back().first, native(panel_stream_)));
    }
    factor_panel_untimed(j, jb);
    prepare_update(j, jb, parity);
    if (phases_) KILN_CUDA_CHECK(cudaEventRecord(panel_events_.back().second, native(panel_stream_)));
  }

  // What the update of step j needs from its panel, made on the panel stream: the interchanges as
  // one permutation, and inv(L11)^T (L11 unit lower, |L| <= 1 by partial pivoting; L11^T is what
  // the row storage holds, upper) by a triangular solve against the identity.
  void prepare_update(long j, int jb, int parity) {
    KILN_CUDA_CHECK(cuda::build_pivot_plan(ipiv_.as<int>(), j, jb, plans_[parity].as<int>(), native(panel_stream_)));
    double* inverse = l11_inverse_[parity].as<double>();
    KILN_CUDA_CHECK(cuda::set_identity(inverse, jb, native(panel_stream_)));
    KILN_CUBLAS_CHECK(cublasDtrsm(panel_blas_, CUBLAS_SIDE_LEFT, CUBLAS_FILL_MODE_UPPER, CUBLAS_OP_N, CUBLAS_DIAG_UNIT,
                                  jb, jb, &kOne, at(j, j), static_cast<int>(ld_), inverse, jb));
  }

  // Sum of the panel factorisations' device time (each step's in panel_ms_); the events are released.
  double panel_seconds() {
    double total = 0;
    first_panel_seconds_ = 0;
    panel_ms_.clear();
    for (auto& [start, stop] : panel_events_) {
      float ms = 0;
      KILN_CUDA_CHECK(cudaEventSynchronize(stop));
      KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      if (panel_ms_.empty()) first_panel_seconds_ = ms / 1e3;  // nothing overlaps the first panel
      panel_ms_.push_back(ms);
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

  // SWAP + UPDATE of columns [c0, c1) with the panel at j, finishing on the update stream.
  //
  // With KILN_HPL_SWAP_CHUNK=C a wide update is cut into chunks of C columns: the swap stream does
  // SWAP + U12 of chunk i+1 while the update stream runs chunk i's DGEMM, so only the first
  // chunk's SWAP + U12 is exposed. On the H200 this hid the swaps (0.6 s of 23.7 at N=120000 when
  // the matrix was stored by columns) but slowed the DGEMM by as much (it runs at the 700 W power
  // cap, and the overlapped work draws from the same budget), so the default is 0: no chunks,
  // everything in order on the update stream.
  void update(long j, int jb, int parity, long c0, long c1) {
    if (c1 <= c0) return;
    const int* plan = plans_[parity].as<int>();
    const double* inverse = l11_inverse_[parity].as<double>();
    // W (jb rows, ldw_ apart) holds one chunk of columns at a time, its first column at w[0]. The
    // chunks that share it follow one another on one stream (a chunk's U12 has read W before the
    // next chunk's gather writes it); the DGEMMs read U12 from the matrix, not from W.
    double* w = gathered_.as<double>();
    const long width = c1 - c0;
    if (swap_chunk_ <= 0 || width <= swap_chunk_) {
      for (long b0 = c0; b0 < c1; b0 += ldw_) {
        const long b1 = std::min(c1, b0 + ldw_);
        timed(kSwapPhase, 0,
              [&] { KILN_CUDA_CHECK(cuda::swap_gather(a(), ld_, jb, plan, w, ldw_, b0, b1, native(update_stream_))); });
        timed(kU12Phase, 0, [&] { solve_u12(update_blas_, j, jb, inverse, w, b0, static_cast<int>(b1 - b0)); });
      }
      trailing_gemm(j, jb, c0, c1);
      return;
    }
    // The swap stream starts when everything before on the update stream (the previous step's
    // DGEMM on these columns, and any earlier use of W) is done.
    update_started_.record(update_stream_);
    update_started_.wait(swap_stream_);
    const long chunk = std::min(swap_chunk_, ldw_);
    const long chunks = (width + chunk - 1) / chunk;
    while (static_cast<long>(chunk_ready_.size()) < chunks) chunk_ready_.push_back(ordering_event(device_));
    for (long i = 0; i < chunks; ++i) {
      const long b0 = c0 + i * chunk, b1 = std::min(c1, b0 + chunk);
      KILN_CUDA_CHECK(cuda::swap_gather(a(), ld_, jb, plan, w, ldw_, b0, b1, native(swap_stream_)));
      solve_u12(swap_blas_, j, jb, inverse, w, b0, static_cast<int>(b1 - b0));
      chunk_ready_[static_cast<std::size_t>(i)].record(swap_stream_);
    }
    // The update stream goes on only once every chunk is in, so W is free again after this call.
    for (long i = 0; i < chunks; ++i) {
      const long b0 = c0 + i * chunk, b1 = std::min(c1, b0 + chunk);
      chunk_ready_[static_cast<std::size_t>(i)].wait(update_stream_);
      trailing_gemm(j, jb, b0, b1);
    }
  }

  // A22 -= L21 U12 for columns [c0, c1) on the update stream.
  void trailing_gemm(long j, int jb, long c0, long c1) {
    const long below = n_ - (j + jb);
    if (below <= 0) return;
    const int ld = static_cast<int>(ld_);
    // A22^T -= U12^T L21^T in the row storage.
    timed(kGemmPhase, 2.0 * static_cast<double>(below) * static_cast<double>(c1 - c0) * jb, [&] {
      if (lt_gemm_ &&
          lt_gemm_->run(c1 - c0, below, jb, -1.0, at(j, c0), ld_, at(j + jb, j), ld_, 1.0, at(j + jb, c0), ld_))
        return;
      KILN_CUBLAS_CHECK(cublasDgemm(update_blas_, CUBLAS_OP_N, CUBLAS_OP_N, static_cast<int>(c1 - c0),
                                    static_cast<int>(below), jb, &kMinusOne, at(j, c0), ld, at(j + jb, j), ld, &kOne,
                                    at(j + jb, c0), ld));
    });
  }

  // Runs `enqueue` (work on the update stream); with KILN_HPL_PHASES=1 brackets it with events.
  template <class Enqueue>
  void timed(int phase, double flops, Enqueue&& enqueue) {
    if (!phases_) {
      enqueue();
      return;
    }
    Interval& t = intervals_.emplace_back();
    t.phase = phase;
    t.flops = flops;
    t.step = current_step_;
    KILN_CUDA_CHECK(cudaEventCreate(&t.begin));
    KILN_CUDA_CHECK(cudaEventCreate(&t.end));
    KILN_CUDA_CHECK(cudaEventRecord(t.begin, native(update_stream_)));
    enqueue();
    KILN_CUDA_CHECK(cudaEventRecord(t.end, native(update_stream_)));
  }

  // U12 = inv(L11) W for `width` columns from c0, W (jb rows, ldw_ apart, column c0 at w[0])
  // being the gathered new top rows; U12 goes into the matrix's top rows. In the row storage each
  // product below is its transpose, U12^T = W^T inv(L11)^T, with `inverse` holding inv(L11)^T.
  // A triangular solve through cuBLAS runs at a tenth of the DGEMM rate, so the solve is DGEMMs
  // with inv(L11): one with all of it costs 2 jb^2 flops per column, twice a solve's. In halves,
  //   U1 = inv(L11)_11 W1,  W2 -= (L11)_21 U1,  U2 = inv(L11)_22 W2,
  // it costs 1.5 jb^2 (the diagonal blocks of inv(L11) are the inverses of L11's diagonal blocks).
  // In s pieces (KILN_HPL_U12_PIECES, default 4, at least 128 rows each) it costs (1 + 1/s) jb^2,
  // in 2s - 1 smaller products: at NB=2048 and N=120000 U12 took 0.437 s in four pieces against
  // 0.465 s in two. KILN_HPL_U12=inverse keeps the single product, for comparison.
  void solve_u12(cublasHandle_t blas, long j, int jb, const double* inverse, double* w, long c0, int width) {
    const int ld = static_cast<int>(ld_), ldw = static_cast<int>(ldw_);
    if (!split_u12_ || jb < 256) {
      KILN_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, width, jb, jb, &kOne, w, ldw, inverse, jb, &kZero,
                                    at(j, c0), ld));
      return;
    }
    // Pieces of at least 128 rows, cut at multiples of 32.
    const int pieces = std::clamp(u12_pieces_, 2, jb / 128);
    int a = 0;
    for (int i = 0; i < pieces; ++i) {
      const int b = i + 1 == pieces ? jb : static_cast<int>(static_cast<long>(jb) * (i + 1) / pieces / 32 * 32);
      // U_i = inv(L11)_ii W_i, then the rows below: W_rest -= (L11)_(rest, i) U_i.
      KILN_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, width, b - a, b - a, &kOne, w + a * ldw_, ldw,
                                    inverse + static_cast<long>(a) * jb + a, jb, &kZero, at(j + a, c0), ld));
      if (b < jb)
        KILN_CUBLAS_CHECK(cublasDgemm(blas, CUBLAS_OP_N, CUBLAS_OP_N, width, jb - b, b - a, &kMinusOne, at(j + a, c0),
                                      ld, at(j + b, j + a), ld, &kOne, w + b * ldw_, ldw));
      a = b;
    }
  }

  // KILN_HPL_PHASES=1: where the update stream's time went. The gaps between its timed pieces are
  // the update stream waiting: for a panel, for a chunk's SWAP + U12 on the swap stream, or for the
  // host to enqueue.
  void print_update_phases() {
    double seconds[3] = {0, 0, 0}, gaps = 0, gemm_flops = 0;
    std::vector<double> gap_by_step;
    for (std::size_t i = 0; i < intervals_.size(); ++i) {
      Interval& t = intervals_[i];
      KILN_CUDA_CHECK(cudaEventSynchronize(t.end));
      seconds[t.phase] += seconds_between(t.begin, t.end);
      if (t.phase == kGemmPhase) gemm_flops += t.flops;
      if (i > 0) {
        const double gap = seconds_between(intervals_[i - 1].end, t.begin);
        gaps += gap;
        if (static_cast<long>(gap_by_step.size()) <= t.step) gap_by_step.resize(static_cast<std::size_t>(t.step) + 1);
        gap_by_step[static_cast<std::size_t>(t.step)] += gap;
      }
    }
    const double gemm = seconds[kGemmPhase];
    std::fprintf(stderr,
                 "kiln hpl update stream (cuda, s): swaps %.3f  U12 %.3f  gemm %.3f (%.1f TFLOP/s)  waiting %.3f "
                 "(swap chunks of %ld columns on their own stream: their time is not in swaps/U12; W of %ld "
                 "columns)\n",
                 seconds[kSwapPhase], seconds[kU12Phase], gemm, gemm > 0 ? gemm_flops / gemm / 1e12 : 0.0, gaps,
                 swap_chunk_, ldw_);
    // Waiting per step in ms, for the steps that waited more than 1 ms: where the overlap fails.
    std::fprintf(stderr, "kiln hpl update stream waiting by step (ms):");
    for (std::size_t s = 0; s < gap_by_step.size(); ++s)
      if (gap_by_step[s] > 1e-3) std::fprintf(stderr, " %zu:%.0f", s, gap_by_step[s] * 1e3);
    std::fprintf(stderr, "\n");
    // Each step's panel (the panel stream's time for it, overlapped or not), with its width.
    std::fprintf(stderr, "kiln hpl panel by step (ms, step:time/width):");
    for (std::size_t s = 0; s < panel_ms_.size(); ++s)
      std::fprintf(stderr, " %zu:%.1f/%ld", s, panel_ms_[s], s < step_widths_.size() ? step_widths_[s] : 0L);
    std::fprintf(stderr, "\n");
    for (Interval& t : intervals_) {
      cudaEventDestroy(t.begin);
      cudaEventDestroy(t.end);
    }
    intervals_.clear();
  }

  static double seconds_between(cudaEvent_t a, cudaEvent_t b) {
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    return ms / 1e3;
  }

  // The end of an update that runs from column c0 through b (column n): one column more (the
  // zeros after b) when that makes the width even. The width is the DGEMMs' m (rows of the
  // transposed blocks), and cuBLAS runs an odd m far slower: HPL's first update at N=120000,
  // NB=2048 measured 43.3 TFLOP/s with m odd against 51.1 with m even, and the whole run 27.3 s
  // against 23.6 (KILN_HPL_PAD=0 leaves the padding out).
  long update_end(long c0) const { return pad_ && ((n_ + 1 - c0) & 1) ? n_ + 2 : n_ + 1; }

  // The width of the step that starts at column j: NB, or the tail's width once at most
  // tail_rows_ rows are left (KILN_HPL_TAIL=ROWS:WIDTH; see factor()).
  int step_width(long j) const {
    const long width = tail_width_ > 0 && n_ - j <= tail_rows_ ? tail_width_ : nb_;
    return static_cast<int>(std::min(width, n_ - j));
  }

  // With KILN_HPL_TAIL=ROWS:WIDTH the last ROWS rows are factored in steps of WIDTH < NB columns.
  // There the trailing update shrinks faster than the panel (whose cost per column is mostly one
  // barrier per column, whatever the width), so the panel stream, not the update, sets the pace;
  // a narrower panel halves the panel flops per column while the update's flops per column stay
  // 2 m^2. Off by default: HPL's steps are all NB wide.
  void factor() {
    Event panel_done = ordering_event(device_), next_ready = ordering_event(device_);
    step_widths_.clear();
    // The first panel: nothing to overlap with.
    next_ready.record(update_stream_);
    next_ready.wait(panel_stream_);
    factor_panel(0, step_width(0), 0);
    panel_done.record(panel_stream_);
    for (long j = 0, step = 0; j < n_; ++step) {
      current_step_ = step;
      const int parity = static_cast<int>(step & 1);
      const int jb = step_width(j);
      step_widths_.push_back(jb);
      const long next = j + jb;
      panel_done.wait(update_stream_);
      if (next >= n_) {
        update(j, jb, parity, n_, n_ + 1);  // only b is left
        break;
      }
      const int jbn = step_width(next);
      if (run_.depth >= 1) {
        update(j, jb, parity, next, next + jbn);
        next_ready.record(update_stream_);
        next_ready.wait(panel_stream_);
        factor_panel(next, jbn, parity ^ 1);
        panel_done.record(panel_stream_);
        update(j, jb, parity, next + jbn, update_end(next + jbn));
      } else {
        update(j, jb, parity, next, update_end(next));
        next_ready.record(update_stream_);
        next_ready.wait(panel_stream_);
        factor_panel(next, jbn, parity ^ 1);
        panel_done.record(panel_stream_);
      }
      j = next;
    }
  }

  // U x = y, y being the transformed b (column n): block by block from the bottom, a small
  // triangular solve on the diagonal block and a matrix-vector product for the rows above.
  std::vector<double> back_substitute() {
    // y, column n of the row storage, made contiguous in W (free once the factorisation is done).
    double* y = gathered_.as<double>();
    const int ld = static_cast<int>(ld_);
    KILN_CUBLAS_CHECK(cublasDcopy(update_blas_, static_cast<int>(n_), at(0, n_), ld, y, 1));
    const long blocks = (n_ + nb_ - 1) / nb_;
    for (long kb = blocks - 1; kb >= 0; --kb) {
      const long k0 = kb * nb_;
      const int kbs = static_cast<int>(std::min(nb_, n_ - k0));
      // The row storage holds U^T (lower): solve with its transpose, and U's rows above the block
      // are the block's columns of U^T.
      KILN_CUBLAS_CHECK(cublasDtrsv(update_blas_, CUBLAS_FILL_MODE_LOWER, CUBLAS_OP_T, CUBLAS_DIAG_NON_UNIT, kbs,
                                    at(k0, k0), ld, y + k0, 1));
      if (k0 > 0)
        KILN_CUBLAS_CHECK(cublasDgemv(update_blas_, CUBLAS_OP_T, kbs, static_cast<int>(k0), &kMinusOne, at(0, k0), ld,
                                      y + k0, 1, &kOne, y, 1));
    }
    std::vector<double> x(static_cast<std::size_t>(n_));
    KILN_CUDA_CHECK(cudaMemcpyAsync(x.data(), y, sizeof(double) * n_, cudaMemcpyDeviceToHost, native(update_stream_)));
    KILN_CUDA_CHECK(cudaStreamSynchronize(native(update_stream_)));
    return x;
  }

  RunResult check(const std::vector<double>& x) {
    // The factors are no longer needed: their memory holds x and the three vectors of the check.
    double* d_x = a();
    double* d_r = d_x + n_;
    double* d_abs = d_r + n_;
    double* d_b = d_abs + n_;
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(d_x, x.data(), sizeof(double) * n_, cudaMemcpyHostToDevice, native(update_stream_)));
    KILN_CUDA_CHECK(cudaMemsetAsync(d_r, 0, sizeof(double) * 3 * n_, native(update_stream_)));
    KILN_CUDA_CHECK(cuda::residual_parts(d_x, n_, run_.seed, d_r, d_abs, d_b, native(update_stream_)));
    std::vector<double> host(static_cast<std::size_t>(3 * n_));
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(host.data(), d_r, sizeof(double) * 3 * n_, cudaMemcpyDeviceToHost, native(update_stream_)));
    KILN_CUDA_CHECK(cudaStreamSynchronize(native(update_stream_)));
    RunResult r;
    for (long i = 0; i < n_; ++i) {
      r.norm_r = max_abs_keeping_nan(r.norm_r, host[i]);
      r.norm_a = max_abs_keeping_nan(r.norm_a, host[n_ + i]);
      r.norm_b = max_abs_keeping_nan(r.norm_b, host[2 * n_ + i]);
    }
    for (double v : x) r.norm_x = max_abs_keeping_nan(r.norm_x, v);
    const double eps = std::numeric_limits<double>::epsilon() / 2;
    r.residual = r.norm_r / (eps * (r.norm_a * r.norm_x + r.norm_b) * static_cast<double>(n_));
    r.passed = std::isfinite(r.residual) && r.residual < run_.threshold;
    return r;
  }

  const RunConfig& run_;
  bool phases_ = std::getenv("KILN_HPL_PHASES") != nullptr;
  // Rows per block of a fused leaf (KILN_HPL_LEAF_ROWS): fewer blocks leave more SMs to the
  // concurrent update, more finish the leaf sooner.
  long leaf_rows_ = std::max(64L, env_long("KILN_HPL_LEAF_ROWS", 1024));
  bool fused_leaf_ = !env_is("KILN_HPL_PANEL", "columns");
  bool split_u12_ = !env_is("KILN_HPL_U12", "inverse");
  int u12_pieces_ = static_cast<int>(env_long("KILN_HPL_U12_PIECES", 4));
  // KILN_HPL_LEAF_SWAP_BLOCKS: how many of a leaf's blocks carry its interchanges across the
  // panel's other columns (0: all; 1: block 0 alone, as before).
  int leaf_swap_blocks_ = static_cast<int>(env_long("KILN_HPL_LEAF_SWAP_BLOCKS", 0));
  bool pad_ = !env_is("KILN_HPL_PAD", "0");
  long tail_rows_ = 0, tail_width_ = 0;  // KILN_HPL_TAIL=ROWS:WIDTH (see factor())
  std::vector<long> step_widths_;
  std::vector<float> panel_ms_;
  std::vector<std::pair<cudaEvent_t, cudaEvent_t>> panel_events_;
  double first_panel_seconds_ = 0;
  // KILN_HPL_PHASES=1: the update stream's timed pieces, in stream order.
  static constexpr int kSwapPhase = 0, kU12Phase = 1, kGemmPhase = 2;
  struct Interval {
    int phase = 0;
    long step = 0;
    double flops = 0;
    cudaEvent_t begin = nullptr, end = nullptr;
  };
  std::vector<Interval> intervals_;
  long current_step_ = 0;
  // Columns per chunk of the trailing update (KILN_HPL_SWAP_CHUNK; 0: one piece on the update stream).
  long swap_chunk_ = std::max(0L, env_long("KILN_HPL_SWAP_CHUNK", 0));

  int device_;
  DeviceGuard guard_;
  long n_, nb_, ld_;  // ld_: between the starts of consecutive rows of [A|b]
  long ldw_;          // between the starts of W's rows: the most columns one chunk of an update has
  DeviceBuffer matrix_, ipiv_, scalars_;
  DeviceBuffer gathered_;        // W: the new top rows of a chunk of the columns being updated (nb rows)
  DeviceBuffer l11_inverse_[2];  // inv(L11)^T of the panel, by step parity (the panel stream makes
  DeviceBuffer plans_[2];        // step s+1's while the update stream still uses step s's)
  int leaf_blocks_max_;
  std::size_t leaf_tile_bytes_;
  DeviceBuffer leaf_scratch_;
  Stream update_stream_;  // kiln's current (compute) stream of the device
  Stream panel_stream_;   // pool streams: the destructor waits for them before the buffers go
  Stream swap_stream_;    // SWAP + U12 of the trailing update's column chunks (see update())
  CublasHandle update_blas_, panel_blas_, swap_blas_, pivot_blas_;
  Event update_started_ = ordering_event(device_);  // the update stream reached a chunked update
  std::vector<Event> chunk_ready_;                  // chunk i's SWAP + U12 are done
  // KILN_HPL_GEMM=ALGO:TILE:STAGES: the trailing DGEMM through cuBLASLt with that configuration
  // (shapes it does not support fall back to cublasDgemm).
  std::optional<DeviceBuffer> lt_workspace_;
  std::unique_ptr<cuda::LtDgemm> lt_gemm_ = make_lt_gemm();

  std::unique_ptr<cuda::LtDgemm> make_lt_gemm() {
    const char* text = std::getenv("KILN_HPL_GEMM");
    if (text == nullptr) return nullptr;
    auto config = cuda::LtConfig::parse(text);
    KILN_CHECK(config.has_value(), "KILN_HPL_GEMM='{}': expected ALGO:TILE:STAGES (from kiln hpl --peer update-algos)",
               text);
    constexpr std::size_t kWorkspace = std::size_t{64} << 20;
    lt_workspace_.emplace(device_, kWorkspace);
    return std::make_unique<cuda::LtDgemm>(*config, native(update_stream_), lt_workspace_->as<void>(), kWorkspace);
  }
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
  // The least a run needs: W at its narrowest (see w_columns).
  const long columns = std::min(kNarrowestW, row_stride(run.n));
  return bytes_besides_w(run.n, run.nb) + w_bytes(run.n, run.nb, columns);
}

}  // namespace kiln::hpl
