#include "kiln/runtime/vendor/cuda.h"
// After the vendor header, which gives it the cuBLASLt types.
#include <cstdio>

#include "kiln/hpc/hpl/cuda/lt_dgemm.h"
#include "kiln/runtime/error.h"

namespace kiln::hpl::cuda {

std::optional<LtConfig> LtConfig::parse(const std::string& text) {
  LtConfig c;
  unsigned tile = 0, stages = 0;
  char tail = 0;
  if (std::sscanf(text.c_str(), "%d:%u:%u%c", &c.algo, &tile, &stages, &tail) != 3) return std::nullopt;
  c.tile = tile;
  c.stages = stages;
  return c;
}

LtDgemm::LtDgemm(LtConfig config, cudaStream_t stream, void* workspace, std::size_t workspace_bytes)
    : config_(config), stream_(stream), workspace_(workspace), workspace_bytes_(workspace_bytes) {
  KILN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_64F, CUDA_R_64F));
}

LtDgemm::~LtDgemm() {
  cublasLtMatmulDescDestroy(desc_);
  cublasLtDestroy(handle_);
}

bool LtDgemm::run(long m, long n, long k, double alpha, const double* a, long lda, const double* b, long ldb,
                  double beta, double* c, long ldc) {
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&la, CUDA_R_64F, static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(k), lda));
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&lb, CUDA_R_64F, static_cast<std::uint64_t>(k), static_cast<std::uint64_t>(n), ldb));
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&lc, CUDA_R_64F, static_cast<std::uint64_t>(m), static_cast<std::uint64_t>(n), ldc));
  cublasLtMatmulAlgo_t algo;
  bool ok = cublasLtMatmulAlgoInit(handle_, CUBLAS_COMPUTE_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F, CUDA_R_64F,
                                   CUDA_R_64F, config_.algo, &algo) == CUBLAS_STATUS_SUCCESS;
  const std::uint32_t swizzle = 1;
  ok = ok &&
       cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &config_.tile, sizeof(config_.tile)) ==
           CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &config_.stages,
                                            sizeof(config_.stages)) == CUBLAS_STATUS_SUCCESS &&
       cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CTA_SWIZZLING, &swizzle, sizeof(swizzle)) ==
           CUBLAS_STATUS_SUCCESS;
  cublasLtMatmulHeuristicResult_t checked{};
  ok = ok && cublasLtMatmulAlgoCheck(handle_, desc_, la, lb, lc, lc, &algo, &checked) == CUBLAS_STATUS_SUCCESS &&
       checked.workspaceSize <= workspace_bytes_;
  if (ok)
    KILN_CUBLAS_CHECK(cublasLtMatmul(handle_, desc_, &alpha, a, la, b, lb, &beta, c, lc, c, lc, &algo, workspace_,
                                     workspace_bytes_, stream_));
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  return ok;
}

}  // namespace kiln::hpl::cuda
