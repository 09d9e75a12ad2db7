// The weight-gradient store (autograd/weight_grad_store.h), zero-bubble pipelines' split backward:
// with a store active, linear's backward gives the input gradient at once and queues the weight and
// bias gradients; flushed, they equal the plain backward's bit for bit (fp32, and bf16 weights with
// fp32 .grad buffers), their grad-ready hooks fire at the flush; non-leaf weights and
// autograd::grad() are not deferred.
#include "kiln/autograd/weight_grad_store.h"

#include <gtest/gtest.h>

#include "kiln/autograd/engine.h"
#include "kiln/autograd/functions.h"
#include "kiln/autograd/grad_ready_hook.h"

namespace kiln {
namespace weight_grad_store_test {

using autograd::WeightGradStore;
using autograd::WeightGradStoreScope;

struct TwoLayers {
  Tensor w1, b1, w2, b2;
  static TwoLayers make(DType dtype) {
    TwoLayers t;
    t.w1 = Tensor::randn({16, 8}, 1).to(dtype).requires_grad_();
    t.b1 = Tensor::randn({16}, 2).to(dtype).requires_grad_();
    t.w2 = Tensor::randn({4, 16}, 3).to(dtype).requires_grad_();
    t.b2 = Tensor::randn({4}, 4).to(dtype).requires_grad_();
    return t;
  }
  std::vector<Tensor> params() const { return {w1, b1, w2, b2}; }
  // A [3, 5, 8] input through linear, tanh, linear; a weighted sum as the loss.
  Tensor loss(const Tensor& x) const {
    const Tensor y = linear(tanh(linear(x, w1, b1)), w2, b2);
    return sum(y.to(DType::F32) * Tensor::randn({3, 5, 4}, 5));
  }
};

void expect_bitwise_equal(const Tensor& a, const Tensor& b, const char* what) {
  ASSERT_TRUE(a.defined() && b.defined()) << what;
  ASSERT_EQ(a.dtype(), b.dtype()) << what;
  EXPECT_EQ(a.to(DType::F32).to_vector<float>(), b.to(DType::F32).to_vector<float>()) << what;
}

void deferred_equals_plain(DType dtype, bool fp32_grad_buffers) {
  const TwoLayers plain = TwoLayers::make(dtype), split = TwoLayers::make(dtype);
  if (fp32_grad_buffers)
    for (const TwoLayers* t : {&plain, &split})
      for (Tensor p : t->params()) p.set_grad(Tensor::zeros(p.shape(), DType::F32));
  const Tensor x0 = Tensor::randn({3, 5, 8}, 6).to(dtype);
  // Two backwards each (the second accumulates into the first's .grad).
  for (int step = 0; step < 2; ++step) {
    Tensor xp = x0.detach().requires_grad_(), xs = x0.detach().requires_grad_();
    plain.loss(xp).backward();
    WeightGradStore store;
    {
      WeightGradStoreScope defer(&store);
      split.loss(xs).backward();
    }
    // The input gradient now; the weights' wait for the flush (one entry per linear).
    expect_bitwise_equal(xs.grad(), xp.grad(), "input gradient");
    EXPECT_EQ(store.size(), 2u);
    if (step == 0 && !fp32_grad_buffers) {
      EXPECT_FALSE(split.w1.grad().defined());
    }
    store.flush();
    EXPECT_TRUE(store.empty());
    const char* names[] = {"w1", "b1", "w2", "b2"};
    for (std::size_t i = 0; i < 4; ++i)
      expect_bitwise_equal(split.params()[i].grad(), plain.params()[i].grad(), names[i]);
  }
}

TEST(WeightGradStore, DeferredThenFlushedEqualsThePlainBackwardBitForBit) { deferred_equals_plain(DType::F32, false); }

TEST(WeightGradStore, Bf16WeightsIntoFp32GradBuffersToo) { deferred_equals_plain(DType::BF16, true); }

TEST(WeightGradStore, GradReadyHooksFireAtTheFlush) {
  const TwoLayers t = TwoLayers::make(DType::F32);
  int fired = 0;
  auto hook = autograd::register_grad_ready_hook(t.w1, [&](const Tensor&) { ++fired; });
  WeightGradStore store;
  {
    WeightGradStoreScope defer(&store);
    t.loss(Tensor::randn({3, 5, 8}, 6)).backward();
  }
  EXPECT_EQ(fired, 0);
  store.flush();
  EXPECT_EQ(fired, 1);
}

TEST(WeightGradStore, NonLeafWeightsAndAutogradGradAreNotDeferred) {
  const TwoLayers t = TwoLayers::make(DType::F32);
  const Tensor x = Tensor::randn({3, 5, 8}, 6);
  WeightGradStore store;
  WeightGradStoreScope defer(&store);
  // A weight reached through another op: its gradient flows through that op now.
  sum(linear(x, t.w1 * 2.0, t.b1)).backward();
  EXPECT_TRUE(store.empty());
  EXPECT_TRUE(t.w1.grad().defined());
  EXPECT_TRUE(t.b1.grad().defined());
  // autograd::grad returns gradients: none are queued, all come back.
  const std::vector<Tensor> g = autograd::grad({t.loss(x)}, {Tensor::ones({}, DType::F32)}, {t.w2, t.b2});
  EXPECT_TRUE(store.empty());
  EXPECT_TRUE(g[0].defined());
  EXPECT_TRUE(g[1].defined());
  // The scope ends with its object: no store after it.
}

TEST(WeightGradStore, ScopesNestAndRestore) {
  WeightGradStore a, b;
  EXPECT_EQ(WeightGradStore::active(), nullptr);
  {
    WeightGradStoreScope sa(&a);
    EXPECT_EQ(WeightGradStore::active(), &a);
    {
      WeightGradStoreScope sb(&b);
      EXPECT_EQ(WeightGradStore::active(), &b);
    }
    EXPECT_EQ(WeightGradStore::active(), &a);
  }
  EXPECT_EQ(WeightGradStore::active(), nullptr);
}

}  // namespace weight_grad_store_test
}  // namespace kiln
