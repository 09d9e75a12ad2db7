#pragma once
// ElementType: what one element of a buffer that dist moves or reduces is. dist sits below
// tensor/, so it names element types itself; tensor/collectives.h maps a Tensor's DType onto this
// (the same set but bool: a reduction of bools has no use and they travel as U8).
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln::dist {

enum class ElementType : std::uint8_t { F64, F32, BF16, F16, F8E4M3, F8E5M2, I64, I32, U8 };

constexpr std::size_t element_size(ElementType type) {
  switch (type) {
    case ElementType::F64:
    case ElementType::I64: return 8;
    case ElementType::F32:
    case ElementType::I32: return 4;
    case ElementType::BF16:
    case ElementType::F16: return 2;
    case ElementType::F8E4M3:
    case ElementType::F8E5M2:
    case ElementType::U8: return 1;
  }
  return 1;
}

constexpr std::string_view element_type_name(ElementType type) {
  switch (type) {
    case ElementType::F64: return "f64";
    case ElementType::F32: return "f32";
    case ElementType::BF16: return "bf16";
    case ElementType::F16: return "f16";
    case ElementType::F8E4M3: return "f8e4m3";
    case ElementType::F8E5M2: return "f8e5m2";
    case ElementType::I64: return "i64";
    case ElementType::I32: return "i32";
    case ElementType::U8: return "u8";
  }
  return "?";
}

// The types whose reductions on the host run in f32 (MPI has no 16- or 8-bit floats): converted
// in, reduced, rounded back once, as NCCL does on the GPU for bf16 and f16 sums.
constexpr bool is_reduced_precision(ElementType type) {
  return type == ElementType::BF16 || type == ElementType::F16 || type == ElementType::F8E4M3 ||
         type == ElementType::F8E5M2;
}

constexpr bool is_integer(ElementType type) {
  return type == ElementType::I64 || type == ElementType::I32 || type == ElementType::U8;
}

}  // namespace kiln::dist
