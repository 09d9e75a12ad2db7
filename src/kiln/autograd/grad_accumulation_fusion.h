#pragma once
// Gradient-accumulation fusion (Megatron's --gradient-accumulation-fusion): the weight-gradient
// GEMM of a 16-bit parameter whose .grad is an fp32 main gradient (a view of a flat gradient
// buffer, optim/grad_buffers.h) adds its product straight into that .grad (an fp32 output with
// beta 1) instead of writing a 16-bit gradient that the parameter's AccumulateGrad then reads and
// adds. That saves a pass over every weight gradient (2 + 4 + 4 bytes a parameter) and a rounding:
// the product reaches the fp32 gradient in the GEMM's fp32 accumulator precision. FP8 linears
// (te/fp8_linear.cpp) do the same with their FP8 weight-gradient GEMM (ops::Fp8GemmOptions::accumulate).
//
//   // in a linear's backward, dy [1, rows, out] and x [1, rows, in]:
//   if (autograd::add_weight_grad_into_main_grad(weight, dy, x)) return Tensor();  // nothing flows
//   return ops::gemm(dy, x, true, false);                                          // the plain way
//
// It happens only while fusion is on (GradientAccumulationFusionScope; the GPT trainer turns it
// on unless --no-gradient-accumulation-fusion) and only in a backward that accumulates into .grad
// (autograd::run_backward, WeightGradStore::flush), never in autograd::grad(), which returns
// gradients instead (activation recompute's inner backward). The parameter's AccumulateGrad is
// told, so its grad-ready hooks still run once its gradient for this backward is complete.
#include "kiln/tensor/tensor.h"

namespace kiln::autograd {

// Turns fusion on or off for the whole process while alive; restores the previous setting.
class GradientAccumulationFusionScope {
 public:
  explicit GradientAccumulationFusionScope(bool on);
  ~GradientAccumulationFusionScope();
  GradientAccumulationFusionScope(const GradientAccumulationFusionScope&) = delete;
  GradientAccumulationFusionScope& operator=(const GradientAccumulationFusionScope&) = delete;

 private:
  bool previous_;
};
bool gradient_accumulation_fusion();

// Marks, on this thread, whether the backward being run accumulates into .grad (the engine and
// the weight-gradient store set it; autograd::grad() clears it). Restores the previous state.
class AccumulatingBackwardScope {
 public:
  explicit AccumulatingBackwardScope(bool accumulating);
  ~AccumulatingBackwardScope();
  AccumulatingBackwardScope(const AccumulatingBackwardScope&) = delete;
  AccumulatingBackwardScope& operator=(const AccumulatingBackwardScope&) = delete;

 private:
  bool previous_;
};

// The fp32 .grad that `weight`'s gradient may be added into here, or an undefined tensor: fusion
// off, not in an accumulating backward, `weight` not a bf16/f16 (or FP8 primary, te/fp8_linear.cpp's
// FP8 GEMM adds into it) leaf that requires grad, or its
// .grad absent, not fp32, not contiguous or on another device.
Tensor fusable_main_grad(const Tensor& weight);

// Tells `weight`'s AccumulateGrad that its gradient for this backward was added into the tensor
// fusable_main_grad(weight) returned (AccumulateGrad::note_accumulated_in_place): its hooks run when
// the engine reaches it, with or without a gradient through the graph.
void note_main_grad_accumulated(const Tensor& weight);

// weight.grad += dy^T x for dy [1, rows, out] and x [1, rows, in] (contiguous, weight's dtype),
// with weight [out, in], when fusable_main_grad(weight) allows it; then weight's AccumulateGrad is
// told (AccumulateGrad::note_accumulated_in_place) and true is returned. False: nothing was done,
// and the caller computes the gradient the plain way.
bool add_weight_grad_into_main_grad(const Tensor& weight, const Tensor& dy, const Tensor& x);

}  // namespace kiln::autograd
