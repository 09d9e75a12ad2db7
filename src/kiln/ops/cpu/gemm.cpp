// CPU GEMM through OpenBLAS. bf16/f16 operands are widened to f32 (OpenBLAS's sbgemm is not in
// every build), which is also what the GPU's f32 accumulation computes.
#include <cblas.h>

#include <cstddef>
#include <cstring>
#include <vector>

#include "kiln/ops/cpu/cpu_kernels.h"

namespace kiln::ops::cpu {

namespace {
template <class T>
std::vector<float> widen(const Tensor& t) {
  const T* p = static_cast<const T*>(t.data_ptr());
  std::vector<float> out(static_cast<std::size_t>(t.numel()));
  for (std::size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  return out;
}
}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool ta, bool tb, double alpha, double beta) {
  const int batch = static_cast<int>(a.shape()[0]);
  const int m = static_cast<int>(out.shape()[1]), n = static_cast<int>(out.shape()[2]);
  const int k = static_cast<int>(ta ? a.shape()[1] : a.shape()[2]);
  const int lda = static_cast<int>(a.shape()[2]), ldb = static_cast<int>(b.shape()[2]);
  const auto opa = ta ? CblasTrans : CblasNoTrans, opb = tb ? CblasTrans : CblasNoTrans;
  const std::int64_t sa = a.shape()[1] * a.shape()[2], sb = b.shape()[1] * b.shape()[2], so = std::int64_t{m} * n;
  switch (a.dtype()) {
    case DType::F32: {
      const float* pa = a.data<float>();
      const float* pb = b.data<float>();
      float* po = out.data<float>();
      for (int i = 0; i < batch; ++i)
        cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, static_cast<float>(alpha), pa + i * sa, lda, pb + i * sb, ldb,
                    static_cast<float>(beta), po + i * so, n);
      return;
    }
    case DType::F64: {
      const double* pa = a.data<double>();
      const double* pb = b.data<double>();
      double* po = out.data<double>();
      for (int i = 0; i < batch; ++i)
        cblas_dgemm(CblasRowMajor, opa, opb, m, n, k, alpha, pa + i * sa, lda, pb + i * sb, ldb, beta, po + i * so, n);
      return;
    }
    case DType::BF16:
    case DType::F16: {
      bool bf = a.dtype() == DType::BF16;
      auto fa = bf ? widen<BFloat16>(a) : widen<Half>(a);
      auto fb = bf ? widen<BFloat16>(b) : widen<Half>(b);
      if (out.dtype() == DType::F32) {  // a float32 output: the product is not rounded to 16 bits
        for (int i = 0; i < batch; ++i)
          cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, static_cast<float>(alpha), fa.data() + i * sa, lda,
                      fb.data() + i * sb, ldb, static_cast<float>(beta), out.data<float>() + i * so, n);
        return;
      }
      auto fo = bf ? widen<BFloat16>(out) : widen<Half>(out);
      for (int i = 0; i < batch; ++i)
        cblas_sgemm(CblasRowMajor, opa, opb, m, n, k, static_cast<float>(alpha), fa.data() + i * sa, lda,
                    fb.data() + i * sb, ldb, static_cast<float>(beta), fo.data() + i * so, n);
      for (std::size_t i = 0; i < fo.size(); ++i) {
        if (bf)
          out.data<BFloat16>()[i] = BFloat16(fo[i]);
        else
          out.data<Half>()[i] = Half(fo[i]);
      }
      return;
    }
    default: KILN_FAIL("matmul: dtype {} is not supported", dtype_name(a.dtype()));
  }
}

// Every row of out starts as the bias, then the GEMM adds into it (beta 1): one rounding of the
// sum for 16-bit outputs, as cuBLASLt's BIAS epilogue rounds once.
void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool ta, bool tb) {
  const std::int64_t rows = out.shape()[0] * out.shape()[1], n = out.shape()[2];
  const auto bytes = static_cast<std::size_t>(n) * out.element_size();
  auto* dst = static_cast<std::byte*>(out.data_ptr());
  const auto* src = static_cast<const std::byte*>(bias.data_ptr());
  for (std::int64_t r = 0; r < rows; ++r) std::memcpy(dst + static_cast<std::size_t>(r) * bytes, src, bytes);
  gemm(a, b, out, ta, tb, 1.0, 1.0);
}

}  // namespace kiln::ops::cpu
