#include "kiln/data/indexed_dataset_format.h"

namespace kiln::data {

int dtype_size(std::uint8_t code) {
  switch (static_cast<TokenDtype>(code)) {
    case TokenDtype::UInt8:
    case TokenDtype::Int8: return 1;
    case TokenDtype::Int16:
    case TokenDtype::UInt16: return 2;
    case TokenDtype::Int32:
    case TokenDtype::Float32: return 4;
    case TokenDtype::Int64:
    case TokenDtype::Float64: return 8;
  }
  return 0;
}

std::string_view dtype_name(TokenDtype dtype) {
  switch (dtype) {
    case TokenDtype::UInt8: return "uint8";
    case TokenDtype::Int8: return "int8";
    case TokenDtype::Int16: return "int16";
    case TokenDtype::Int32: return "int32";
    case TokenDtype::Int64: return "int64";
    case TokenDtype::Float64: return "float64";
    case TokenDtype::Float32: return "float32";
    case TokenDtype::UInt16: return "uint16";
  }
  return "unknown";
}

}  // namespace kiln::data
