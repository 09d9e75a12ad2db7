#include "kiln/te/fp8_recipe.h"

#include <fmt/format.h>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln::te {

std::string_view to_string(Fp8Format f) { return f == Fp8Format::E4M3 ? "e4m3" : "hybrid"; }

std::string_view to_string(Fp8ScalingRecipe r) {
  switch (r) {
    case Fp8ScalingRecipe::Delayed: return "delayed";
    case Fp8ScalingRecipe::Tensorwise: return "tensorwise";
    case Fp8ScalingRecipe::Blockwise: return "blockwise";
    case Fp8ScalingRecipe::Mxfp8: return "mxfp8";
  }
  return "?";
}

Fp8Format parse_fp8_format(std::string_view s) {
  if (s == "e4m3") return Fp8Format::E4M3;
  if (s == "hybrid") return Fp8Format::Hybrid;
  KILN_FAIL("--fp8-format: '{}' is not a format (e4m3 or hybrid)", s);
}

Fp8ScalingRecipe parse_fp8_recipe(std::string_view s) {
  if (s == "delayed") return Fp8ScalingRecipe::Delayed;
  if (s == "tensorwise") return Fp8ScalingRecipe::Tensorwise;
  if (s == "blockwise") return Fp8ScalingRecipe::Blockwise;
  if (s == "mxfp8" || s == "mxfp8-if-supported") return Fp8ScalingRecipe::Mxfp8;
  KILN_FAIL("--fp8-recipe: '{}' is not a recipe (delayed, tensorwise, blockwise or mxfp8)", s);
}

ops::AmaxComputeAlgo parse_amax_compute_algo(std::string_view s) {
  if (s == "max") return ops::AmaxComputeAlgo::Max;
  if (s == "most_recent") return ops::AmaxComputeAlgo::MostRecent;
  KILN_FAIL("--fp8-amax-compute-algo: '{}' is not an algorithm (max or most_recent)", s);
}

std::string fp8_recipe_unsupported_reason(const Fp8Recipe& recipe, Device device) {
  if (recipe.recipe != Fp8ScalingRecipe::Mxfp8) return {};
  // MXFP8's E8M0 1x32 block scales are a Blackwell tensor-core format; Kiln has neither a kernel
  // nor a CPU emulation of it, so it is refused everywhere (Megatron/TE refuse it before sm_100 too).
  std::string where = "the CPU";
  if (device.kind == DeviceKind::CUDA) {
    const DeviceProperties p = backend_for(device).properties(device.index);
    where = fmt::format("{} ({}, sm_{}{})", device.str(), p.name, p.compute_major, p.compute_minor);
  }
  return fmt::format(
      "--fp8-recipe mxfp8: MXFP8 block scaling (1x32 blocks, E8M0 scales) needs Blackwell tensor cores (sm_100+) "
      "and Kiln has no MXFP8 path; {} cannot run it: use --fp8-recipe blockwise (1x128 / 128x128 scales) instead",
      where);
}

}  // namespace kiln::te
