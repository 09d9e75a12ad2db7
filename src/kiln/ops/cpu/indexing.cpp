// CPU index_select / index_add / gather / scatter_add / topk. Index tensors are int64; every
// index is bounds-checked (the error names the op, the index and the dimension size).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/cpu_kernels.h"
#include "kiln/ops/cpu/parallel.h"

namespace kiln::ops::cpu {

namespace {

Tensor dense(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty_like(t);
  copy(t, out);
  return out;
}

// t viewed as [outer, size(dim), inner].
void split_at(const Shape& shape, int dim, std::int64_t& outer, std::int64_t& inner) {
  outer = 1;
  inner = 1;
  for (int d = 0; d < dim; ++d) outer *= shape[d];
  for (std::size_t d = static_cast<std::size_t>(dim) + 1; d < shape.size(); ++d) inner *= shape[d];
}

inline std::int64_t checked(const char* op, std::int64_t i, std::int64_t size) {
  KILN_CHECK(i >= -size && i < size, "{}: index {} is out of range for a dimension of size {}", op, i, size);
  return i < 0 ? i + size : i;
}

// Calls fn(index_pos, self_offset) for every element of `index` (contiguous), where self_offset
// is the element of a contiguous tensor of shape `self_shape` addressed by the index position
// with coordinate `dim` replaced by the index value.
template <class Fn>
void for_each_indexed(const char* op, const Tensor& index, const Shape& self_shape, int dim, Fn&& fn) {
  const auto* ip = static_cast<const std::int64_t*>(index.data_ptr());
  const Shape& ishape = index.shape();
  const std::int64_t nd = static_cast<std::int64_t>(ishape.size());
  const Strides sstr = contiguous_strides(self_shape);
  std::vector<std::int64_t> coord(static_cast<std::size_t>(nd), 0);
  std::int64_t base = 0;  // self offset of coord without the dim component
  const std::int64_t n = index.numel();
  for (std::int64_t pos = 0; pos < n; ++pos) {
    const std::int64_t i = checked(op, ip[pos], self_shape[dim]);
    fn(pos, base + i * sstr[dim]);
    for (std::int64_t d = nd - 1; d >= 0; --d) {
      if (++coord[d] < ishape[d]) {
        if (d != dim) base += sstr[d];
        break;
      }
      if (d != dim) base -= sstr[d] * (ishape[d] - 1);
      coord[d] = 0;
    }
  }
}

}  // namespace

void index_select(const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  Tensor src = dense(in);
  std::int64_t outer, inner;
  split_at(src.shape(), dim, outer, inner);
  const std::int64_t size = src.shape()[dim], n = index.numel();
  const auto* ip = static_cast<const std::int64_t*>(index.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) checked("index_select", ip[i], size);
  const std::size_t esize = src.element_size();
  const auto* sp = static_cast<const char*>(src.data_ptr());
  auto* op = static_cast<char*>(out.data_ptr());
  parallel_for(outer * n, std::max<std::int64_t>(1, 16384 / std::max<std::int64_t>(inner, 1)),
               [&](std::int64_t lo, std::int64_t hi) {
                 for (std::int64_t t = lo; t < hi; ++t) {
                   const std::int64_t o = t / n, i = t % n;
                   const std::int64_t row = ip[i] < 0 ? ip[i] + size : ip[i];
                   std::copy_n(sp + ((o * size + row) * inner) * esize, inner * esize, op + t * inner * esize);
                 }
               });
}

void index_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  Tensor s = dense(src);
  std::int64_t outer, inner;
  split_at(out.shape(), dim, outer, inner);
  const std::int64_t size = out.shape()[dim], n = index.numel();
  const auto* ip = static_cast<const std::int64_t*>(index.data_ptr());
  for (std::int64_t i = 0; i < n; ++i) checked("index_add", ip[i], size);
  KILN_DISPATCH_NUMERIC(out.dtype(), "index_add", [&]<class T>() {
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* sp = static_cast<const T*>(s.data_ptr());
    auto add_rows = [&](std::int64_t ob, std::int64_t i, std::int64_t j0, std::int64_t j1) {
      const std::int64_t row = ip[i] < 0 ? ip[i] + size : ip[i];
      T* dst = o + (ob * size + row) * inner;
      const T* from = sp + (ob * n + i) * inner;
      for (std::int64_t j = j0; j < j1; ++j) dst[j] = from_acc<T>(static_cast<A>(dst[j]) + static_cast<A>(from[j]));
    };
    if (outer >= num_threads()) {  // distinct outer slices never collide
      parallel_for(outer, 1, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t ob = lo; ob < hi; ++ob)
          for (std::int64_t i = 0; i < n; ++i) add_rows(ob, i, 0, inner);
      });
    } else {  // split the inner extent instead (duplicate indices hit the same row)
      parallel_for(inner, 256, [&](std::int64_t lo, std::int64_t hi) {
        for (std::int64_t ob = 0; ob < outer; ++ob)
          for (std::int64_t i = 0; i < n; ++i) add_rows(ob, i, lo, hi);
      });
    }
  });
}

