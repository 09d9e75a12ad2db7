#pragma once
// Autocast: a thread-local compute dtype for the matmul-like ops (matmul, bmm, linear, conv2d),
// as torch.autocast. Inside an AutocastGuard(DType::BF16) scope those ops cast their floating
// inputs to bf16 (a differentiable cast, so gradients flow back to fp32 parameters in fp32) and
// return bf16. Parameters stay fp32 and are the master weights; the optimizer is unchanged.
// Every other op runs in its inputs' dtype: cast activations back with .to(DType::F32) where
// full precision matters (losses, softmax).
#include <optional>

#include "kiln/tensor/tensor.h"

namespace kiln {

// The active autocast dtype of this thread, or nullopt outside any autocast scope.
std::optional<DType> autocast_dtype();
void set_autocast_dtype(std::optional<DType> dtype);

class AutocastGuard {
 public:
  // enabled=false opens a scope with autocast off (e.g. for a loss inside an autocast region).
  explicit AutocastGuard(DType dtype = DType::BF16, bool enabled = true) : previous_(autocast_dtype()) {
    set_autocast_dtype(enabled ? std::optional<DType>(dtype) : std::nullopt);
  }
  ~AutocastGuard() { set_autocast_dtype(previous_); }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  std::optional<DType> previous_;
};

// `t` cast (differentiably) to the autocast dtype when autocast is on and t is a floating tensor
// of another dtype; `t` itself otherwise (undefined stays undefined). What autocast-eligible ops
// call on their inputs. Defined in autograd/functions/linalg.cpp (it records a graph node).
Tensor autocast_input(const Tensor& t);

}  // namespace kiln
