#include "kiln/te/fused_ops.h"

namespace kiln::te {

void register_fused_ops(ops::KernelRegistry& registry) {
  const auto rms_fwd = registry.declare<AddRmsNormForwardKernel>(kAddRmsNormForwardOp);
  const auto rms_bwd = registry.declare<AddRmsNormBackwardKernel>(kAddRmsNormBackwardOp);
  const auto ln_fwd = registry.declare<AddLayerNormForwardKernel>(kAddLayerNormForwardOp);
  const auto ln_bwd = registry.declare<AddLayerNormBackwardKernel>(kAddLayerNormBackwardOp);
  const auto rope = registry.declare<ApplyRopeKernel>(kApplyRopeOp);
  const auto qkv_rope_fwd = registry.declare<SplitQkvRopeForwardKernel>(kSplitQkvRopeForwardOp);
  const auto qkv_rope_bwd = registry.declare<SplitQkvRopeBackwardKernel>(kSplitQkvRopeBackwardOp);
  const auto glu_fwd = registry.declare<SwigluForwardKernel>(kSwigluForwardOp);
  const auto glu_bwd = registry.declare<SwigluBackwardKernel>(kSwigluBackwardOp);
  const auto ce = registry.declare<CrossEntropyChunkKernel>(kCrossEntropyChunkOp);
  const auto gelu_fwd = registry.declare<LinearBiasGeluForwardKernel>(kLinearBiasGeluForwardOp);
  const auto gelu_bwd = registry.declare<LinearBiasGeluBackwardKernel>(kLinearBiasGeluBackwardOp);
  const auto dgelu_gemm = registry.declare<DgeluBgradGemmKernel>(kDgeluBgradGemmOp);
  registry.add(rms_fwd, DeviceKind::CPU, cpu::add_rms_norm_forward);
  registry.add(rms_bwd, DeviceKind::CPU, cpu::add_rms_norm_backward);
  registry.add(ln_fwd, DeviceKind::CPU, cpu::add_layer_norm_forward);
  registry.add(ln_bwd, DeviceKind::CPU, cpu::add_layer_norm_backward);
  registry.add(rope, DeviceKind::CPU, cpu::apply_rope);
  registry.add(qkv_rope_fwd, DeviceKind::CPU, cpu::split_qkv_rope_forward);
  registry.add(qkv_rope_bwd, DeviceKind::CPU, cpu::split_qkv_rope_backward);
  registry.add(glu_fwd, DeviceKind::CPU, cpu::swiglu_forward);
  registry.add(glu_bwd, DeviceKind::CPU, cpu::swiglu_backward);
  registry.add(ce, DeviceKind::CPU, cpu::cross_entropy_chunk);
  registry.add(gelu_fwd, DeviceKind::CPU, cpu::linear_bias_gelu_forward);
  registry.add(gelu_bwd, DeviceKind::CPU, cpu::linear_bias_gelu_backward);
  registry.add(dgelu_gemm, DeviceKind::CPU, cpu::dgelu_bgrad_gemm);
  const auto rms_fp8 = registry.declare<AddRmsNormFp8ForwardKernel>(kAddRmsNormFp8ForwardOp);
  const auto ln_fp8 = registry.declare<AddLayerNormFp8ForwardKernel>(kAddLayerNormFp8ForwardOp);
  const auto glu_fp8 = registry.declare<SwigluFp8ForwardKernel>(kSwigluFp8ForwardOp);
  registry.add(rms_fp8, DeviceKind::CPU, cpu::add_rms_norm_fp8_forward);
  registry.add(ln_fp8, DeviceKind::CPU, cpu::add_layer_norm_fp8_forward);
  registry.add(glu_fp8, DeviceKind::CPU, cpu::swiglu_fp8_forward);
#if KILN_WITH_CUDA
  // The CUDA kernels compute in f32 from bf16/f16/f32 data; f64 stays the CPU reference path.
  const ops::DTypeSet low = {DType::F32, DType::BF16, DType::F16};
  registry.add(rms_fwd, DeviceKind::CUDA, cuda::add_rms_norm_forward, low);
  registry.add(rms_bwd, DeviceKind::CUDA, cuda::add_rms_norm_backward, low);
  registry.add(ln_fwd, DeviceKind::CUDA, cuda::add_layer_norm_forward, low);
  registry.add(ln_bwd, DeviceKind::CUDA, cuda::add_layer_norm_backward, low);
  registry.add(rope, DeviceKind::CUDA, cuda::apply_rope, low);
  registry.add(qkv_rope_fwd, DeviceKind::CUDA, cuda::split_qkv_rope_forward, low);
  registry.add(qkv_rope_bwd, DeviceKind::CUDA, cuda::split_qkv_rope_backward, low);
  registry.add(glu_fwd, DeviceKind::CUDA, cuda::swiglu_forward, low);
  registry.add(glu_bwd, DeviceKind::CUDA, cuda::swiglu_backward, low);
  registry.add(ce, DeviceKind::CUDA, cuda::cross_entropy_chunk, low);
  registry.add(gelu_fwd, DeviceKind::CUDA, cuda::linear_bias_gelu_forward, low);
  registry.add(gelu_bwd, DeviceKind::CUDA, cuda::linear_bias_gelu_backward, low);
  registry.add(dgelu_gemm, DeviceKind::CUDA, cuda::dgelu_bgrad_gemm, low);
  registry.add(rms_fp8, DeviceKind::CUDA, cuda::add_rms_norm_fp8_forward, low);
  registry.add(ln_fp8, DeviceKind::CUDA, cuda::add_layer_norm_fp8_forward, low);
  registry.add(glu_fp8, DeviceKind::CUDA, cuda::swiglu_fp8_forward, low);
#endif
}

const FusedOps& fused_ops() {
  static const FusedOps ops = [] {
    ops::KernelRegistry& r = ops::kernel_registry();
    // A caller may have registered the family in the process-wide registry already (a layer-wide
    // registration at startup): registering twice would be refused as a taken slot.
    if (!r.has_kernel(kAddRmsNormForwardOp, DeviceKind::CPU, DType::F32)) register_fused_ops(r);
    return FusedOps{r.find<AddRmsNormForwardKernel>(kAddRmsNormForwardOp),
                    r.find<AddRmsNormBackwardKernel>(kAddRmsNormBackwardOp),
                    r.find<AddLayerNormForwardKernel>(kAddLayerNormForwardOp),
                    r.find<AddLayerNormBackwardKernel>(kAddLayerNormBackwardOp),
                    r.find<ApplyRopeKernel>(kApplyRopeOp),
                    r.find<SplitQkvRopeForwardKernel>(kSplitQkvRopeForwardOp),
                    r.find<SplitQkvRopeBackwardKernel>(kSplitQkvRopeBackwardOp),
                    r.find<SwigluForwardKernel>(kSwigluForwardOp),
                    r.find<SwigluBackwardKernel>(kSwigluBackwardOp),
                    r.find<CrossEntropyChunkKernel>(kCrossEntropyChunkOp),
                    r.find<LinearBiasGeluForwardKernel>(kLinearBiasGeluForwardOp),
                    r.find<LinearBiasGeluBackwardKernel>(kLinearBiasGeluBackwardOp),
                    r.find<DgeluBgradGemmKernel>(kDgeluBgradGemmOp),
                    r.find<AddRmsNormFp8ForwardKernel>(kAddRmsNormFp8ForwardOp),
                    r.find<AddLayerNormFp8ForwardKernel>(kAddLayerNormFp8ForwardOp),
                    r.find<SwigluFp8ForwardKernel>(kSwigluFp8ForwardOp)};
  }();
  return ops;
}

}  // namespace kiln::te
