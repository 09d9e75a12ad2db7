#pragma once
// Iteration over several same-shaped tensors with arbitrary strides, for CPU kernels.
// Dimensions are coalesced first, so a contiguous tensor becomes one flat loop.
#include <array>
#include <cstdint>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::ops::cpu {

template <std::size_t N>
struct StridedLayout {
  std::vector<std::int64_t> shape;                   // coalesced, outermost first
  std::array<std::vector<std::int64_t>, N> strides;  // in elements, per tensor
};

template <std::size_t N>
StridedLayout<N> coalesce(const Shape& shape, const std::array<const Strides*, N>& strides) {
  StridedLayout<N> out;
  for (std::size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    bool merge = !out.shape.empty();
    for (std::size_t t = 0; t < N && merge; ++t) merge = out.strides[t].back() == (*strides[t])[d] * shape[d];
    if (merge) {
      out.shape.back() *= shape[d];
      for (std::size_t t = 0; t < N; ++t) out.strides[t].back() = (*strides[t])[d];
    } else {
      out.shape.push_back(shape[d]);
      for (std::size_t t = 0; t < N; ++t) out.strides[t].push_back((*strides[t])[d]);
    }
  }
  if (out.shape.empty()) {
    out.shape.push_back(1);
    for (std::size_t t = 0; t < N; ++t) out.strides[t].push_back(1);
  }
  return out;
}

// Calls body(offsets, inner_size, inner_strides) once per innermost row; offsets are element
// offsets of each tensor's row start. The body runs a tight loop over the row.
template <std::size_t N, class Body>
void for_each_row(const StridedLayout<N>& layout, Body&& body) {
  // No elements, no rows, whatever the other sizes: a [2^62, 0] tensor (a safetensors header can
  // declare one) must not loop over 2^62 empty rows.
  for (const std::int64_t size : layout.shape)
    if (size == 0) return;
  const auto nd = layout.shape.size();
  const std::int64_t inner = layout.shape[nd - 1];
  std::array<std::int64_t, N> inner_strides;
  for (std::size_t t = 0; t < N; ++t) inner_strides[t] = layout.strides[t][nd - 1];
  std::int64_t rows = 1;
  for (std::size_t d = 0; d + 1 < nd; ++d) rows *= layout.shape[d];
  std::vector<std::int64_t> index(nd, 0);
  std::array<std::int64_t, N> offsets{};
  for (std::int64_t r = 0; r < rows; ++r) {
    body(offsets, inner, inner_strides);
    for (std::size_t d = nd - 1; d-- > 0;) {  // advance the outer counter
      ++index[d];
      for (std::size_t t = 0; t < N; ++t) offsets[t] += layout.strides[t][d];
      if (index[d] < layout.shape[d]) break;
      for (std::size_t t = 0; t < N; ++t) offsets[t] -= layout.strides[t][d] * layout.shape[d];
      index[d] = 0;
    }
  }
}

}  // namespace kiln::ops::cpu
