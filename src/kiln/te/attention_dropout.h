#pragma once
// Attention dropout's keep-mask, shared by every attention kernel (te/cpu/, te/cuda/) so that the
// CPU and CUDA masks are bit-identical. Probability (b, h, i, j) of a [B, Hq, T, S] attention (query
// head h, query row i, key j) is kept iff Philox(seed, offset + ((b Hq + h) T + i) S + j), as a
// uniform in [0, 1) with 24 random bits, is below 1 - p: exactly the mask nn::Dropout(p) draws for a
// contiguous [B, Hq, T, S] probability tensor at the same (seed, offset) (the Bernoulli random
// kernel, ops/cpu/copy_fill.cpp), so the fused attention and the local one (softmax, then
// nn::Dropout) drop the same probabilities and advance the stream by the same B Hq T S counters.
// Nothing is stored: the backward regenerates the mask from the same (seed, offset).
#include <cmath>
#include <cstdint>

#include "kiln/ops/philox.h"

namespace kiln::te {

// The Philox counter of probability (b, h, i, j): offset + its index in a contiguous [B, Hq, T, S].
KILN_HD inline std::uint64_t attention_dropout_counter(std::uint64_t offset, std::int64_t b, std::int64_t h,
                                                       std::int64_t i, std::int64_t j, std::int64_t q_heads,
                                                       std::int64_t q_len, std::int64_t kv_len) {
  return offset + static_cast<std::uint64_t>(((b * q_heads + h) * q_len + i) * kv_len + j);
}

// The uniform u = m / 2^24 (m the top 24 bits of Philox's first word) is below 1 - p iff m is below
// ceil((1 - p) 2^24) (exact: 1 - p scaled by a power of two stays exact, and m is an integer), so
// the kernels compare integers and the mask equals the Bernoulli kernel's `u < 1 - p` bit for bit.
inline std::uint32_t attention_dropout_threshold(double p) {
  return static_cast<std::uint32_t>(std::ceil((1.0 - p) * 16777216.0));
}

KILN_HD inline bool attention_dropout_keep(std::uint64_t seed, std::uint64_t counter, std::uint32_t threshold) {
  return (ops::philox4x32_10(counter, seed).v[0] >> 8) < threshold;
}

}  // namespace kiln::te
