#pragma once
// Megatron's "MMIDIDX" indexed dataset, version 1: a prefix names two files.
//   prefix.bin: the token ids of every sequence, back to back, in one dtype.
//   prefix.idx, little-endian:
//     magic "MMIDIDX\0\0" (9 bytes), version uint64 = 1, dtype code uint8,
//     sequence count uint64 (S), document count uint64 (D + 1),
//     sequence lengths int32[S], sequence pointers int64[S] (byte offsets into .bin),
//     document indices int64[D + 1] (document d is sequences [idx[d], idx[d+1]); idx[0] = 0).
// With --append-eod and no sentence splitting, every document is one sequence.
#include <cstdint>
#include <string_view>

namespace kiln::data {

inline constexpr std::string_view kIndexMagic{"MMIDIDX\0\0", 9};
inline constexpr std::uint64_t kIndexVersion = 1;

// Megatron's DType codes (megatron/core/datasets/indexed_dataset.py).
enum class TokenDtype : std::uint8_t {
  UInt8 = 1,
  Int8 = 2,
  Int16 = 3,
  Int32 = 4,
  Int64 = 5,
  Float64 = 6,
  Float32 = 7,
  UInt16 = 8,
};

// Bytes per element; 0 for a code that is not one of the above.
int dtype_size(std::uint8_t code);
std::string_view dtype_name(TokenDtype dtype);

// Megatron's DType.optimal_dtype: uint16 for vocabularies under 65,500 ids, else int32.
inline TokenDtype optimal_token_dtype(std::int64_t vocab_size) {
  return vocab_size < 65500 ? TokenDtype::UInt16 : TokenDtype::Int32;
}

}  // namespace kiln::data
