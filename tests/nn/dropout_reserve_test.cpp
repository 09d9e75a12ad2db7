// nn::Dropout::reserve: the draw a fused kernel (te::attention's attention dropout) makes in place
// of forward(): the same stream position and advance as forward() on that many elements, in the
// host-offset and the graph-safe (device counter) modes, replayed under activation recompute.
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/random_replay.h"
#include "kiln/nn/nn.h"
#include "kiln/runtime/error.h"

namespace kiln {
namespace dropout_reserve_test {

TEST(DropoutReserve, AdvancesLikeForward) {
  nn::Dropout reserving(0.3, 77), forwarding(0.3, 77);
  const Tensor x = Tensor::ones({5, 20});
  // A draw of 100 elements: the mask forward() would draw for x, and the same advance.
  const autograd::RandomDraw d = reserving.reserve(x.numel(), Device::cpu());
  EXPECT_EQ(d.seed, 77u);
  EXPECT_EQ(d.offset, 0u);
  EXPECT_FALSE(d.device_offset.defined());
  EXPECT_EQ(dropout(x, 0.3, true, d.seed, d.offset).to_vector<float>(), forwarding.forward(x).to_vector<float>());
  EXPECT_EQ(reserving.offset, forwarding.offset);
  // The next forward() of each continues from the same position.
  EXPECT_EQ(reserving.forward(x).to_vector<float>(), forwarding.forward(x).to_vector<float>());
}

TEST(DropoutReserve, GraphSafeCopiesTheCounterBeforeItAdvances) {
  nn::Dropout d(0.5, 3);
  d.graph_safe = true;
  d.offset = 40;
  const autograd::RandomDraw draw = d.reserve(25, Device::cpu());
  ASSERT_TRUE(draw.device_offset.defined());
  EXPECT_EQ(draw.device_offset.item(), 40);  // the kernel reads the position before the advance
  EXPECT_EQ(d.offset, 65u);
  const autograd::RandomDraw next = d.reserve(10, Device::cpu());
  EXPECT_EQ(next.device_offset.item(), 65);
  EXPECT_EQ(draw.device_offset.item(), 40) << "a copy, not the live counter";
}

TEST(DropoutReserve, ReplayedUnderRecompute) {
  nn::Dropout d(0.2, 9);
  autograd::RandomTape tape;
  autograd::RandomDraw first;
  {
    autograd::RandomTapeScope record(tape, false);
    first = d.reserve(30, Device::cpu());
  }
  EXPECT_EQ(d.offset, 30u);
  {
    autograd::RandomTapeScope replay(tape, true);
    const autograd::RandomDraw again = d.reserve(30, Device::cpu());
    EXPECT_EQ(again.seed, first.seed);
    EXPECT_EQ(again.offset, first.offset);
  }
  EXPECT_EQ(d.offset, 30u) << "a replay leaves the module's position alone";
}

TEST(DropoutReserve, RefusedOutsideTraining) {
  nn::Dropout d(0.2, 9);
  d.eval();
  EXPECT_THROW(d.reserve(10, Device::cpu()), Error);
  nn::Dropout off(0.0, 9);
  EXPECT_THROW(off.reserve(10, Device::cpu()), Error);
}

}  // namespace dropout_reserve_test
}  // namespace kiln
