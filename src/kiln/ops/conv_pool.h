#pragma once
// Raw 2-D convolution and pooling over NCHW tensors (no autograd; the differentiable versions
// are in autograd/functions.h). Inputs are made contiguous here; outputs are new tensors.
#include "kiln/ops/op_kinds.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// Output spatial size of a convolution or pooling window; throws naming `op` when not positive.
std::int64_t conv_output_size(const char* op, std::int64_t in, std::int64_t kernel, int stride, int pad, int dilation);

// x [N, C, H, W], w [OC, C / groups, KH, KW], bias [OC] or undefined -> [N, OC, OH, OW].
// Whether conv2d runs x channels-last (x is, and the device's kernels take it): then it lays the
// weight out channels-last too (a copy unless it already is).
bool conv2d_runs_channels_last(const Tensor& x);
Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dParams& p);
struct Conv2dGrads {
  Tensor x, w, b;  // undefined where not requested
};
Conv2dGrads conv2d_backward(const Tensor& grad_y, const Tensor& x, const Tensor& w, const Conv2dParams& p, bool need_x,
                            bool need_w, bool need_b);

// Returns {y, indices}; indices (int64) are flat h * W + w positions within each input plane.
std::pair<Tensor, Tensor> max_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor max_pool2d_backward(const Tensor& grad_y, const Tensor& indices, const Shape& x_shape, DType dtype,
                           const Pool2dParams& p);
Tensor avg_pool2d(const Tensor& x, const Pool2dParams& p);
Tensor avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, const Pool2dParams& p);
Tensor adaptive_avg_pool2d(const Tensor& x, std::int64_t out_h, std::int64_t out_w);
// channels_last: the forward ran channels-last (adaptive_avg_pool2d_runs_channels_last of its input);
// the gradient is then channels-last too.
Tensor adaptive_avg_pool2d_backward(const Tensor& grad_y, const Shape& x_shape, bool channels_last = false);
// Whether adaptive_avg_pool2d keeps x channels-last (x is, and the device's kernels take it).
bool adaptive_avg_pool2d_runs_channels_last(const Tensor& x);

}  // namespace kiln::ops
