#pragma once
// Tensor: a strided view of a Storage, with the autograd state that makes it part of a graph.
// Metadata and views are defined in tensor/; methods that compute (to, contiguous, arithmetic)
// are declared here for a PyTorch-like API and defined in the layers that implement them
// (ops/ for raw compute, autograd/ for the differentiable versions): see docs/ARCHITECTURE.md.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/dtype.h"
#include "kiln/tensor/shape.h"
#include "kiln/tensor/storage.h"

namespace kiln {

namespace autograd {
class Node;
}

class Tensor;

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  std::int64_t offset = 0;  // in elements
  Shape shape;
  Strides strides;
  DType dtype = DType::F32;

  // Autograd state. A leaf that requires grad accumulates into `grad`; a non-leaf has a grad_fn.
  bool requires_grad = false;
  bool retains_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<autograd::Node> grad_fn;
  std::weak_ptr<autograd::Node> grad_accumulator;  // leaves: created lazily, shared by all uses
  int output_nr = 0;                               // which output of grad_fn this is
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  // ---- factories (tensor/tensor.cpp; ops/factories.cpp for the random ones)
  static Tensor empty(Shape shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor zeros(Shape shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor ones(Shape shape, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor full(Shape shape, double value, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor arange(double start, double end, double step = 1, DType dtype = DType::F32,
                       Device device = Device::cpu());
  // Counter-based (Philox) random numbers: the same seed gives the same values on every device.
  static Tensor rand(Shape shape, std::uint64_t seed, DType dtype = DType::F32, Device device = Device::cpu());
  static Tensor randn(Shape shape, std::uint64_t seed, DType dtype = DType::F32, Device device = Device::cpu());
  // Copies host values in; `shape` defaults to {values.size()}.
  template <class T>
  static Tensor from_vector(const std::vector<T>& values, Shape shape = {}, Device device = Device::cpu());
  static Tensor from_host(const void* data, Shape shape, DType dtype, Device device = Device::cpu());
  // A view of external memory (not owned, not freed); the caller keeps it alive.
  static Tensor from_blob(void* data, Shape shape, DType dtype, Device device = Device::cpu());
  static Tensor scalar(double value, DType dtype = DType::F32, Device device = Device::cpu());

  // ---- metadata
  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl_->shape; }
  std::int64_t size(std::int64_t dim) const;
  const Strides& strides() const { return impl_->strides; }
  std::int64_t stride(std::int64_t dim) const;
  std::int64_t dim() const { return static_cast<std::int64_t>(impl_->shape.size()); }
  std::int64_t numel() const { return numel_of(impl_->shape); }
  DType dtype() const { return impl_->dtype; }
  Device device() const { return impl_->storage->device(); }
  std::size_t element_size() const { return dtype_size(impl_->dtype); }
  std::size_t nbytes() const { return static_cast<std::size_t>(numel()) * element_size(); }
  bool is_contiguous() const;
  std::int64_t storage_offset() const { return impl_->offset; }
  const std::shared_ptr<Storage>& storage() const { return impl_->storage; }
  void* data_ptr() const;
  template <class T>
  T* data() const;               // checks that T matches the dtype
  std::string describe() const;  // "float32[2, 3] on cuda:0": for error messages
  std::string str() const;       // the values, PyTorch-style (copies to the host)

  TensorImpl* impl() const { return impl_.get(); }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool is_same(const Tensor& other) const { return impl_ == other.impl_; }

  // ---- views: share storage, differentiable (tensor/views.h; autograd/functions/views.cpp)
  Tensor view(Shape shape) const;     // requires compatible strides
  Tensor reshape(Shape shape) const;  // a view when possible, else a copy
  Tensor permute(std::vector<std::int64_t> dims) const;
  Tensor transpose(std::int64_t d0, std::int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor slice(std::int64_t dim, std::int64_t start, std::int64_t end, std::int64_t step = 1) const;
  Tensor narrow(std::int64_t dim, std::int64_t start, std::int64_t length) const;
  Tensor select(std::int64_t dim, std::int64_t index) const;
  Tensor expand(Shape shape) const;
  Tensor squeeze(std::int64_t dim) const;
  Tensor squeeze() const;
  Tensor unsqueeze(std::int64_t dim) const;
  Tensor flatten(std::int64_t start_dim = 0, std::int64_t end_dim = -1) const;

  // ---- copies and conversions (differentiable)
  Tensor contiguous() const;
  Tensor clone() const;
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor to(Device device, DType dtype) const;
  Tensor detach() const;  // same storage, no graph

  // ---- host access
  template <class T>
  std::vector<T> to_vector() const;  // converts to T, copies to the host
  double item() const;               // a one-element tensor's value

  // ---- in-place (bump the storage version; not differentiable through leaves)
  Tensor& zero_();
  Tensor& fill_(double value);
  Tensor& copy_(const Tensor& src);  // broadcasts src, converts dtype, crosses devices
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(double value);

  // ---- autograd (autograd/)
  bool requires_grad() const { return impl_->requires_grad; }
  Tensor& requires_grad_(bool on = true);
  bool is_leaf() const;
  Tensor grad() const { return Tensor(impl_->grad); }
  void set_grad(const Tensor& g) { impl_->grad = g.impl_; }
  void retain_grad();
  const std::shared_ptr<autograd::Node>& grad_fn() const { return impl_->grad_fn; }
  // Back-propagates from this tensor; a scalar needs no gradient argument.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;

 private:
  std::shared_ptr<TensorImpl> impl_;
};

// Raw view construction (no autograd): the building block of every view op.
Tensor make_view(const Tensor& base, Shape shape, Strides strides, std::int64_t offset);
// A new, uninitialised tensor shaped like `t` (contiguous), optionally of another dtype/device.
Tensor empty_like(const Tensor& t);
Tensor empty_like(const Tensor& t, DType dtype);
Tensor zeros_like(const Tensor& t);

template <class T>
T* Tensor::data() const {
  KILN_CHECK(dtype_of<T>() == dtype(), "data<{}>() on a {} tensor", dtype_name(dtype_of<T>()), dtype_name(dtype()));
  return static_cast<T*>(data_ptr());
}

template <class T>
Tensor Tensor::from_vector(const std::vector<T>& values, Shape shape, Device device) {
  if (shape.empty() && values.size() != 1) shape = {static_cast<std::int64_t>(values.size())};
  KILN_CHECK(numel_of(shape) == static_cast<std::int64_t>(values.size()), "from_vector: {} values do not fill shape {}",
             values.size(), shape_str(shape));
  if constexpr (std::is_same_v<T, bool>) {
    std::vector<std::uint8_t> bytes(values.begin(), values.end());
    return from_host(bytes.data(), std::move(shape), DType::Bool, device);
  } else {
    return from_host(values.data(), std::move(shape), dtype_of<T>(), device);
  }
}

}  // namespace kiln
