// fp8 parameters in the flat optimizers (--fp8-param-gather's FP8 weights): their masters are
// seeded by set_master() (a step before that is refused), step() updates the master exactly as for
// an f32 parameter of the same value and leaves the fp8 bytes to the caller, the masters are in the
// state dict and reload, and a shard that cuts the parameter lists its piece.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "kiln/autograd/functions.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace flat_optimizer_fp8_test {

using optim::FlatAdamW;
using optim::GradBuffers;

Tensor values(std::int64_t n, double phase) {
  std::vector<float> v(static_cast<std::size_t>(n));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i) + phase));
  return Tensor::from_vector(v).reshape({n / 16, 16});
}

Tensor fp8_leaf(std::int64_t n) {
  Tensor t = Tensor::empty({n / 16, 16}, DType::F8E4M3);
  std::memset(t.data_ptr(), 0x38, static_cast<std::size_t>(n));  // e4m3 1.0: bytes a step must not touch
  return t.requires_grad_(true);
}

std::vector<std::uint8_t> bytes(const Tensor& t) {
  std::vector<std::uint8_t> out(static_cast<std::size_t>(t.numel()));
  std::memcpy(out.data(), t.contiguous().data_ptr(), out.size());
  return out;
}

TEST(FlatOptimizerFp8, MasterIsSeededStepsLikeF32AndReloads) {
  const Tensor value = values(64, 0.3), grad = values(64, 1.1) * 0.1;
  Tensor p = fp8_leaf(64), f = value.clone().requires_grad_(true);
  GradBuffers bp({p}), bf({f});
  FlatAdamW op(bp), of(bf);
  p.grad().copy_(grad);
  f.grad().copy_(grad);
  try {
    op.step();
    FAIL() << "a step with an unseeded fp8 master was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("set_master"), std::string::npos) << e.what();
  }
  op.set_master(p, value);
  const std::vector<std::uint8_t> before = bytes(p);
  for (int s = 0; s < 3; ++s) {
    op.step();
    of.step();
  }
  const auto pieces = op.fp8_master_pieces();
  ASSERT_EQ(pieces.size(), 1u);
  EXPECT_TRUE(pieces[0].parameter.is_same(p));
  EXPECT_EQ(pieces[0].elements.numel(), 64);
  EXPECT_EQ(pieces[0].master.to_vector<float>(), f.detach().reshape({64}).to_vector<float>());
  EXPECT_EQ(bytes(p), before);  // the caller casts the master into the bytes

  // The master is in the state dict (as a bf16 parameter's is) and comes back on a load.
  const TensorDict state = op.state_dict();
  ASSERT_NE(state.find("state.0.master"), nullptr);
  Tensor q = fp8_leaf(64);
  GradBuffers bq({q});
  FlatAdamW oq(bq);
  oq.load_state_dict(state);
  EXPECT_EQ(oq.fp8_master_pieces()[0].master.to_vector<float>(), pieces[0].master.to_vector<float>());
  q.grad().copy_(grad);
  oq.step();  // loaded masters count as seeded
  EXPECT_THROW(op.set_master(p, Tensor::zeros({3, 3})), Error);
}

// A distributed optimizer's shard: each part seeds and steps its own piece of the master.
TEST(FlatOptimizerFp8, ShardsHoldPiecesOfTheMaster) {
  const Tensor value = values(256, 0.7);
  Tensor p = fp8_leaf(256);
  GradBuffers b({p}, {.bucket_size = 0, .shard_count = 2});
  std::vector<float> joined;
  for (int rank = 0; rank < 2; ++rank) {
    FlatAdamW o(b, optim::AdamW::defaults(), b.shard(rank, 2));
    o.set_master(p, value);
    for (const auto& piece : o.fp8_master_pieces()) {
      EXPECT_TRUE(piece.parameter.is_same(p));
      const auto v = piece.master.to_vector<float>();
      joined.insert(joined.end(), v.begin(), v.end());
    }
  }
  EXPECT_EQ(joined, value.reshape({256}).to_vector<float>());
}

}  // namespace flat_optimizer_fp8_test
}  // namespace kiln
