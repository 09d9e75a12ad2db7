#include "kiln/ops/copy.h"

#include "kiln/ops/checks.h"
#include "kiln/ops/kernels.h"
#include "kiln/ops/memory_format.h"
#include "kiln/runtime/backend.h"

namespace kiln::ops {

Tensor broadcast_to(const Tensor& t, const Shape& shape, const char* op) {
  if (t.shape() == shape) return t;
  KILN_CHECK(shape.size() >= t.shape().size(), "{}: cannot broadcast {} to {}", op, shape_str(t.shape()),
             shape_str(shape));
  Strides strides(shape.size(), 0);
  std::size_t lead = shape.size() - t.shape().size();
  for (std::size_t i = 0; i < t.shape().size(); ++i) {
    std::int64_t have = t.shape()[i];
    KILN_CHECK(have == shape[lead + i] || have == 1, "{}: cannot broadcast {} to {}", op, shape_str(t.shape()),
               shape_str(shape));
    strides[lead + i] = have == 1 ? 0 : t.strides()[i];
  }
  return make_view(t, shape, std::move(strides), t.storage_offset());
}

void copy_into(const Tensor& dst, const Tensor& src) {
  check_defined("copy_", dst, "destination");
  check_defined("copy_", src, "source");
  if (dst.numel() == 0) return;
  Tensor s = broadcast_to(src, dst.shape(), "copy_");
  if (s.device() == dst.device()) {
    KILN_KERNEL(dst.device(), copy)(s, dst);
    return;
  }
  // Across devices: convert and compact on the source side, move the bytes, then scatter into
  // dst's layout on the destination side if dst is strided.
  Tensor packed = Tensor::empty(dst.shape(), dst.dtype(), s.device());
  KILN_KERNEL(s.device(), copy)(s, packed);
  Tensor landing = dst.is_contiguous() ? dst : Tensor::empty(dst.shape(), dst.dtype(), dst.device());
  if (s.device().is_cpu()) {
    backend_for(dst.device())
        .copy_from_host(landing.data_ptr(), packed.data_ptr(), packed.nbytes(), dst.device().index);
  } else if (dst.device().is_cpu()) {
    backend_for(s.device()).copy_to_host(landing.data_ptr(), packed.data_ptr(), packed.nbytes(), s.device().index);
  } else {
    Tensor host = Tensor::empty(dst.shape(), dst.dtype(), Device::cpu());
    backend_for(s.device()).copy_to_host(host.data_ptr(), packed.data_ptr(), packed.nbytes(), s.device().index);
    backend_for(dst.device()).copy_from_host(landing.data_ptr(), host.data_ptr(), host.nbytes(), dst.device().index);
  }
  if (!landing.is_same(dst)) KILN_KERNEL(dst.device(), copy)(landing, dst);
}

Tensor contiguous(const Tensor& t) {
  if (t.is_contiguous()) return t;
  Tensor out = empty_like(t);
  KILN_KERNEL(t.device(), copy)(t, out);
  return out;
}

Tensor contiguous_view(const Tensor& t, const Shape& shape) {
  KILN_CHECK(numel_of(shape) == t.numel(), "contiguous_view: {} cannot be viewed as {}", t.describe(),
             shape_str(shape));
  Tensor c = contiguous(t);
  return make_view(c, shape, contiguous_strides(shape), c.storage_offset());
}

Tensor to(const Tensor& t, Device device, DType dtype) {
  if (t.device() == device && t.dtype() == dtype) return t;
  if (t.device() == device && !t.is_contiguous() && is_non_overlapping_dense(t)) {
    // A dtype conversion keeps a dense layout (a channels-last activation cast for autocast
    // stays channels-last) and runs as a flat copy.
    Tensor out = empty_like_dense(t, dtype);
    KILN_KERNEL(device, copy)(flat_dense_view(t), flat_dense_view(out));
    return out;
  }
  Tensor out = Tensor::empty(t.shape(), dtype, device);
  copy_into(out, t);
  return out;
}

void accumulate_(const Tensor& acc, const Tensor& src) {
  KILN_CHECK(acc.defined() && src.defined(), "accumulate_: both tensors must be defined");
  KILN_CHECK(acc.device() == src.device(), "accumulate_: the accumulator {} and the addend {} are on different devices",
             acc.describe(), src.describe());
  KILN_CHECK(acc.shape() == src.shape(), "accumulate_: the accumulator {} and the addend {} differ in shape",
             acc.describe(), src.describe());
  KILN_CHECK(acc.dtype() == DType::F32 || acc.dtype() == DType::F64,
             "accumulate_: the accumulator must be float32 or float64, got {}", acc.describe());
  KILN_CHECK(is_floating(src.dtype()), "accumulate_: the addend must be floating point, got {}", src.describe());
  if (acc.numel() > 0) KILN_KERNEL(acc.device(), accumulate)(acc, src);
  acc.storage()->bump_version();
}

void fill(const Tensor& dst, double value) {
  if (dst.numel() == 0) return;
  if (value == 0.0 && dst.is_contiguous()) {
    backend_for(dst.device()).memset_zero(dst.data_ptr(), dst.nbytes(), dst.device().index);
    return;
  }
  KILN_KERNEL(dst.device(), fill)(dst, value);
}

}  // namespace kiln::ops
