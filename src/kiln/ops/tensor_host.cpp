// Tensor methods that touch values directly: host access, printing and raw in-place updates.
#include <fmt/format.h>

#include <sstream>

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"

namespace kiln {

template <class T>
std::vector<T> Tensor::to_vector() const {
  constexpr DType want = std::is_same_v<T, bool> ? DType::Bool : dtype_of<T>();
  Tensor host = ops::contiguous(ops::to(*this, Device::cpu(), want));
  std::vector<T> out(static_cast<std::size_t>(host.numel()));
  if constexpr (std::is_same_v<T, bool>) {
    const auto* p = static_cast<const std::uint8_t*>(host.data_ptr());
    for (std::size_t i = 0; i < out.size(); ++i) out[i] = p[i] != 0;
  } else {
    // An empty tensor has no storage (a null pointer): memcpy of 0 bytes from it is still UB.
    if (!out.empty()) std::memcpy(out.data(), host.data_ptr(), out.size() * sizeof(T));
  }
  return out;
}

template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<std::int64_t> Tensor::to_vector<std::int64_t>() const;
template std::vector<std::int32_t> Tensor::to_vector<std::int32_t>() const;
template std::vector<std::uint8_t> Tensor::to_vector<std::uint8_t>() const;
template std::vector<bool> Tensor::to_vector<bool>() const;
template std::vector<BFloat16> Tensor::to_vector<BFloat16>() const;
template std::vector<Half> Tensor::to_vector<Half>() const;

double Tensor::item() const {
  KILN_CHECK(numel() == 1, "item(): the tensor has {} elements, not 1 ({})", numel(), describe());
  return to_vector<double>()[0];
}

Tensor& Tensor::zero_() { return fill_(0.0); }

Tensor& Tensor::fill_(double value) {
  ops::fill(*this, value);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::copy_(const Tensor& src) {
  ops::copy_into(*this, src);
  storage()->bump_version();
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  if (alpha == 1.0)
    ops::binary_(ops::BinaryOp::Add, *this, other);
  else
    ops::binary_(ops::BinaryOp::Add, *this, ops::binary(ops::BinaryOp::Mul, other, alpha));
  return *this;
}

Tensor& Tensor::mul_(double value) {
  ops::binary_(ops::BinaryOp::Mul, *this, value);
  return *this;
}

namespace {
void print_values(std::ostringstream& os, const std::vector<double>& v, const Shape& shape, std::size_t dim,
                  std::size_t& pos, bool integral) {
  if (shape.empty()) {
    os << (integral ? fmt::format("{}", static_cast<long long>(v[0])) : fmt::format("{:.4f}", v[0]));
    return;
  }
  os << "[";
  for (std::int64_t i = 0; i < shape[dim]; ++i) {
    if (i) os << (dim + 1 == shape.size() ? ", " : ",\n" + std::string(dim + 1, ' '));
    if (shape[dim] > 12 && i == 3) {  // summarise long dimensions as PyTorch does
      os << "...";
      std::int64_t skip = shape[dim] - 6;
      std::int64_t inner = 1;
      for (std::size_t d = dim + 1; d < shape.size(); ++d) inner *= shape[d];
      pos += static_cast<std::size_t>(skip * inner);
      i += skip - 1;
      continue;
    }
    if (dim + 1 == shape.size()) {
      double x = v[pos++];
      os << (integral ? fmt::format("{}", static_cast<long long>(x)) : fmt::format("{:.4f}", x));
    } else {
      print_values(os, v, shape, dim + 1, pos, integral);
    }
  }
  os << "]";
}
}  // namespace

std::string Tensor::str() const {
  if (!defined()) return "tensor(undefined)";
  auto values = to_vector<double>();
  std::ostringstream os;
  os << "tensor(";
  std::size_t pos = 0;
  print_values(os, values, shape(), 0, pos, is_integral(dtype()));
  os << ", dtype=" << dtype_name(dtype()) << ", device=" << device().str();
  if (requires_grad()) os << ", requires_grad=True";
  os << ")";
  return os.str();
}

}  // namespace kiln
