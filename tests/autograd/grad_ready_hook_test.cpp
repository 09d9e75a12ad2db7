// Grad-ready hooks (autograd/grad_ready_hook.h): once per parameter per backward, after the
// last contribution.
#include "kiln/autograd/grad_ready_hook.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "kiln/autograd/functions.h"

namespace kiln {
namespace grad_ready_hook_test {

using autograd::register_grad_ready_hook;

TEST(GradReadyHook, SharedParameterFiresOnceAfterBothContributions) {
  Tensor w = Tensor::from_vector<double>({1.0, 2.0}).requires_grad_();
  Tensor v = Tensor::from_vector<double>({3.0, -1.0}).requires_grad_();
  std::vector<std::string> order;
  std::vector<double> w_seen;
  auto hw = register_grad_ready_hook(w, [&](const Tensor& leaf) {
    order.push_back("w");
    w_seen = leaf.grad().to_vector<double>();
  });
  auto hv = register_grad_ready_hook(v, [&](const Tensor&) { order.push_back("v"); });
  // w is used twice, at the start and at the end of the graph: dy/dw = 2 w v + 1.
  Tensor a = w * v;
  Tensor y = sum(a * w + w);
  y.backward();
  ASSERT_EQ(order.size(), 2u);
  EXPECT_EQ(std::count(order.begin(), order.end(), "w"), 1);
  EXPECT_EQ(w_seen, (std::vector<double>{2 * 1.0 * 3.0 + 1, 2 * 2.0 * -1.0 + 1}));
  EXPECT_EQ(w.grad().to_vector<double>(), w_seen);

  // Once per backward: a second backward fires again, with the accumulated gradient.
  order.clear();
  sum(w * 2.0).backward();
  EXPECT_EQ(order, (std::vector<std::string>{"w"}));
  EXPECT_EQ(w_seen, (std::vector<double>{9, -1}));
}

TEST(GradReadyHook, NotCalledWithoutAGradientAndRemovedWithItsHandle) {
  Tensor w = Tensor::from_vector<double>({1.0}).requires_grad_();
  Tensor u = Tensor::from_vector<double>({1.0}).requires_grad_();
  int calls = 0;
  {
    auto h = register_grad_ready_hook(w, [&](const Tensor&) { ++calls; });
    sum(u * 2.0).backward();  // w is not in the graph
    EXPECT_EQ(calls, 0);
    sum(w * 2.0).backward();
    EXPECT_EQ(calls, 1);
    auto moved = std::move(h);  // the moved-from handle removes nothing
    sum(w * 2.0).backward();
    EXPECT_EQ(calls, 2);
  }
  sum(w * 2.0).backward();
  EXPECT_EQ(calls, 2);
}

TEST(GradReadyHook, HookSeesFp32AccumulationOfABf16Gradient) {
  // A bf16 parameter whose .grad is an fp32 tensor (a flat-buffer view): contributions are
  // converted and added in place.
  Tensor w = Tensor::from_vector<float>({1.5f, -2.0f}).to(DType::BF16).requires_grad_();
  Tensor g = Tensor::zeros({2}, DType::F32);
  w.set_grad(g);
  const void* where = g.data_ptr();
  sum(w * w).backward();
  sum(w * w).backward();
  EXPECT_EQ(w.grad().data_ptr(), where);
  EXPECT_EQ(w.grad().dtype(), DType::F32);
  EXPECT_EQ(w.grad().to_vector<float>(), (std::vector<float>{6.0f, -8.0f}));
}

TEST(GradReadyHook, RefusesNonLeaves) {
  Tensor w = Tensor::from_vector<double>({1.0}).requires_grad_();
  try {
    auto h = register_grad_ready_hook(w * 2.0, [](const Tensor&) {});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("register_grad_ready_hook"), std::string::npos) << e.what();
  }
  EXPECT_THROW((void)register_grad_ready_hook(Tensor::from_vector<double>({1.0}), [](const Tensor&) {}), Error);
}

}  // namespace grad_ready_hook_test
}  // namespace kiln