void gather(const Tensor& in, int dim, const Tensor& index, const Tensor& out) {
  Tensor src = dense(in);
  Tensor idx = dense(index);
  KILN_DISPATCH_ALL(src.dtype(), "gather", [&]<class T>() {
    const T* sp = static_cast<const T*>(src.data_ptr());
    T* o = static_cast<T*>(out.data_ptr());
    for_each_indexed("gather", idx, src.shape(), dim, [&](std::int64_t pos, std::int64_t off) { o[pos] = sp[off]; });
  });
}

void scatter_add(const Tensor& out, int dim, const Tensor& index, const Tensor& src) {
  Tensor idx = dense(index);
  // Only the leading index-shaped region of src is read: view it with src's strides.
  Tensor region = make_view(src, idx.shape(), src.strides(), src.storage_offset());
  Tensor s = dense(region);
  KILN_DISPATCH_NUMERIC(out.dtype(), "scatter_add", [&]<class T>() {
    using A = acc_t<T>;
    T* o = static_cast<T*>(out.data_ptr());
    const T* sp = static_cast<const T*>(s.data_ptr());
    for_each_indexed("scatter_add", idx, out.shape(), dim, [&](std::int64_t pos, std::int64_t off) {
      o[off] = from_acc<T>(static_cast<A>(o[off]) + static_cast<A>(sp[pos]));
    });
  });
}

void topk(const Tensor& in, std::int64_t k, bool largest, const Tensor& values, const Tensor& indices) {
  const std::int64_t cols = in.dim() == 0 ? 1 : in.shape().back();
  const std::int64_t rows = cols == 0 ? 0 : in.numel() / cols;
  KILN_DISPATCH_NUMERIC(in.dtype(), "topk", [&]<class T>() {
    const T* xp = static_cast<const T*>(in.data_ptr());
    T* vp = static_cast<T*>(values.data_ptr());
    auto* ip = static_cast<std::int64_t*>(indices.data_ptr());
    parallel_for(rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(cols, 1)),
                 [&](std::int64_t lo, std::int64_t hi) {
                   std::vector<std::int64_t> order(static_cast<std::size_t>(cols));
                   for (std::int64_t r = lo; r < hi; ++r) {
                     const T* row = xp + r * cols;
                     std::iota(order.begin(), order.end(), std::int64_t{0});
                     // NaN counts as the largest value (as in PyTorch); ties keep the lower index first.
                     auto before = [&](std::int64_t a, std::int64_t b) {
                       const double va = static_cast<double>(row[a]), vb = static_cast<double>(row[b]);
                       const bool na = std::isnan(va), nb = std::isnan(vb);
                       if (na || nb) {
                         if (na && nb) return a < b;
                         return largest ? na : nb;
                       }
                       if (va != vb) return largest ? va > vb : va < vb;
                       return a < b;
                     };
                     std::partial_sort(order.begin(), order.begin() + k, order.end(), before);
                     for (std::int64_t i = 0; i < k; ++i) {
                       vp[r * k + i] = row[order[i]];
                       ip[r * k + i] = order[i];
                     }
                   }
                 });
  });
}

}  // namespace kiln::ops::cpu
