#include "kiln/ops/checks.h"

namespace kiln::ops {

void check_defined(const char* op, const Tensor& t, const char* name) {
  KILN_CHECK(t.defined(), "{}: {} is an undefined tensor", op, name);
}

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.device() == b.device(), "{}: operands are on different devices: {} and {}", op, a.describe(),
             b.describe());
}

void check_same_dtype(const char* op, const Tensor& a, const Tensor& b) {
  KILN_CHECK(a.dtype() == b.dtype(), "{}: operands have different dtypes: {} and {}", op, a.describe(), b.describe());
}

void check_compatible(const char* op, const Tensor& a, const Tensor& b) {
  check_same_device(op, a, b);
  check_same_dtype(op, a, b);
}

void check_dim(const char* op, const Tensor& t, std::int64_t ndim, const char* name) {
  KILN_CHECK(t.dim() == ndim, "{}: {} must have {} dimensions, got {}", op, name, ndim, t.describe());
}

void check_floating(const char* op, const Tensor& t) {
  KILN_CHECK(is_floating(t.dtype()), "{}: expected a floating-point tensor, got {}", op, t.describe());
}

}  // namespace kiln::ops
