#include "kiln/tensor/fp8_tensor.h"

#include "kiln/runtime/error.h"

namespace kiln {

namespace {
std::int64_t ceil_div(std::int64_t a, std::int64_t b) { return (a + b - 1) / b; }
std::int64_t round_up(std::int64_t a, std::int64_t b) { return ceil_div(a, b) * b; }
}  // namespace

std::string_view scaling_layout_name(ScalingLayout l) {
  switch (l) {
    case ScalingLayout::PerTensor: return "per_tensor";
    case ScalingLayout::Block1x128: return "1x128";
    case ScalingLayout::Block128x128: return "128x128";
  }
  return "?";
}

ScalingLayout parse_scaling_layout(std::string_view name) {
  if (name == "per_tensor" || name == "tensor" || name == "tensorwise") return ScalingLayout::PerTensor;
  if (name == "1x128") return ScalingLayout::Block1x128;
  if (name == "128x128") return ScalingLayout::Block128x128;
  KILN_FAIL("scaling layout '{}' is unknown (expected per_tensor, 1x128 or 128x128)", name);
}

bool is_fp8(DType t) { return t == DType::F8E4M3 || t == DType::F8E5M2; }

float fp8_max(DType t) {
  if (t == DType::F8E4M3) return Float8E4M3::max_finite();
  if (t == DType::F8E5M2) return Float8E5M2::max_finite();
  KILN_FAIL("fp8_max: dtype {} is not an fp8 dtype", dtype_name(t));
}

Shape fp8_scale_shape(ScalingLayout layout, std::int64_t rows, std::int64_t cols) {
  switch (layout) {
    case ScalingLayout::PerTensor: return {1};
    case ScalingLayout::Block1x128: return {ceil_div(cols, kFp8BlockSize), round_up(rows, 4)};
    case ScalingLayout::Block128x128:
      return {ceil_div(rows, kFp8BlockSize), round_up(ceil_div(cols, kFp8BlockSize), 4)};
  }
  return {1};
}

std::int64_t fp8_scale_index(ScalingLayout layout, std::int64_t rows, std::int64_t cols, std::int64_t r,
                             std::int64_t c) {
  switch (layout) {
    case ScalingLayout::PerTensor: return 0;
    case ScalingLayout::Block1x128: return (c / kFp8BlockSize) * round_up(rows, 4) + r;
    case ScalingLayout::Block128x128:
      return (r / kFp8BlockSize) * round_up(ceil_div(cols, kFp8BlockSize), 4) + c / kFp8BlockSize;
  }
  return 0;
}

void Fp8Tensor::check(std::string_view call, std::string_view what) const {
  KILN_CHECK(data.defined(), "{}: {}.data is missing", call, what);
  KILN_CHECK(is_fp8(data.dtype()), "{}: {}.data has dtype {}, expected float8_e4m3fn or float8_e5m2", call, what,
             dtype_name(data.dtype()));
  KILN_CHECK(data.dim() == 2 && data.is_contiguous(), "{}: {}.data must be a contiguous 2-D matrix (got shape {})",
             call, what, shape_str(data.shape()));
  const Shape want = fp8_scale_shape(layout, data.shape()[0], data.shape()[1]);
  const std::pair<const Tensor*, const char*> parts[] = {{&scale, "scale"}, {&scale_inv, "scale_inv"}, {&amax, "amax"}};
  for (const auto& [t, name] : parts) {
    KILN_CHECK(t->defined(), "{}: {}.{} is missing (an fp8 operand needs its scale, scale_inv and amax)", call, what,
               name);
    KILN_CHECK(t->dtype() == DType::F32, "{}: {}.{} has dtype {}, expected float32", call, what, name,
               dtype_name(t->dtype()));
    KILN_CHECK(t->device() == data.device(), "{}: {}.{} is on {} but {}.data is on {}", call, what, name,
               t->device().str(), what, data.device().str());
    KILN_CHECK(t->is_contiguous() && t->shape() == want,
               "{}: {}.{} has shape {} but a {} matrix with {} scaling needs a contiguous {}", call, what, name,
               shape_str(t->shape()), shape_str(data.shape()), scaling_layout_name(layout), shape_str(want));
  }
}

}  // namespace kiln
