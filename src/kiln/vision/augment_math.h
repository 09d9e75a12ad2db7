#pragma once
// The per-row random choices of augment_images, shared by the CPU and CUDA kernels so that both
// produce the same batch for the same seed.
#include "kiln/ops/philox.h"
#include "kiln/vision/augment_params.h"

namespace kiln::vision {

struct BatchAugmentChoice {
  int dy, dx;  // the crop's shift: output (y, x) reads input (y + dy, x + dx), zero outside
  bool flip;
};

KILN_HD inline BatchAugmentChoice augment_choice(const AugmentParams& p, std::uint64_t row) {
  ops::Philox4 r = ops::philox4x32_10(p.offset + row, p.seed ^ 0x5eed5eed5eedULL);
  BatchAugmentChoice c;
  const std::uint32_t span = static_cast<std::uint32_t>(2 * p.pad + 1);
  c.dy = static_cast<int>(r.v[0] % span) - p.pad;
  c.dx = static_cast<int>(r.v[1] % span) - p.pad;
  c.flip = p.flip && (r.v[2] & 1u);
  return c;
}

}  // namespace kiln::vision
