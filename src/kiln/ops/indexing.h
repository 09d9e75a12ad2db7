#pragma once
// Raw indexing ops (index_select, index_add, gather, scatter_add, topk). Index tensors are int64.
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

Tensor index_select(const Tensor& x, std::int64_t dim, const Tensor& index);  // index 1-D
// out[..., index[i], ...] += src[..., i, ...] in place; out must be contiguous.
void index_add_(const Tensor& out, std::int64_t dim, const Tensor& index, const Tensor& src);
Tensor gather(const Tensor& x, std::int64_t dim, const Tensor& index);
// out[..index[p]..] += src[p] in place over every position p of index; out must be contiguous.
void scatter_add_(const Tensor& out, std::int64_t dim, const Tensor& index, const Tensor& src);
// Along the last dimension; returns {values, int64 indices}, sorted.
std::pair<Tensor, Tensor> topk(const Tensor& x, std::int64_t k, bool largest);

}  // namespace kiln::ops
