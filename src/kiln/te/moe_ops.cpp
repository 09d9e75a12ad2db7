#include "kiln/te/moe_ops.h"

namespace kiln::te {

void register_moe_ops(ops::KernelRegistry& registry) {
  const auto topk_fwd = registry.declare<RouterTopkForwardKernel>(kRouterTopkForwardOp);
  const auto topk_bwd = registry.declare<RouterTopkBackwardKernel>(kRouterTopkBackwardOp);
  const auto plan = registry.declare<MoeDispatchPlanKernel>(kMoeDispatchPlanOp);
  const auto permute = registry.declare<MoePermuteKernel>(kMoePermuteOp);
  const auto unpermute = registry.declare<MoeUnpermuteKernel>(kMoeUnpermuteOp);
  const auto unpermute_bwd = registry.declare<MoeUnpermuteBackwardKernel>(kMoeUnpermuteBackwardOp);
  const auto gemm = registry.declare<GroupedGemmKernel>(kGroupedGemmOp);
  const auto wgrad = registry.declare<GroupedGemmWgradKernel>(kGroupedGemmWgradOp);
  // The router works on f32 logits and probabilities whatever the model's dtype (f64 too on the CPU, the
  // reference path); the plan is keyed by its int64 indices.
  registry.add(topk_fwd, DeviceKind::CPU, cpu::router_topk_forward, {DType::F32, DType::F64});
  registry.add(topk_bwd, DeviceKind::CPU, cpu::router_topk_backward, {DType::F32, DType::F64});
  registry.add(plan, DeviceKind::CPU, cpu::moe_dispatch_plan, {DType::I64});
  registry.add(permute, DeviceKind::CPU, cpu::moe_permute);
  registry.add(unpermute, DeviceKind::CPU, cpu::moe_unpermute);
  registry.add(unpermute_bwd, DeviceKind::CPU, cpu::moe_unpermute_backward);
  registry.add(gemm, DeviceKind::CPU, cpu::grouped_gemm);
  registry.add(wgrad, DeviceKind::CPU, cpu::grouped_gemm_wgrad);
#if KILN_WITH_CUDA
  // The data kernels compute in f32 from bf16/f16/f32 data; f64 stays the CPU reference path.
  const ops::DTypeSet low = {DType::F32, DType::BF16, DType::F16};
  registry.add(topk_fwd, DeviceKind::CUDA, cuda::router_topk_forward, {DType::F32});
  registry.add(topk_bwd, DeviceKind::CUDA, cuda::router_topk_backward, {DType::F32});
  registry.add(plan, DeviceKind::CUDA, cuda::moe_dispatch_plan, {DType::I64});
  registry.add(permute, DeviceKind::CUDA, cuda::moe_permute, low);
  registry.add(unpermute, DeviceKind::CUDA, cuda::moe_unpermute, low);
  registry.add(unpermute_bwd, DeviceKind::CUDA, cuda::moe_unpermute_backward, low);
  registry.add(gemm, DeviceKind::CUDA, cuda::grouped_gemm, low);
  registry.add(wgrad, DeviceKind::CUDA, cuda::grouped_gemm_wgrad, low);
#endif
}

const MoeOps& moe_ops() {
  static const MoeOps ops = [] {
    ops::KernelRegistry& r = ops::kernel_registry();
    if (!r.has_kernel(kRouterTopkForwardOp, DeviceKind::CPU, DType::F32)) register_moe_ops(r);
    return MoeOps{r.find<RouterTopkForwardKernel>(kRouterTopkForwardOp),
                  r.find<RouterTopkBackwardKernel>(kRouterTopkBackwardOp),
                  r.find<MoeDispatchPlanKernel>(kMoeDispatchPlanOp),
                  r.find<MoePermuteKernel>(kMoePermuteOp),
                  r.find<MoeUnpermuteKernel>(kMoeUnpermuteOp),
                  r.find<MoeUnpermuteBackwardKernel>(kMoeUnpermuteBackwardOp),
                  r.find<GroupedGemmKernel>(kGroupedGemmOp),
                  r.find<GroupedGemmWgradKernel>(kGroupedGemmWgradOp)};
  }();
  return ops;
}

}  // namespace kiln::te
