// Tensor metadata, raw views and allocation. Nothing here computes on tensor values.
#include "kiln/tensor/tensor.h"

#include "kiln/runtime/backend.h"

namespace kiln {

namespace {
std::shared_ptr<TensorImpl> new_impl(std::shared_ptr<Storage> storage, Shape shape, Strides strides,
                                     std::int64_t offset, DType dtype) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::move(storage);
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = dtype;
  return impl;
}
}  // namespace

Tensor Tensor::empty(Shape shape, DType dtype, Device device) {
  for (auto s : shape) KILN_CHECK(s >= 0, "empty: negative dimension in shape {}", shape_str(shape));
  auto bytes = static_cast<std::size_t>(numel_of(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(bytes, device);
  Strides strides = contiguous_strides(shape);
  return Tensor(new_impl(std::move(storage), std::move(shape), std::move(strides), 0, dtype));
}

Tensor Tensor::from_host(const void* data, Shape shape, DType dtype, Device device) {
  Tensor t = empty(std::move(shape), dtype, device);
  if (t.nbytes() > 0) backend_for(device).copy_from_host(t.data_ptr(), data, t.nbytes(), device.index);
  return t;
}

Tensor Tensor::from_blob(void* data, Shape shape, DType dtype, Device device) {
  auto bytes = static_cast<std::size_t>(numel_of(shape)) * dtype_size(dtype);
  auto storage = std::make_shared<Storage>(data, bytes, device);
  Strides strides = contiguous_strides(shape);
  return Tensor(new_impl(std::move(storage), std::move(shape), std::move(strides), 0, dtype));
}

std::int64_t Tensor::size(std::int64_t dim) const { return impl_->shape[wrap_dim(dim, this->dim(), "size")]; }
std::int64_t Tensor::stride(std::int64_t dim) const { return impl_->strides[wrap_dim(dim, this->dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  std::int64_t expected = 1;
  for (std::size_t i = impl_->shape.size(); i-- > 0;) {
    if (impl_->shape[i] == 1) continue;
    if (impl_->strides[i] != expected) return false;
    expected *= impl_->shape[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  KILN_CHECK(defined(), "data_ptr() on an undefined tensor");
  return static_cast<char*>(impl_->storage->data()) + impl_->offset * static_cast<std::int64_t>(element_size());
}

std::string Tensor::describe() const {
  if (!defined()) return "undefined tensor";
  return fmt::format("{}{} on {}", dtype_name(dtype()), shape_str(shape()), device().str());
}

bool Tensor::is_leaf() const { return impl_->grad_fn == nullptr; }

Tensor make_view(const Tensor& base, Shape shape, Strides strides, std::int64_t offset) {
  return Tensor(new_impl(base.storage(), std::move(shape), std::move(strides), offset, base.dtype()));
}

Tensor empty_like(const Tensor& t) { return Tensor::empty(t.shape(), t.dtype(), t.device()); }
Tensor empty_like(const Tensor& t, DType dtype) { return Tensor::empty(t.shape(), dtype, t.device()); }

}  // namespace kiln
