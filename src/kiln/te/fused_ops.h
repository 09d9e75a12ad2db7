#pragma once
// te/'s fused op family in the kernel registry (ops/kernel_registry.h): the kernel types, the op
// names, and register_fused_ops(), which enters the CPU (and CUDA) kernels of te/cpu/, te/cuda/.
// The differentiable functions (te/fused_norm.h, rope.h, qkv_rope.h, swiglu.h,
// linear_cross_entropy.h, bias_gelu.h) dispatch through fused_ops(). Every tensor a kernel gets is
// contiguous; optional ones may be undefined. Data tensors share one dtype; norm weights and biases
// may be that dtype or float32 (mixed precision).
#include <cstdint>

#include "kiln/ops/kernel_registry.h"
#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

// Rows of x (+ residual) [rows, cols]: sum = x + residual (x alone when residual is undefined),
// y = sum * rstd * w. rstd [rows] in the statistics dtype (f64 at f64, else f32).
using AddRmsNormForwardKernel = void(const Tensor& x, const Tensor& residual, const Tensor& w, double eps,
                                     const Tensor& y, const Tensor& sum, const Tensor& rstd);
// dx = dsum (may be undefined) + the gradient of rms_norm(sum) for dy; dw (may be undefined).
using AddRmsNormBackwardKernel = void(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w,
                                      const Tensor& rstd, const Tensor& dx, const Tensor& dw);
// As the RMS kernels, with mean; w and b may be undefined (no affine part).
using AddLayerNormForwardKernel = void(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                       double eps, const Tensor& y, const Tensor& sum, const Tensor& mean,
                                       const Tensor& rstd);
using AddLayerNormBackwardKernel = void(const Tensor& dy, const Tensor& dsum, const Tensor& sum, const Tensor& w,
                                        const Tensor& mean, const Tensor& rstd, const Tensor& dx, const Tensor& dw,
                                        const Tensor& db);
// x, out [B, T, H, D]; cos, sin float32 [P, R] with 2R <= D: the first 2R channels rotate
// (rotate-half pairs (i, i + R)), the rest pass through; token t has position offset + t.
// inverse rotates by -theta (the backward). x may be strided with unit stride along D (the one
// kernel argument that need not be contiguous); out is contiguous.
using ApplyRopeKernel = void(const Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t position_offset,
                             bool inverse, const Tensor& out);
// qkv [B, T, G, (P + 2) D] in Megatron's grouped layout (per query group: P query heads, a key
// head, a value head) -> q [B, T, G P, D], k and v [B, T, G, D]: q and k rotated as ApplyRopeKernel
// rotates them (the same per-element math, so the results are equal bit for bit), v copied.
using SplitQkvRopeForwardKernel = void(const Tensor& qkv, const Tensor& cos, const Tensor& sin,
                                       std::int64_t position_offset, const Tensor& q, const Tensor& k, const Tensor& v);
// The backward: dq, dk, dv (each may be undefined: zeros) -> dqkv [B, T, G, (P + 2) head_dim], dq
// and dk rotated by -theta, dv copied.
using SplitQkvRopeBackwardKernel = void(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& cos,
                                        const Tensor& sin, std::int64_t position_offset, std::int64_t head_dim,
                                        const Tensor& dqkv);
// x [rows, 2F] (gate | up) -> out [rows, F] = silu(gate) * up; the backward gives dx [rows, 2F].
using SwigluForwardKernel = void(const Tensor& x, const Tensor& out);
using SwigluBackwardKernel = void(const Tensor& dout, const Tensor& x, const Tensor& dx);
// The FP8-output forms (the producer half of an FP8 linear's input cast, TE's norm/activation ->
// fp8 kernels): in place of y, y8 [rows, cols] (per tensor, checked) receives the cast of each
// output value rounded to x's dtype, cast(round(y) * y8.scale) (the delayed scale, as given),
// y8.amax = max |round(y)| and y8.scale_inv = 1 / y8.scale: the bytes fp8_quantize_into would make
// of the high-precision y, which is never written.
using AddRmsNormFp8ForwardKernel = void(const Tensor& x, const Tensor& residual, const Tensor& w, double eps,
                                        const Fp8Tensor& y8, const Tensor& sum, const Tensor& rstd);
