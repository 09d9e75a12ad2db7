// --fp8-param-gather on CUDA against the CPU reference: the piece kernels (ops/cuda/fp8_cast.cu's
// fp8_piece_amax / fp8_piece_quantize) and Fp8PrimaryWeights' conversion and master cast give the
// CPU's bytes, scales and delayed state for every recipe, with the master cut into shards inside
// 128x128 blocks and weights large enough for many CTAs; the fp8 transpose of the cast (dgrad's
// operand) gives the CPU's bytes too. Skips without a GPU.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "../fp8/fp8_test_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/te/fp8_primary_weights.h"
#include "kiln/tensor/grad_mode.h"
#include "test_util.h"

namespace kiln {
namespace fp8_primary_weights_cuda_test {

using cudatest::gpu;
using fp8test::floats;

std::vector<std::uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.detach().to(Device::cpu()).contiguous();
  std::vector<std::uint8_t> out(static_cast<std::size_t>(c.numel()));
  std::memcpy(out.data(), c.data_ptr(), out.size());
  return out;
}

TEST(CudaFp8PrimaryWeights, ShardedMasterCastGivesTheCpuBits) {
  KILN_REQUIRE_CUDA();
  NoGradGuard no_grad;
  for (const auto recipe :
       {te::Fp8ScalingRecipe::Delayed, te::Fp8ScalingRecipe::Tensorwise, te::Fp8ScalingRecipe::Blockwise})
    for (const auto& [rows, cols] : {std::pair<std::int64_t, std::int64_t>{208, 272}, {1040, 784}}) {
      SCOPED_TRACE(std::string(te::to_string(recipe)) + " " + std::to_string(rows) + "x" + std::to_string(cols));
      te::Fp8Recipe r;
      r.recipe = recipe;
      r.amax_history_len = 2;
      r.amax_compute_algo = ops::AmaxComputeAlgo::Max;
      const Tensor w0 = Tensor::randn({rows, cols}, 21) * 0.03;
      const Tensor master = (Tensor::randn({rows, cols}, 22) * 0.7).reshape({rows * cols});
      const std::int64_t cuts[] = {0, 130 * cols + 77, 131 * cols + 200, rows * cols};
      struct Side {
        Tensor w;
        te::Fp8LinearState state;
      };
      Side sides[2];
      for (int s = 0; s < 2; ++s) {
        const Device d = s == 0 ? Device::cpu() : gpu();
        Side& side = sides[s];
        side.state.input = te::Fp8ScalingState::fresh(2, d);
        side.state.weight = te::Fp8ScalingState::fresh(2, d);
        side.state.grad_output = te::Fp8ScalingState::fresh(2, d);
        // A copy of its own on each side (w0.to(cpu) would be w0 itself, which the conversion turns into fp8).
        side.w = w0.clone().to(d).requires_grad_(true);
        te::Fp8PrimaryWeights weights({{side.w, &side.state}}, r);
        const Tensor m = master.to(d);
        std::vector<optim::FlatOptimizer::MasterPiece> pieces;
        for (int k = 0; k < 3; ++k)
          pieces.push_back({side.w, {cuts[k], cuts[k + 1]}, m.narrow(0, cuts[k], cuts[k + 1] - cuts[k]).contiguous()});
        weights.cast_masters(pieces, nullptr, true);
      }
      EXPECT_EQ(bytes(sides[1].w), bytes(sides[0].w));
      const te::Fp8PrimaryWeight &cpu = *sides[0].state.primary_weight, &cuda = *sides[1].state.primary_weight;
      EXPECT_EQ(floats(cuda.cast.scale_inv), floats(cpu.cast.scale_inv));
      EXPECT_EQ(floats(cuda.cast.amax), floats(cpu.cast.amax));
      EXPECT_EQ(floats(sides[1].state.weight.amax_history), floats(sides[0].state.weight.amax_history));
      EXPECT_EQ(floats(sides[1].state.weight.scale), floats(sides[0].state.weight.scale));
      if (recipe != te::Fp8ScalingRecipe::Delayed) {
        const Fp8Tensor tc = te::fp8_transposed(cpu.cast), tg = te::fp8_transposed(cuda.cast);
        EXPECT_EQ(bytes(tg.data), bytes(tc.data));
        EXPECT_EQ(floats(tg.scale_inv), floats(tc.scale_inv));
      }
    }
}

}  // namespace fp8_primary_weights_cuda_test
}  // namespace kiln
