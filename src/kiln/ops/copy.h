#pragma once
// Raw (non-differentiable) copies and conversions between dtypes and devices.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// dst <- src, broadcasting src to dst's shape, converting dtype and crossing devices.
void copy_into(const Tensor& dst, const Tensor& src);
Tensor contiguous(const Tensor& t);  // returns t itself when already contiguous
// `t`'s elements (made contiguous if needed) viewed with another shape of the same element count.
Tensor contiguous_view(const Tensor& t, const Shape& shape);
Tensor to(const Tensor& t, Device device, DType dtype);  // returns t itself when nothing changes
void fill(const Tensor& dst, double value);
// acc += src, src converted to acc's dtype in the same pass (acc float32 or float64, src any
// floating dtype, same shape and device): a low-precision gradient into its fp32 accumulator.
void accumulate_(const Tensor& acc, const Tensor& src);
// `t` broadcast to `shape` as a strided view (stride 0 on broadcast dims); no copy.
Tensor broadcast_to(const Tensor& t, const Shape& shape, const char* op);

}  // namespace kiln::ops
