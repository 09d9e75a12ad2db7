// The GPU peers HPL is judged against, timed in the same process on the same device: cuBLAS DGEMM
// (the update's upper bound) and cuSOLVER getrf (a vendor LU without the HPL rules).
#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "kiln/hpc/hpl/cuda/cuda_solver.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/vendor/cuda.h"
// After the vendor header, which gives it the CUDA runtime types.
#include "kiln/hpc/hpl/cuda/hpl_kernels.h"
#include "kiln/runtime/vendor/cusolver.h"

namespace kiln::hpl {

namespace {

struct Scratch {
  int device;
  void* ptr;
  Scratch(int d, std::size_t bytes) : device(d), ptr(backend_for(Device::cuda(d)).allocate(bytes, d)) {}
  ~Scratch() {
    backend_for(Device::cuda(device)).deallocate(ptr, device);
    backend_for(Device::cuda(device)).empty_cache(device);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  double* d() const { return static_cast<double*>(ptr); }
};

// Times `body` (enqueued on `stream`) with CUDA events: one warm-up, then the median of `repeats`.
template <class Prepare, class Body>
double median_seconds(cudaStream_t stream, int repeats, Prepare prepare, Body body) {
  cudaEvent_t start, stop;
  KILN_CUDA_CHECK(cudaEventCreate(&start));
  KILN_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> times;
  for (int r = 0; r <= std::max(repeats, 1); ++r) {
    prepare();
    KILN_CUDA_CHECK(cudaEventRecord(start, stream));
    body();
    KILN_CUDA_CHECK(cudaEventRecord(stop, stream));
    KILN_CUDA_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
    if (r > 0) times.push_back(ms / 1e3);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

}  // namespace

double cuda_peer_dgemm_tflops(long n, int device, int repeats) {
  DeviceGuard guard(device);
  cudaStream_t stream = cuda_stream(device);
  const long ld = n;
  // A and B hold HPL's random numbers (power, hence clocks, depend on the data); C = A * B.
  Scratch a(device, sizeof(double) * ld * (n + 1)), b(device, sizeof(double) * ld * (n + 1)),
      c(device, sizeof(double) * ld * n);
  KILN_CUDA_CHECK(cuda::generate_matrix(a.d(), ld, n, 100, stream));
  KILN_CUDA_CHECK(cuda::generate_matrix(b.d(), ld, n, 200, stream));
  cublasHandle_t h;
  KILN_CUBLAS_CHECK(cublasCreate(&h));
  KILN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const double one = 1.0, zero = 0.0;
  const int ni = static_cast<int>(n);
  double seconds = median_seconds(
      stream, repeats, [] {},
      [&] {
        KILN_CUBLAS_CHECK(
            cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ni, ni, ni, &one, a.d(), ni, b.d(), ni, &zero, c.d(), ni));
      });
  cublasDestroy(h);
  return 2.0 * n * n * static_cast<double>(n) / seconds / 1e12;
}

double cuda_peer_update_tflops(long n, long nb, int device, int repeats) {
  DeviceGuard guard(device);
  cudaStream_t stream = cuda_stream(device);
  // HPL's first trailing update at this N and NB, in HPL's layout: A22 -= L21 U12 inside one
  // n x (n+1) matrix, beta = 1 (the repeats keep updating A22; the values stay finite).
  const long ld = n;
  Scratch a(device, sizeof(double) * ld * (n + 1));
  KILN_CUDA_CHECK(cuda::generate_matrix(a.d(), ld, n, 100, stream));
  cublasHandle_t h;
  KILN_CUBLAS_CHECK(cublasCreate(&h));
  KILN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const double one = 1.0, minus_one = -1.0;
  const int rest = static_cast<int>(n - nb), k = static_cast<int>(nb), ldi = static_cast<int>(ld);
  double* base = a.d();
  double seconds = median_seconds(
      stream, repeats, [] {},
      [&] {
        KILN_CUBLAS_CHECK(cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, rest, rest, k, &minus_one, base + nb, ldi,
                                      base + nb * ld, ldi, &one, base + nb * ld + nb, ldi));
      });
  cublasDestroy(h);
  return 2.0 * rest * static_cast<double>(rest) * nb / seconds / 1e12;
}

double cuda_peer_getrf_tflops(long n, int device, int repeats) {
  DeviceGuard guard(device);
  cudaStream_t stream = cuda_stream(device);
  const int ni = static_cast<int>(n);
  Scratch a(device, sizeof(double) * n * (n + 1)), pivots(device, sizeof(int) * (n + 1));
  cusolverDnHandle_t h;
  KILN_CUSOLVER_CHECK(cusolverDnCreate(&h));
  KILN_CUSOLVER_CHECK(cusolverDnSetStream(h, stream));
  int work_size = 0;
  KILN_CUSOLVER_CHECK(cusolverDnDgetrf_bufferSize(h, ni, ni, a.d(), ni, &work_size));
  Scratch work(device, sizeof(double) * std::max(work_size, 1));
  int* info = static_cast<int*>(pivots.ptr) + n;
  // The same matrix as HPL's for this N (getrf overwrites it, so it is generated before each run).
  double seconds = median_seconds(
      stream, repeats, [&] { KILN_CUDA_CHECK(cuda::generate_matrix(a.d(), n, n, 100, stream)); },
      [&] {
        KILN_CUSOLVER_CHECK(cusolverDnDgetrf(h, ni, ni, a.d(), ni, work.d(), static_cast<int*>(pivots.ptr), info));
      });
  int host_info = 0;
  KILN_CUDA_CHECK(cudaMemcpy(&host_info, info, sizeof(int), cudaMemcpyDeviceToHost));
  cusolverDnDestroy(h);
  KILN_CHECK(host_info == 0, "cuSOLVER getrf of order {} reported info = {}", n, host_info);
  return 2.0 / 3.0 * n * n * static_cast<double>(n) / seconds / 1e12;
}

namespace {

// "KILN_HPL_GEMM=35:17:3 cluster 0 swizzle 1 custom 0 splitK 1" for a cuBLASLt candidate.
std::string describe(const cublasLtMatmulAlgo_t& algo) {
  auto get = [&](cublasLtMatmulAlgoConfigAttributes_t attr, auto value) {
    std::size_t written = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmulAlgoConfigGetAttribute(&algo, attr, &value, sizeof(value), &written));
    return static_cast<long>(value);
  };
  // ALGO:TILE:STAGES first, as KILN_HPL_GEMM takes it.
  return "KILN_HPL_GEMM=" + std::to_string(get(CUBLASLT_ALGO_CONFIG_ID, std::int32_t{})) + ":" +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_TILE_ID, std::uint32_t{})) + ":" +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_STAGES_ID, std::uint32_t{})) + " cluster " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, std::uint16_t{})) + " swizzle " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, std::uint32_t{})) + " custom " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_CUSTOM_OPTION, std::uint32_t{})) + " splitK " +
         std::to_string(get(CUBLASLT_ALGO_CONFIG_SPLITK_NUM, std::int32_t{}));
}

}  // namespace

