#pragma once
// Memory formats: which order a tensor's elements lie in memory, read from its strides (as in
// PyTorch, there is no separate flag). Kiln's CUDA convolutions and batch norm run natively on
// channels-last activations ([N, C, H, W] indexed, stored N, H, W, C: what cuDNN's tensor-core
// engines consume without transposes); elementwise ops keep any dense layout, so a network whose
// input is channels-last stays channels-last from layer to layer.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

// Whether t's elements fill a block of memory exactly once, in some order of its dimensions
// (contiguous and channels-last tensors are; broadcasts, slices with gaps and overlaps are not).
bool is_non_overlapping_dense(const Tensor& t);

// Whether t is a 4-D tensor stored channels-last (strides H*W*C, 1, W*C, C; size-1 dims ignored).
bool is_channels_last(const Tensor& t);

// Whether t is channels-last and not also contiguous (size-1 dims can make it both): the tensors
// that take the channels-last kernels.
inline bool is_channels_last_only(const Tensor& t) { return !t.is_contiguous() && is_channels_last(t); }

// A new, uninitialised [N, C, H, W] tensor stored channels-last.
Tensor empty_channels_last(const Shape& shape, DType dtype, Device device);

// t stored channels-last: t itself when it already is, else a copy.
Tensor to_channels_last(const Tensor& t);

// A new tensor shaped like t, of `dtype`, with t's strides when t is non-overlapping and dense
// (so elementwise results keep their input's layout, as PyTorch's TensorIterator does), and
// contiguous otherwise.
Tensor empty_like_dense(const Tensor& t, DType dtype);

// The 1-D view of a non-overlapping dense tensor's elements in memory order. Elementwise kernels
// run on such views of operands that share one dense layout as if they were contiguous.
Tensor flat_dense_view(const Tensor& t);

// Whether a and b have the same shape and strides and are non-overlapping and dense (but not
// contiguous: contiguous operands take the kernels' own fast path).
bool same_dense_layout(const Tensor& a, const Tensor& b);

}  // namespace kiln::ops
