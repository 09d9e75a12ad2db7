#pragma once
// The FP8 kernel table: what one backend fills in for the FP8 ops (ops/fp8.h). It is a table of
// its own beside ops::Kernels (kernels.h) so the FP8 kernels register in one block per backend
// (cpu/fp8.cpp, cuda/fp8_register.cpp) and move into the one op registry as a unit. The wrappers
// in fp8.cpp have checked every argument (shapes, dtypes, devices, scaling layouts) before a
// kernel runs.
#include "kiln/ops/fp8.h"

namespace kiln::ops {

// One GEMM, in the native K-contiguous form: out[m, n] = sum_k a[m, k] * b[n, k] (scaled, with
// the epilogue). a, b are contiguous; transposes were made by the wrapper.
struct Fp8GemmArgs {
  const Fp8Tensor* a = nullptr;  // [M, K]
  const Fp8Tensor* b = nullptr;  // [N, K]
  Tensor out;                    // bf16 / f32 [M, N], or the data of fp8_out
  const Fp8Tensor* fp8_out = nullptr;
  Tensor bias;  // bf16 [N] or undefined
  Fp8Epilogue epilogue = Fp8Epilogue::None;
  bool fast_accum = false;
};

struct Fp8Kernels {
  // x: 2-D, any strides, f32/bf16/f16; dst checked and of x's shape.
  void (*quantize)(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& options) = nullptr;
  // Optional fused transpose-cast (one read of x for both outputs) for a contiguous x and per-tensor
  // `rowwise` [R, C] / `columnwise` [C, R]; each output uses its own scale (or, with current scaling,
  // both the one computed from amax(x)). Where it is missing, the wrapper runs quantize twice.
  void (*quantize_transpose)(const Tensor& x, const Fp8Tensor& rowwise, const Fp8Tensor& columnwise,
                             const Fp8CastOptions& options) = nullptr;
  // out: contiguous, q's shape, f64/f32/bf16/f16.
  void (*dequantize)(const Fp8Tensor& q, const Tensor& out) = nullptr;
  void (*gemm)(const Fp8GemmArgs& args) = nullptr;
  // Which GEMMs the backend runs; nullptr means every one. Returns an empty string when supported,
  // else the reason (the wrapper raises it naming the call).
  std::string (*gemm_unsupported)(const Fp8GemmArgs& args) = nullptr;
};

const Fp8Kernels& fp8_kernels_for(DeviceKind kind);
void register_cpu_fp8_kernels(Fp8Kernels& k);
#if KILN_WITH_CUDA
void register_cuda_fp8_kernels(Fp8Kernels& k);
#endif

}  // namespace kiln::ops
