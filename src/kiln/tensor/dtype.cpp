#include "kiln/tensor/dtype.h"

#include "kiln/runtime/error.h"

namespace kiln {

std::size_t dtype_size(DType t) {
  switch (t) {
    case DType::F64:
    case DType::I64: return 8;
    case DType::F32:
    case DType::I32: return 4;
    case DType::BF16:
    case DType::F16: return 2;
    case DType::F8E4M3:
    case DType::F8E5M2:
    case DType::U8:
    case DType::Bool: return 1;
  }
  return 0;
}

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::F64: return "float64";
    case DType::F32: return "float32";
    case DType::BF16: return "bfloat16";
    case DType::F16: return "float16";
    case DType::F8E4M3: return "float8_e4m3fn";
    case DType::F8E5M2: return "float8_e5m2";
    case DType::I64: return "int64";
    case DType::I32: return "int32";
    case DType::U8: return "uint8";
    case DType::Bool: return "bool";
  }
  return "unknown";
}

DType parse_dtype(std::string_view name) {
  struct Alias {
    std::string_view name;
    DType type;
  };
  static constexpr Alias aliases[] = {{"float64", DType::F64},
                                      {"f64", DType::F64},
                                      {"double", DType::F64},
                                      {"float32", DType::F32},
                                      {"f32", DType::F32},
                                      {"float", DType::F32},
                                      {"fp32", DType::F32},
                                      {"bfloat16", DType::BF16},
                                      {"bf16", DType::BF16},
                                      {"float16", DType::F16},
                                      {"f16", DType::F16},
                                      {"half", DType::F16},
                                      {"fp16", DType::F16},
                                      {"float8_e4m3fn", DType::F8E4M3},
                                      {"fp8_e4m3", DType::F8E4M3},
                                      {"e4m3", DType::F8E4M3},
                                      {"float8_e5m2", DType::F8E5M2},
                                      {"fp8_e5m2", DType::F8E5M2},
                                      {"e5m2", DType::F8E5M2},
                                      {"int64", DType::I64},
                                      {"i64", DType::I64},
                                      {"long", DType::I64},
                                      {"int32", DType::I32},
                                      {"i32", DType::I32},
                                      {"int", DType::I32},
                                      {"uint8", DType::U8},
                                      {"u8", DType::U8},
                                      {"bool", DType::Bool}};
  for (const auto& a : aliases)
    if (a.name == name) return a.type;
  KILN_FAIL("unknown dtype '{}'", name);
}

bool is_floating(DType t) {
  return t == DType::F64 || t == DType::F32 || t == DType::BF16 || t == DType::F16 || t == DType::F8E4M3 ||
         t == DType::F8E5M2;
}

bool is_integral(DType t) { return !is_floating(t); }

}  // namespace kiln
