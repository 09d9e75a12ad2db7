#pragma once
// NonFiniteGuard: finds the first training step whose loss or gradients are not finite (NaN or
// inf), without a host synchronisation per step. Each step adds a handful of scalar kernels on the
// device (one multi-tensor sum of squares over all gradients, then scalar arithmetic), which a CUDA
// graph captures with the rest of the step; the host reads the verdict (8 bytes) only where it
// synchronises anyway (the progress print, the end of the epoch).
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::train {

class NonFiniteGuard {
 public:
  explicit NonFiniteGuard(Device device);

  // Counts one step and remembers it when `loss` or a gradient of `params` is not finite (a
  // gradient too large for its squares to sum in float32 counts as not finite, as PyTorch's
  // clip_grad_norm_(error_if_nonfinite=True) sees it). Capturable.
  void record(const Tensor& loss, const std::vector<Tensor>& params);
  // The same, from the gradients' sum of squares (a float32 scalar) where the caller has it
  // already (the gradient norm's): one pass over the gradients serves both.
  void record_squares(const Tensor& loss, const Tensor& squares);

  // The number (1-based, counting record() calls) of the first step with a non-finite loss or
  // gradient; nullopt while there has been none. Reads one scalar from the device.
  std::optional<std::int64_t> first_bad_step() const;

 private:
  Device device_;
  Tensor steps_;      // int64: record() calls so far
  Tensor first_bad_;  // int64: the first bad step, or kNone
  Tensor none_;       // int64: kNone
};

}  // namespace kiln::train
