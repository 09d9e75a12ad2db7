#pragma once
// Rotary position embeddings (RoPE), rotate-half convention as Megatron's default and Hugging
// Face Llama: channel pairs (i, i + R) of a head rotate by theta = position * inv_freq[i], where
// R = head_dim / 2 (full rotary) or fewer (the table's width: the remaining channels pass
// through unchanged).
#include <cstdint>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/tensor/tensor.h"

namespace kiln::te {

struct RopeTable {
  Tensor cos, sin;  // float32 [max_positions, head_dim / 2] on a device
};

// inv_freq[i] = base^(-2i / head_dim), i < head_dim / 2, with Llama-3.1's frequency scaling when
// llama3_scaling (Hugging Face's _compute_llama3_parameters: factor = scaling_factor,
// low_freq_factor 1, high_freq_factor 4, original_max_position_embeddings 8192). In float64.
std::vector<double> rope_inv_freq(std::int64_t head_dim, double base, bool llama3_scaling, double scaling_factor);

// cos/sin of position * inv_freq for positions [0, max_positions), computed in float64 and stored
// as float32 on `device`. head_dim even and positive, max_positions > 0, base > 1, factor >= 1.
RopeTable make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double base, bool llama3_scaling,
                          double scaling_factor, Device device);

// x [B, T, H, D] (floating; bf16/f16/f32 on CUDA), token t at position position_offset + t (the
// KV-cache case: offset = tokens already cached). The table's 2R <= D channels rotate; out has
// x's shape and dtype and is contiguous. x may be a strided view with unit stride along D (q or k
// of a fused QKV projection), read in place. Differentiable in x (the backward rotates by -theta).
Tensor apply_rope(const Tensor& x, const RopeTable& table, std::int64_t position_offset);

}  // namespace kiln::te
