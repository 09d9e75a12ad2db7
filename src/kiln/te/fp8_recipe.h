#pragma once
// The FP8 training recipe of a run (Megatron's --fp8-* flags, TransformerEngine's recipes):
//  - Delayed:    per-tensor scales from an amax history of the previous casts (TE's DelayedScaling).
//  - Tensorwise: per-tensor scales from the tensor's own amax, computed before its cast (TE's
//                Float8CurrentScaling).
//  - Blockwise:  one scale per 1x128 tile of activations and gradients and per 128x128 block of
//                weights, each from its own amax (DeepSeek-V3's recipe, TE's Float8BlockScaling).
//  - Mxfp8:      1x32 blocks with E8M0 scales (TE's MXFP8BlockScaling): Blackwell tensor cores only;
//                Kiln refuses it (see fp8_recipe_unsupported_reason).
// Formats: e4m3 everywhere, or hybrid (e4m3 activations and weights, e5m2 gradients).
#include <cstdint>
#include <string>
#include <string_view>

#include "kiln/ops/fp8.h"
#include "kiln/runtime/device.h"

namespace kiln::te {

enum class Fp8Format : std::uint8_t { E4M3, Hybrid };
enum class Fp8ScalingRecipe : std::uint8_t { Delayed, Tensorwise, Blockwise, Mxfp8 };

struct Fp8Recipe {
  Fp8Format format = Fp8Format::Hybrid;
  Fp8ScalingRecipe recipe = Fp8ScalingRecipe::Delayed;
  // Delayed scaling only; Megatron's defaults (TE's are 1024 and max).
  std::int64_t amax_history_len = 1;
  ops::AmaxComputeAlgo amax_compute_algo = ops::AmaxComputeAlgo::MostRecent;
  int margin = 0;  // scale = fp8_max / amax / 2^margin (delayed and tensorwise)

  DType forward_dtype() const { return DType::F8E4M3; }
  DType gradient_dtype() const { return format == Fp8Format::Hybrid ? DType::F8E5M2 : DType::F8E4M3; }
};

// Megatron's spellings: "e4m3" / "hybrid"; "delayed" / "tensorwise" / "blockwise" / "mxfp8".
std::string_view to_string(Fp8Format f);
std::string_view to_string(Fp8ScalingRecipe r);
Fp8Format parse_fp8_format(std::string_view s);
Fp8ScalingRecipe parse_fp8_recipe(std::string_view s);  // "mxfp8-if-supported" reads as mxfp8
ops::AmaxComputeAlgo parse_amax_compute_algo(std::string_view s);

// Empty when `device` runs the recipe's GEMMs, else why not (naming the recipe and the device).
std::string fp8_recipe_unsupported_reason(const Fp8Recipe& recipe, Device device);

}  // namespace kiln::te
