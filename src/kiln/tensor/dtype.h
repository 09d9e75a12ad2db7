#pragma once
// DType: the element types a tensor can hold.
#include <complex>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "kiln/runtime/scalar_types.h"

namespace kiln {

enum class DType : std::uint8_t { F64, F32, BF16, F16, F8E4M3, F8E5M2, I64, I32, U8, Bool };
inline constexpr int kNumDTypes = 10;

std::size_t dtype_size(DType t);
std::string_view dtype_name(DType t);      // "float32", "bfloat16", ... as PyTorch spells them
DType parse_dtype(std::string_view name);  // accepts the names above and f32/bf16/... short forms
bool is_floating(DType t);
bool is_integral(DType t);  // including bool

// The C++ type that stores one element of a dtype, and back.
template <DType T>
struct dtype_traits;
template <>
struct dtype_traits<DType::F64> {
  using type = double;
};
template <>
struct dtype_traits<DType::F32> {
  using type = float;
};
template <>
struct dtype_traits<DType::BF16> {
  using type = BFloat16;
};
template <>
struct dtype_traits<DType::F16> {
  using type = Half;
};
template <>
struct dtype_traits<DType::F8E4M3> {
  using type = Float8E4M3;
};
template <>
struct dtype_traits<DType::F8E5M2> {
  using type = Float8E5M2;
};
template <>
struct dtype_traits<DType::I64> {
  using type = std::int64_t;
};
template <>
struct dtype_traits<DType::I32> {
  using type = std::int32_t;
};
template <>
struct dtype_traits<DType::U8> {
  using type = std::uint8_t;
};
template <>
struct dtype_traits<DType::Bool> {
  using type = bool;
};

template <class T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<double>() {
  return DType::F64;
}
template <>
constexpr DType dtype_of<float>() {
  return DType::F32;
}
template <>
constexpr DType dtype_of<BFloat16>() {
  return DType::BF16;
}
template <>
constexpr DType dtype_of<Half>() {
  return DType::F16;
}
template <>
constexpr DType dtype_of<Float8E4M3>() {
  return DType::F8E4M3;
}
template <>
constexpr DType dtype_of<Float8E5M2>() {
  return DType::F8E5M2;
}
template <>
constexpr DType dtype_of<std::int64_t>() {
  return DType::I64;
}
template <>
constexpr DType dtype_of<std::int32_t>() {
  return DType::I32;
}
template <>
constexpr DType dtype_of<std::uint8_t>() {
  return DType::U8;
}
template <>
constexpr DType dtype_of<bool>() {
  return DType::Bool;
}

}  // namespace kiln

// KILN_DISPATCH_FLOATING(dtype, "op", [&]<class scalar_t>() { ... }): calls the lambda with the
// element type of `dtype`, one `case` per type; unsupported types raise an error naming the op.
#define KILN_DTYPE_CASE(D, fn) \
  case ::kiln::DType::D:       \
    return fn.template operator()<typename ::kiln::dtype_traits<::kiln::DType::D>::type>();

#define KILN_DISPATCH_FLOATING(dtype, op_name, ...)                                                                 \
  [&]() -> decltype(auto) {                                                                                         \
    auto&& fn = __VA_ARGS__;                                                                                        \
    switch (dtype) {                                                                                                \
      KILN_DTYPE_CASE(F64, fn)                                                                                      \
      KILN_DTYPE_CASE(F32, fn)                                                                                      \
      KILN_DTYPE_CASE(BF16, fn)                                                                                     \
      KILN_DTYPE_CASE(F16, fn)                                                                                      \
      default:                                                                                                      \
        KILN_FAIL("{}: dtype {} is not supported (expected a floating dtype)", op_name, ::kiln::dtype_name(dtype)); \
    }                                                                                                               \
  }()

#define KILN_DISPATCH_ALL(dtype, op_name, ...) \
  [&]() -> decltype(auto) {                    \
    auto&& fn = __VA_ARGS__;                   \
    switch (dtype) {                           \
      KILN_DTYPE_CASE(F64, fn)                 \
      KILN_DTYPE_CASE(F32, fn)                 \
      KILN_DTYPE_CASE(BF16, fn)                \
      KILN_DTYPE_CASE(F16, fn)                 \
      KILN_DTYPE_CASE(F8E4M3, fn)              \
      KILN_DTYPE_CASE(F8E5M2, fn)              \
      KILN_DTYPE_CASE(I64, fn)                 \
      KILN_DTYPE_CASE(I32, fn)                 \
      KILN_DTYPE_CASE(U8, fn)                  \
      KILN_DTYPE_CASE(Bool, fn)                \
    }                                          \
    KILN_FAIL("{}: unknown dtype", op_name);   \
  }()

#define KILN_DISPATCH_NUMERIC(dtype, op_name, ...)                                             \
  [&]() -> decltype(auto) {                                                                    \
    auto&& fn = __VA_ARGS__;                                                                   \
    switch (dtype) {                                                                           \
      KILN_DTYPE_CASE(F64, fn)                                                                 \
      KILN_DTYPE_CASE(F32, fn)                                                                 \
      KILN_DTYPE_CASE(BF16, fn)                                                                \
      KILN_DTYPE_CASE(F16, fn)                                                                 \
      KILN_DTYPE_CASE(I64, fn)                                                                 \
      KILN_DTYPE_CASE(I32, fn)                                                                 \
      KILN_DTYPE_CASE(U8, fn)                                                                  \
      default: KILN_FAIL("{}: dtype {} is not supported", op_name, ::kiln::dtype_name(dtype)); \
    }                                                                                          \
  }()