using AddLayerNormFp8ForwardKernel = void(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                          double eps, const Fp8Tensor& y8, const Tensor& sum, const Tensor& mean,
                                          const Tensor& rstd);
using SwigluFp8ForwardKernel = void(const Tensor& x, const Fp8Tensor& out8);
// logits [n, V]; labels int64 [n]; row_weight and loss [n] in the accumulation dtype (f64 at
// f64, else f32). loss[i] = (logsumexp(logits[i]) - logits[i, label]) * row_weight[i]; with
// write_grad, logits[i] is overwritten by (softmax - onehot(label)) * row_weight[i]. A row of
// weight 0 gets loss 0 and gradient 0 and its label is not read.
using CrossEntropyChunkKernel = void(const Tensor& logits, const Tensor& labels, const Tensor& row_weight,
                                     const Tensor& loss, bool write_grad);
// x [N, K], w [O, K], b [O] -> pre = x w^T + b (kept for the backward), y = gelu_tanh(pre).
using LinearBiasGeluForwardKernel = void(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y,
                                         const Tensor& pre);
// dpre = dy * gelu_tanh'(pre); dx = dpre w, dw = dpre^T x, db = column sums of dpre (each
// output may be undefined).
using LinearBiasGeluBackwardKernel = void(const Tensor& dy, const Tensor& pre, const Tensor& x, const Tensor& w,
                                          const Tensor& dx, const Tensor& dw, const Tensor& db);

// dpre = (dout w2) * gelu_tanh'(pre) for dout [N, H], w2 [H, F], pre [N, F]: the data-gradient
// GEMM of an MLP's second linear layer with the first's GELU backward as its epilogue; db [F]
// (may be undefined) = column sums of dpre, the first layer's bias gradient.
using DgeluBgradGemmKernel = void(const Tensor& dout, const Tensor& w2, const Tensor& pre, const Tensor& dpre,
                                  const Tensor& db);

inline constexpr const char* kAddRmsNormForwardOp = "te_add_rms_norm_forward";
inline constexpr const char* kAddRmsNormBackwardOp = "te_add_rms_norm_backward";
inline constexpr const char* kAddLayerNormForwardOp = "te_add_layer_norm_forward";
inline constexpr const char* kAddLayerNormBackwardOp = "te_add_layer_norm_backward";
inline constexpr const char* kApplyRopeOp = "te_apply_rope";
inline constexpr const char* kSplitQkvRopeForwardOp = "te_split_qkv_rope_forward";
inline constexpr const char* kSplitQkvRopeBackwardOp = "te_split_qkv_rope_backward";
inline constexpr const char* kSwigluForwardOp = "te_swiglu_forward";
inline constexpr const char* kSwigluBackwardOp = "te_swiglu_backward";
inline constexpr const char* kCrossEntropyChunkOp = "te_cross_entropy_chunk";
inline constexpr const char* kLinearBiasGeluForwardOp = "te_linear_bias_gelu_forward";
inline constexpr const char* kLinearBiasGeluBackwardOp = "te_linear_bias_gelu_backward";
inline constexpr const char* kDgeluBgradGemmOp = "te_dgelu_bgrad_gemm";
inline constexpr const char* kAddRmsNormFp8ForwardOp = "te_add_rms_norm_fp8_forward";
inline constexpr const char* kAddLayerNormFp8ForwardOp = "te_add_layer_norm_fp8_forward";
inline constexpr const char* kSwigluFp8ForwardOp = "te_swiglu_fp8_forward";