std::vector<PeerAlgo> cuda_peer_update_algos(long n, long nb, int count, int device, int repeats) {
  DeviceGuard guard(device);
  cudaStream_t stream = cuda_stream(device);
  const long ld = n;
  Scratch a(device, sizeof(double) * ld * (n + 1));
  KILN_CUDA_CHECK(cuda::generate_matrix(a.d(), ld, n, 100, stream));
  const std::uint64_t rest = static_cast<std::uint64_t>(n - nb), k = static_cast<std::uint64_t>(nb);
  const double flops = 2.0 * static_cast<double>(rest) * static_cast<double>(rest) * static_cast<double>(nb);
  double* base = a.d();
  const double* l21 = base + nb;
  const double* u12 = base + nb * ld;
  double* a22 = base + nb * ld + nb;
  const double one = 1.0, minus_one = -1.0;
  std::vector<PeerAlgo> out;
  auto tflops_of = [&](auto body) {
    return flops /
           median_seconds(
               stream, repeats, [] {}, body) /
           1e12;
  };

  cublasHandle_t h;
  KILN_CUBLAS_CHECK(cublasCreate(&h));
  KILN_CUBLAS_CHECK(cublasSetStream(h, stream));
  const int ri = static_cast<int>(rest), ki = static_cast<int>(k), ldi = static_cast<int>(ld);
  auto dgemm = [&] {
    KILN_CUBLAS_CHECK(
        cublasDgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, ri, ri, ki, &minus_one, l21, ldi, u12, ldi, &one, a22, ldi));
  };
  out.push_back({"cublasDgemm", tflops_of(dgemm)});

  cublasLtHandle_t lt;
  KILN_CUBLAS_CHECK(cublasLtCreate(&lt));
  cublasLtMatmulDesc_t desc;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_64F, CUDA_R_64F));
  cublasLtMatrixLayout_t la, lb, lc;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, CUDA_R_64F, rest, k, static_cast<std::int64_t>(ld)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, CUDA_R_64F, k, rest, static_cast<std::int64_t>(ld)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, CUDA_R_64F, rest, rest, static_cast<std::int64_t>(ld)));
  cublasLtMatmulPreference_t pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  const std::size_t workspace_bytes = std::size_t{64} << 20;
  Scratch workspace(device, workspace_bytes);
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                         &workspace_bytes, sizeof(workspace_bytes)));
  std::vector<cublasLtMatmulHeuristicResult_t> found(static_cast<std::size_t>(std::max(count, 1)));
  int returned = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(lt, desc, la, lb, lc, lc, pref, static_cast<int>(found.size()),
                                                   found.data(), &returned));
  for (int i = 0; i < returned; ++i) {
    if (found[i].state != CUBLAS_STATUS_SUCCESS) continue;
    const cublasLtMatmulAlgo_t* algo = &found[i].algo;
    auto body = [&] {
      KILN_CUBLAS_CHECK(cublasLtMatmul(lt, desc, &minus_one, l21, la, u12, lb, &one, a22, lc, a22, lc, algo,
                                       workspace.ptr, workspace_bytes, stream));
    };
    out.push_back({describe(*algo), tflops_of(body)});
  }
  // Beyond the heuristic's list: every FP64 algorithm with each tile of at least 64 x 128 it
  // offers and each of its stage counts (at most kMaxEnumerated of them), since under the power
  // cap a tile that moves fewer bytes per flop may sustain more than the heuristic's model says.
  constexpr int kMaxEnumerated = 48;
  int ids[64], id_count = 0, enumerated = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetIds(lt, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F,
                                             CUDA_R_64F, 64, ids, &id_count));
  const auto tile_area = [](std::uint32_t tile) -> int {
    switch (tile) {
      case CUBLASLT_MATMUL_TILE_64x128:
      case CUBLASLT_MATMUL_TILE_128x64: return 8192;
      case CUBLASLT_MATMUL_TILE_128x96:
      case CUBLASLT_MATMUL_TILE_96x128: return 12288;
      case CUBLASLT_MATMUL_TILE_64x256:
      case CUBLASLT_MATMUL_TILE_256x64:
      case CUBLASLT_MATMUL_TILE_128x128: return 16384;
      case CUBLASLT_MATMUL_TILE_128x160:
      case CUBLASLT_MATMUL_TILE_160x128: return 20480;
      case CUBLASLT_MATMUL_TILE_128x192:
      case CUBLASLT_MATMUL_TILE_192x128: return 24576;
      case CUBLASLT_MATMUL_TILE_128x256:
      case CUBLASLT_MATMUL_TILE_256x128:
      case CUBLASLT_MATMUL_TILE_64x512:
      case CUBLASLT_MATMUL_TILE_512x64: return 32768;
      default: return 0;
    }
  };
  for (int a = 0; a < id_count && enumerated < kMaxEnumerated; ++a) {
    cublasLtMatmulAlgo_t algo;
    if (cublasLtMatmulAlgoInit(lt, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F,
                               ids[a], &algo) != CUBLAS_STATUS_SUCCESS)
      continue;
    std::size_t bytes = 0;
    std::vector<std::uint32_t> tiles, stages;
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, nullptr, 0, &bytes) ==
        CUBLAS_STATUS_SUCCESS) {
      tiles.resize(bytes / sizeof(std::uint32_t));
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_TILE_IDS, tiles.data(), bytes, &bytes);
    }
    if (cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, nullptr, 0, &bytes) ==
        CUBLAS_STATUS_SUCCESS) {
      stages.resize(bytes / sizeof(std::uint32_t));
      cublasLtMatmulAlgoCapGetAttribute(&algo, CUBLASLT_ALGO_CAP_STAGES_IDS, stages.data(), bytes, &bytes);
    }
    if (stages.empty()) stages.push_back(CUBLASLT_MATMUL_STAGES_UNDEFINED);
    std::sort(tiles.begin(), tiles.end(), [&](auto x, auto y) { return tile_area(x) > tile_area(y); });
    for (std::uint32_t tile : tiles) {
      if (tile_area(tile) == 0) continue;
      for (std::uint32_t stage : stages) {
        if (enumerated >= kMaxEnumerated) break;
        cublasLtMatmulAlgo_t candidate = algo;
        const std::uint32_t swizzle = 1;
        cublasLtMatmulAlgoConfigSetAttribute(&candidate, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile));
        cublasLtMatmulAlgoConfigSetAttribute(&candidate, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stage, sizeof(stage));
        cublasLtMatmulAlgoConfigSetAttribute(&candidate, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle));
        cublasLtMatmulHeuristicResult_t checked{};
        if (cublasLtMatmulAlgoCheck(lt, desc, la, lb, lc, lc, &candidate, &checked) != CUBLAS_STATUS_SUCCESS ||
            checked.workspaceSize > workspace_bytes)
          continue;
        ++enumerated;
        auto body = [&] {
          KILN_CUBLAS_CHECK(cublasLtMatmul(lt, desc, &minus_one, l21, la, u12, lb, &one, a22, lc, a22, lc, &candidate,
                                           workspace.ptr, workspace_bytes, stream));
        };
        out.push_back({describe(candidate) + " (enumerated)", tflops_of(body)});
      }
    }
  }
  // cublasDgemm again at the end: the GPU's clocks drift as it heats, and this brackets the list.
  out.push_back({"cublasDgemm (again)", tflops_of(dgemm)});
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(lt);
  cublasDestroy(h);
  return out;
}

}  // namespace kiln::hpl
