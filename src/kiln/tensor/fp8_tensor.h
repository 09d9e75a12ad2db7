#pragma once
// Fp8Tensor: an FP8 matrix together with the scaling state that gives its values meaning.
// real value = float(data) * scale_inv (per tensor, or per block); `scale` is the factor the cast
// multiplied by (scale_inv = 1 / scale) and `amax` the absolute maximum of the high-precision input
// it was cast from (the history TransformerEngine's delayed scaling feeds on). All four are device
// tensors, so casts and GEMMs read and write them on the stream without host synchronisation (CUDA
// graph capturable).
//
// Scaling layouts (the data is a 2-D [rows, cols] matrix; cols is the contiguous, contracted one):
//  - PerTensor:    one f32 each, shape [1].
//  - Block1x128:   one scale per row per 128 columns (DeepSeek-V3's activations), stored the way
//                  cuBLASLt's VEC128_32F mode and TransformerEngine's 1-D block scaling take it:
//                  shape [ceil(cols/128), round_up(rows, 4)], element (r, cb) at cb * ld + r.
//  - Block128x128: one scale per 128x128 tile (DeepSeek-V3's weights), cuBLASLt's BLK128x128_32F:
//                  shape [ceil(rows/128), round_up(ceil(cols/128), 4)], element (rb, cb) at rb * ld + cb.
// Padding entries (the round_up) hold scale 1, scale_inv 1, amax 0 and are never read by kernels.
// For block layouts `amax` holds each block's amax, in the scale's layout.
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/tensor/tensor.h"

namespace kiln {

enum class ScalingLayout : std::uint8_t { PerTensor, Block1x128, Block128x128 };

inline constexpr std::int64_t kFp8BlockSize = 128;

std::string_view scaling_layout_name(ScalingLayout l);  // "per_tensor", "1x128", "128x128"
ScalingLayout parse_scaling_layout(std::string_view name);

bool is_fp8(DType t);
// The largest finite value of an fp8 dtype (448 for e4m3, 57344 for e5m2).
float fp8_max(DType t);

// Shape of the scale / scale_inv / amax tensors of a [rows, cols] matrix in `layout`.
Shape fp8_scale_shape(ScalingLayout layout, std::int64_t rows, std::int64_t cols);
// Index of the scale of element (r, c) in the flat scale tensor.
std::int64_t fp8_scale_index(ScalingLayout layout, std::int64_t rows, std::int64_t cols, std::int64_t r,
                             std::int64_t c);

struct Fp8Tensor {
  Tensor data;       // F8E4M3 or F8E5M2, [rows, cols], contiguous
  Tensor scale;      // f32
  Tensor scale_inv;  // f32
  Tensor amax;       // f32
  ScalingLayout layout = ScalingLayout::PerTensor;

  std::int64_t rows() const { return data.shape()[0]; }
  std::int64_t cols() const { return data.shape()[1]; }
  DType dtype() const { return data.dtype(); }
  Device device() const { return data.device(); }

  // Throws kiln::Error naming `call` and `what` (the operand's name) when the parts do not fit
  // together: data not a contiguous 2-D fp8 matrix, a scaling tensor missing, not f32, not
  // contiguous, on another device, or not of the layout's shape for the data's shape.
  void check(std::string_view call, std::string_view what) const;
};

}  // namespace kiln
