#pragma once
// The FP8 op family in the one kernel registry (ops/kernel_registry.h). FP8 sits outside the
// built-in ops (ops/kernels.h), so, as docs/ARCHITECTURE.md asks of such families, it declares its
// ops itself: register_fp8_ops() declares them and registers every backend's kernels (cpu/fp8.cpp,
// cuda/fp8_register.cpp), and fp8_ops() does that on first use of an FP8 op. The wrappers in
// fp8.cpp have checked every argument (shapes, dtypes, devices, scaling layouts) before a kernel
// runs. The kernels take every dtype (each checks its inputs itself).
#include <string>

#include "kiln/ops/fp8.h"
#include "kiln/ops/kernel_registry.h"

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
  bool accumulate = false;  // out (float32) += the product; no epilogue, no fp8 out
};

// The kernel types of the family.
namespace fp8_sig {
// x: 2-D, any strides, f32/bf16/f16; dst checked and of x's shape.
using quantize = void(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& options);
// Optional fused transpose-cast (one read of x for both outputs) for a contiguous x and either
// per-tensor `rowwise` [R, C] / `columnwise` [C, R] of one dtype (each output uses its own scale, or,
// with current scaling, both the one computed from amax(x)) or both outputs in one block layout
// (each block's scale from its own amax, as fp8_quantize would). Where a backend has none, the wrapper runs quantize
// twice.
using quantize_transpose = void(const Tensor& x, const Fp8Tensor& rowwise, const Fp8Tensor& columnwise,
                                const Fp8CastOptions& options);
// out: contiguous, q's shape, f64/f32/bf16/f16.
using dequantize = void(const Fp8Tensor& q, const Tensor& out);
using gemm = void(const Fp8GemmArgs& args);
// history f32 [L], scale / scale_inv f32 [1], all contiguous on one device.
using delayed_scaling_update = void(const Tensor& history, const Tensor& scale, const Tensor& scale_inv,
                                    bool most_recent, float scaled_max);
// Checked entries (each as delayed_scaling_update's arguments), all on one device; one launch.
using delayed_scaling_update_many = void(const std::vector<Fp8DelayedScalingRef>& states, bool most_recent);
// Checked by the wrappers (fp8_piece_amax_ / fp8_piece_quantize_into); x non-empty.
using piece_amax = void(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& amax);
using piece_quantize = void(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scale, const Tensor& dst);
// Which GEMMs the backend runs (optional; a backend without it runs every one). Returns an empty
// string when supported, else the reason (the wrapper raises it naming the call).
using gemm_unsupported = std::string(const Fp8GemmArgs& args);
}  // namespace fp8_sig

// The family's ops, by these names in the registry.
inline constexpr const char* kFp8QuantizeOp = "fp8_quantize";
inline constexpr const char* kFp8QuantizeTransposeOp = "fp8_quantize_transpose";
inline constexpr const char* kFp8DequantizeOp = "fp8_dequantize";
inline constexpr const char* kFp8GemmOp = "fp8_gemm";
inline constexpr const char* kFp8GemmUnsupportedOp = "fp8_gemm_unsupported";
inline constexpr const char* kFp8DelayedScalingUpdateOp = "fp8_delayed_scaling_update";
inline constexpr const char* kFp8DelayedScalingUpdateManyOp = "fp8_delayed_scaling_update_many";
inline constexpr const char* kFp8PieceAmaxOp = "fp8_piece_amax";
inline constexpr const char* kFp8PieceQuantizeOp = "fp8_piece_quantize";

struct Fp8Ops {
  KernelOp<fp8_sig::quantize> quantize;
  KernelOp<fp8_sig::quantize_transpose> quantize_transpose;
  KernelOp<fp8_sig::dequantize> dequantize;
  KernelOp<fp8_sig::gemm> gemm;
  KernelOp<fp8_sig::gemm_unsupported> gemm_unsupported;
  KernelOp<fp8_sig::delayed_scaling_update> delayed_scaling_update;
  KernelOp<fp8_sig::delayed_scaling_update_many> delayed_scaling_update_many;
  KernelOp<fp8_sig::piece_amax> piece_amax;
  KernelOp<fp8_sig::piece_quantize> piece_quantize;
};

// Declares the FP8 ops in `registry` (or finds them, declared before) and returns their handles.
Fp8Ops declare_fp8_ops(KernelRegistry& registry);
// Declares the FP8 ops and registers every backend's kernels of them (once per registry).
void register_fp8_ops(KernelRegistry& registry);
// The FP8 ops of kernel_registry(); the first call registers the family.
const Fp8Ops& fp8_ops();

// Each backend's FP8 kernels.
void register_cpu_fp8_kernels(KernelRegistry& registry, const Fp8Ops& ops);
#if KILN_WITH_CUDA
void register_cuda_fp8_kernels(KernelRegistry& registry, const Fp8Ops& ops);
#endif

}  // namespace kiln::ops
