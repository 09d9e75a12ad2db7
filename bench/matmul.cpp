// Kiln matmul (through the CUDA gemm kernel: cuBLASLt) against calling cuBLASLt directly in the
// same program, bf16 and f32 (true FP32 unless KILN_ALLOW_TF32=1) at 4096^3 and 8192^3.
// Prints JSON lines with TFLOP/s.
#include <cstdlib>

#include "bench_util.h"
#include "kiln/ops/linalg.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/vendor/cuda.h"
#endif

namespace {

#if KILN_WITH_CUDA
// Plain cuBLASLt: C (row-major m x n) = A (m x k) B (k x n), as column-major C^T = B^T A^T.
double direct_cublaslt_ms(const kiln::Tensor& a, const kiln::Tensor& b, const kiln::Tensor& c, std::int64_t n) {
  using namespace kiln;
  const bool bf16 = a.dtype() == DType::BF16;
  cudaDataType_t t = bf16 ? CUDA_R_16BF : CUDA_R_32F;
  const char* tf = std::getenv("KILN_ALLOW_TF32");
  bool tf32 = tf && tf[0] && tf[0] != '0';
  cublasLtHandle_t h;
  KILN_CUBLAS_CHECK(cublasLtCreate(&h));
  cublasLtMatmulDesc_t desc;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, (!bf16 && tf32) ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F,
                                             CUDA_R_32F));
  cublasLtMatrixLayout_t la, lb, lc;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&la, t, n, n, n));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lb, t, n, n, n));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&lc, t, n, n, n));
  std::size_t ws_bytes = 32u << 20;
  void* ws = backend_for(Device::cuda(0)).allocate(ws_bytes, 0);
  cublasLtMatmulPreference_t pref;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws_bytes,
                                                         sizeof(ws_bytes)));
  cublasLtMatmulHeuristicResult_t res{};
  int found = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmulAlgoGetHeuristic(h, desc, lb, la, lc, lc, pref, 1, &res, &found));
  float alpha = 1, beta = 0;
  cudaStream_t s = cuda_stream(0);
  double ms = bench::time_ms(Device::cuda(0), [&] {
    KILN_CUBLAS_CHECK(cublasLtMatmul(h, desc, &alpha, b.data_ptr(), lb, a.data_ptr(), la, &beta, c.data_ptr(), lc,
                                     c.data_ptr(), lc, &res.algo, ws, ws_bytes, s));
  });
  backend_for(Device::cuda(0)).deallocate(ws, 0);
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(desc);
  cublasLtDestroy(h);
  return ms;
}
#endif

}  // namespace

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
#if KILN_WITH_CUDA
  Device d = Device::cuda(0);
  for (DType t : {DType::BF16, DType::F32}) {
    for (std::int64_t n : {4096, 8192}) {
      Tensor a = Tensor::randn({1, n, n}, 1, t, d), b = Tensor::randn({1, n, n}, 2, t, d);
      Tensor c = Tensor::empty({1, n, n}, t, d);
      const double flops = 2.0 * n * n * n;
      double kiln_ms = bench::time_ms(d, [&] { ops::gemm_into(a, b, c, false, false, 1.0, 0.0); });
      double lt_ms = direct_cublaslt_ms(a, b, c, n);
      std::string shape = std::to_string(n) + "x" + std::to_string(n) + "x" + std::to_string(n);
      bench::emit({{"bench", "matmul"}, {"op", "matmul"}, {"dtype", std::string(dtype_name(t))}, {"shape", shape},
                   {"ms", kiln_ms}, {"tflops", flops / kiln_ms / 1e9}});
      bench::emit({{"bench", "matmul"}, {"op", "cublaslt_direct"}, {"dtype", std::string(dtype_name(t))},
                   {"shape", shape}, {"ms", lt_ms}, {"tflops", flops / lt_ms / 1e9},
                   {"kiln_vs_direct", lt_ms / kiln_ms}});
    }
  }
#endif
  return 0;
}