// The family's ops in the process-wide registry.
struct FusedOps {
  ops::KernelOp<AddRmsNormForwardKernel> add_rms_norm_forward;
  ops::KernelOp<AddRmsNormBackwardKernel> add_rms_norm_backward;
  ops::KernelOp<AddLayerNormForwardKernel> add_layer_norm_forward;
  ops::KernelOp<AddLayerNormBackwardKernel> add_layer_norm_backward;
  ops::KernelOp<ApplyRopeKernel> apply_rope;
  ops::KernelOp<SplitQkvRopeForwardKernel> split_qkv_rope_forward;
  ops::KernelOp<SplitQkvRopeBackwardKernel> split_qkv_rope_backward;
  ops::KernelOp<SwigluForwardKernel> swiglu_forward;
  ops::KernelOp<SwigluBackwardKernel> swiglu_backward;
  ops::KernelOp<CrossEntropyChunkKernel> cross_entropy_chunk;
  ops::KernelOp<LinearBiasGeluForwardKernel> linear_bias_gelu_forward;
  ops::KernelOp<LinearBiasGeluBackwardKernel> linear_bias_gelu_backward;
  ops::KernelOp<DgeluBgradGemmKernel> dgelu_bgrad_gemm;
  ops::KernelOp<AddRmsNormFp8ForwardKernel> add_rms_norm_fp8_forward;
  ops::KernelOp<AddLayerNormFp8ForwardKernel> add_layer_norm_fp8_forward;
  ops::KernelOp<SwigluFp8ForwardKernel> swiglu_fp8_forward;
};

// Registers the family's kernels (CPU, and CUDA in a CUDA build) in `registry`.
void register_fused_ops(ops::KernelRegistry& registry);
// The ops in the process-wide registry, registering the family there on the first call unless
// it is registered already.
const FusedOps& fused_ops();

// The kernels, one per backend. Declared through the kernel types, so a definition that drifts
// from its registry signature does not compile.
namespace cpu {
AddRmsNormForwardKernel add_rms_norm_forward;
AddRmsNormBackwardKernel add_rms_norm_backward;
AddLayerNormForwardKernel add_layer_norm_forward;
AddLayerNormBackwardKernel add_layer_norm_backward;
ApplyRopeKernel apply_rope;
SplitQkvRopeForwardKernel split_qkv_rope_forward;
SplitQkvRopeBackwardKernel split_qkv_rope_backward;
SwigluForwardKernel swiglu_forward;
SwigluBackwardKernel swiglu_backward;
CrossEntropyChunkKernel cross_entropy_chunk;
LinearBiasGeluForwardKernel linear_bias_gelu_forward;
LinearBiasGeluBackwardKernel linear_bias_gelu_backward;
DgeluBgradGemmKernel dgelu_bgrad_gemm;
AddRmsNormFp8ForwardKernel add_rms_norm_fp8_forward;
AddLayerNormFp8ForwardKernel add_layer_norm_fp8_forward;
SwigluFp8ForwardKernel swiglu_fp8_forward;
}  // namespace cpu
#if KILN_WITH_CUDA
namespace cuda {
AddRmsNormForwardKernel add_rms_norm_forward;
AddRmsNormBackwardKernel add_rms_norm_backward;
AddLayerNormForwardKernel add_layer_norm_forward;
AddLayerNormBackwardKernel add_layer_norm_backward;
ApplyRopeKernel apply_rope;
SplitQkvRopeForwardKernel split_qkv_rope_forward;
SplitQkvRopeBackwardKernel split_qkv_rope_backward;
SwigluForwardKernel swiglu_forward;
SwigluBackwardKernel swiglu_backward;
CrossEntropyChunkKernel cross_entropy_chunk;
LinearBiasGeluForwardKernel linear_bias_gelu_forward;
LinearBiasGeluBackwardKernel linear_bias_gelu_backward;
DgeluBgradGemmKernel dgelu_bgrad_gemm;
AddRmsNormFp8ForwardKernel add_rms_norm_fp8_forward;
AddLayerNormFp8ForwardKernel add_layer_norm_fp8_forward;
SwigluFp8ForwardKernel swiglu_fp8_forward;
}  // namespace cuda
#endif

}  // namespace kiln::te
