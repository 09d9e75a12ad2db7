// Flat, bucketed gradient buffers (optim/param_and_grad_buffer.h, optim/grad_buffers.h): layout,
// padding and bucketing; bucket-ready notification; in-place gradient accumulation.
#include "kiln/optim/grad_buffers.h"

#include <gtest/gtest.h>

#include <numeric>

#include "kiln/autograd/functions.h"
#include "kiln/nn/nn.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {
namespace grad_buffers_test {

using optim::GradBucket;
using optim::GradBuffers;
using optim::ParamAndGradBuffer;

Tensor param(Shape shape, std::uint64_t seed, DType dtype = DType::F32) {
  return Tensor::randn(std::move(shape), seed, DType::F32).to(dtype).requires_grad_();
}

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GradBuffers, LayoutIsReversedAlignedAndBucketedWithPadding) {
  // Sizes chosen so that alignment and the bucket threshold both matter.
  std::vector<Tensor> params = {param({10, 10}, 1), param({3}, 2), param({50, 4}, 3), param({70}, 4), param({5, 5}, 5)};
  std::vector<std::vector<float>> values;
  for (const Tensor& p : params) values.push_back(p.to_vector<float>());
  GradBuffers grads(params, {.grad_dtype = DType::F32, .bucket_size = 150, .shard_count = 3});
  ASSERT_EQ(grads.size(), 1u);
  const ParamAndGradBuffer& buf = grads.buffer(0);
  ASSERT_EQ(buf.params().size(), 5u);
  // Reverse order: the last parameter first.
  for (std::size_t i = 0; i < 5; ++i) EXPECT_TRUE(buf.params()[i].is_same(params[4 - i])) << i;
  // Starts aligned to 64 elements; buckets close at >= 150 elements, padded to lcm(3, 128) = 384.
  // p4 (25) at 0, p3 (70) at 64 -> 134, p2 (200) at 192 -> 392: bucket 0 closes at 768.
  // p1 (3) at 768, p0 (100) at 832 -> 932: bucket 1 ends at 1152.
  EXPECT_EQ(buf.range_of(0), (optim::ElementRange{0, 25}));
  EXPECT_EQ(buf.range_of(1), (optim::ElementRange{64, 134}));
  EXPECT_EQ(buf.range_of(2), (optim::ElementRange{192, 392}));
  EXPECT_EQ(buf.range_of(3), (optim::ElementRange{768, 771}));
  EXPECT_EQ(buf.range_of(4), (optim::ElementRange{832, 932}));
  ASSERT_EQ(buf.buckets().size(), 2u);
  EXPECT_EQ(buf.buckets()[0].range, (optim::ElementRange{0, 768}));
  EXPECT_EQ(buf.buckets()[1].range, (optim::ElementRange{768, 1152}));
  EXPECT_EQ(buf.buckets()[0].params, (std::vector<std::size_t>{0, 1, 2}));
  EXPECT_EQ(buf.buckets()[1].params, (std::vector<std::size_t>{3, 4}));
  EXPECT_EQ(buf.numel(), 1152);
  EXPECT_EQ(buf.grad_data().numel(), 1152);
  // Shards: three equal parts of each bucket.
  EXPECT_EQ(buf.buckets()[1].shard(2, 3), (optim::ElementRange{768 + 256, 1152}));
  EXPECT_EQ(buf.shard_ranges(1, 3), (std::vector<optim::ElementRange>{{256, 512}, {896, 1024}}));
  // Parameters keep their values and shapes, now viewing the flat buffer; .grad views the grads.
  for (std::size_t j = 0; j < params.size(); ++j) {
    EXPECT_EQ(params[j].to_vector<float>(), values[j]) << j;
    EXPECT_EQ(params[j].storage(), buf.param_data().storage()) << j;
    ASSERT_TRUE(params[j].grad().defined());
    EXPECT_EQ(params[j].grad().storage(), buf.grad_data().storage()) << j;
    EXPECT_EQ(params[j].grad().shape(), params[j].shape()) << j;
  }
  // Padding is zero in the parameter buffer.
  auto flat = buf.param_data().to_vector<float>();
  for (std::int64_t i = 25; i < 64; ++i) EXPECT_EQ(flat[static_cast<std::size_t>(i)], 0.f);
  grads.check_views("test");
}

TEST(GradBuffers, GroupsByDtypeAndKeepsModulesWorking) {
  manual_seed(4);
  nn::Linear a(6, 5), b(5, 3);
  Tensor x = Tensor::randn({2, 6}, 9);
  const auto before = a.forward(x).to_vector<float>();
  {
    NoGradGuard no_grad;
    b.weight = b.weight.to(DType::BF16);
  }
  b.weight.requires_grad_();
  // Two buffers, in order of first appearance: f32 (a's), bf16 (b.weight).
  GradBuffers grads({a.weight, a.bias, b.weight}, {.grad_dtype = DType::BF16});
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_EQ(grads.buffer(0).param_dtype(), DType::F32);
  EXPECT_EQ(grads.buffer(1).param_dtype(), DType::BF16);
  EXPECT_EQ(grads.buffer(0).grad_dtype(), DType::BF16);
  EXPECT_EQ(b.weight.grad().dtype(), DType::BF16);
  ASSERT_TRUE(grads.locate(b.weight).has_value());
  EXPECT_EQ(grads.locate(b.weight)->buffer, 1u);
  EXPECT_FALSE(grads.locate(b.bias).has_value());
  // The module's parameters now live in the buffer and compute the same thing.
  EXPECT_EQ(a.weight.storage(), grads.buffer(0).param_data().storage());
  EXPECT_EQ(a.forward(x).to_vector<float>(), before);
}

TEST(GradBuffers, ExpertParametersGetBuffersOfTheirOwn) {
  // Expert parallelism: the experts' gradients reduce over another group, so they live apart, built
  // with their own options (the expert-data-parallel shard count).
  std::vector<Tensor> params = {param({4, 3}, 1), param({2, 5, 3}, 2), param({7}, 3), param({2, 3, 5}, 4)};
  GradBuffers grads(params, {.bucket_size = 0, .shard_count = 4}, {params[1], params[3]},
                    {.bucket_size = 0, .shard_count = 2});
  ASSERT_EQ(grads.size(), 2u);
  EXPECT_FALSE(grads.is_expert_buffer(0));
  EXPECT_TRUE(grads.is_expert_buffer(1));
  EXPECT_EQ(grads.buffer(0).options().shard_count, 4);
  EXPECT_EQ(grads.buffer(1).options().shard_count, 2);
  for (std::size_t i : {0u, 2u}) EXPECT_EQ(grads.locate(params[i])->buffer, 0u) << i;
  for (std::size_t i : {1u, 3u}) EXPECT_EQ(grads.locate(params[i])->buffer, 1u) << i;
  EXPECT_EQ(grads.params().size(), params.size());  // the order given is kept
  // Without expert parameters: one buffer, as before.
  GradBuffers plain({param({4, 3}, 5), param({7}, 6)}, {.bucket_size = 0}, {}, {.bucket_size = 0});
  EXPECT_EQ(plain.size(), 1u);
  EXPECT_FALSE(plain.is_expert_buffer(0));
}

TEST(GradBuffers, ClippingTheFlatGradientsClipsEveryParameterAsPerParameterClipping) {
  // The trainer scales the flat buffers (one launch each) instead of each parameter's gradient:
  // the parameters' gradients must come out as clip_grad_norm_ over the parameters makes them.
  std::vector<Tensor> params = {param({4, 3}, 1), param({2, 5, 3}, 2), param({7}, 3)};
  std::vector<Tensor> reference = {param({4, 3}, 1), param({2, 5, 3}, 2), param({7}, 3)};
  GradBuffers grads(params, {.bucket_size = 0}, {params[1]}, {.bucket_size = 0});
  ASSERT_EQ(grads.flat_grads().size(), 2u);
  for (std::size_t i = 0; i < params.size(); ++i) {
    sum(params[i] * params[i]).backward();
    sum(reference[i] * reference[i]).backward();
  }
  const Tensor norm = optim::grad_norm(params);
  optim::clip_to_norm_(grads.flat_grads(), norm, 0.5);
  const Tensor reference_norm = optim::clip_grad_norm_(reference, 0.5);
  EXPECT_FLOAT_EQ(norm.item(), reference_norm.item());
  for (std::size_t i = 0; i < params.size(); ++i)
    EXPECT_EQ(params[i].grad().to_vector<float>(), reference[i].grad().to_vector<float>()) << i;
  EXPECT_NEAR(optim::grad_norm(params).item(), 0.5, 1e-5);
}

TEST(GradBuffers, BucketReadyFiresDuringBackwardWithCompleteGradients) {
  manual_seed(5);
  nn::Linear l1(8, 16), l2(16, 16), l3(16, 4);
  std::vector<Tensor> params = {l1.weight, l1.bias, l2.weight, l2.bias, l3.weight, l3.bias};
  auto loss_of = [&](const Tensor& x) { return sum(square(l3.forward(tanh(l2.forward(tanh(l1.forward(x))))))); };
  Tensor x = Tensor::randn({5, 8}, 6);
  // Reference gradients, before the buffers exist.
  loss_of(x).backward();
  std::vector<std::vector<float>> ref;
  for (Tensor& p : params) {
    ref.push_back(p.grad().to_vector<float>());
    p.set_grad(Tensor());
  }

  // Reversed: l3 (68) and l2 (272) reach 200 elements -> bucket 0; l1 (144) -> bucket 1.
  GradBuffers grads(params, {.bucket_size = 200});
  const ParamAndGradBuffer& buf = grads.buffer(0);
  ASSERT_EQ(buf.buckets().size(), 2u);
  std::vector<std::size_t> notified;
  grads.set_bucket_ready_callback([&](ParamAndGradBuffer& b, const GradBucket& bucket) {
    notified.push_back(bucket.index);
    // Every gradient of the bucket is final when it is notified.
    for (std::size_t i : bucket.params) {
      const Tensor& p = b.params()[i];
      for (std::size_t j = 0; j < params.size(); ++j)
        if (params[j].is_same(p)) {
          auto got = p.grad().to_vector<float>();
          ASSERT_EQ(got.size(), ref[j].size());
          for (std::size_t k = 0; k < got.size(); ++k) EXPECT_NEAR(got[k], ref[j][k], 1e-5 * (1 + std::abs(ref[j][k])));
        }
    }
  });
  loss_of(x).backward();
  // Both buckets completed inside backward, the one nearest the loss first.
  EXPECT_EQ(notified, (std::vector<std::size_t>{0, 1}));
  EXPECT_EQ(grads.buckets_notified(), 2u);
  grads.finish_backward();  // nothing pending
  EXPECT_EQ(notified.size(), 2u);
  EXPECT_EQ(grads.buckets_notified(), 0u);

  // A bucket with a parameter that gets no gradient completes only at finish_backward().
  notified.clear();
  grads.set_bucket_ready_callback(
      [&](ParamAndGradBuffer&, const GradBucket& bucket) { notified.push_back(bucket.index); });
  grads.zero_grad();
  sum(square(l3.forward(Tensor::randn({2, 16}, 7)))).backward();  // only l3
  EXPECT_TRUE(notified.empty());
  grads.finish_backward();
  EXPECT_EQ(notified, (std::vector<std::size_t>{0, 1}));
}

TEST(GradBuffers, MicroBatchAccumulationEqualsTheBigBatchInPlace) {
  manual_seed(6);
  nn::Linear l1(4, 8), l2(8, 2);
  std::vector<Tensor> params = {l1.weight, l1.bias, l2.weight, l2.bias};
  auto loss_of = [&](const Tensor& x) { return sum(square(l2.forward(gelu(l1.forward(x))))); };
  Tensor batch = Tensor::randn({8, 4}, 10);
  GradBuffers grads(params, {.bucket_size = 0});
  // The big batch.
  loss_of(batch).backward();
  grads.finish_backward();
  std::vector<std::vector<float>> big;
  for (const Tensor& p : params) big.push_back(p.grad().to_vector<float>());

  grads.zero_grad();
  std::vector<const void*> where;
  for (const Tensor& p : params) where.push_back(p.grad().data_ptr());
  int notified = 0;
  grads.set_bucket_ready_callback([&](ParamAndGradBuffer&, const GradBucket&) { ++notified; });
  for (int m = 0; m < 4; ++m) {
    grads.set_grad_sync_enabled(m == 3);  // only the last micro-batch reduces
    loss_of(batch.narrow(0, 2 * m, 2)).backward();
  }
  EXPECT_EQ(notified, 1);
  grads.finish_backward();
  for (std::size_t j = 0; j < params.size(); ++j) {
    EXPECT_EQ(params[j].grad().data_ptr(), where[j]) << "gradient " << j << " was copied, not accumulated in place";
    auto got = params[j].grad().to_vector<float>();
    for (std::size_t k = 0; k < got.size(); ++k)
      EXPECT_NEAR(got[k], big[j][k], 1e-5 * (1 + std::abs(big[j][k]))) << j << " " << k;
  }
}

TEST(GradBuffers, SecondGradientInOneRoundIsReported) {
  // With sync on, each backward is one round, closed by finish_backward() (which DDP calls to
  // wait for the reductions): a second gradient in the same round would be reduced twice.
  Tensor w = param({4}, 11), v = param({4}, 12);
  GradBuffers grads({w, v}, {.bucket_size = 0});
  sum(w * 2.0).backward();  // v has no gradient: the bucket is still waiting
  const std::string m = message_of([&] { sum(w * 2.0).backward(); });
  EXPECT_NE(m.find("second gradient"), std::string::npos) << m;
  EXPECT_NE(m.find("finish_backward"), std::string::npos) << m;
  grads.finish_backward();
  EXPECT_EQ(message_of([&] { sum(w * v).backward(); }), "(no error)");
  grads.finish_backward();
}

TEST(GradBuffers, RefusesBadInput) {
  std::string m = message_of([] { GradBuffers g({param({3}, 1, DType::F64)}); });
  EXPECT_NE(m.find("ParamAndGradBuffer"), std::string::npos) << m;
  EXPECT_NE(m.find("float64"), std::string::npos) << m;
  m = message_of([] { GradBuffers g({param({3}, 1)}, {.grad_dtype = DType::F16}); });
  EXPECT_NE(m.find("grad_dtype"), std::string::npos) << m;
  Tensor p = param({3}, 2);
  m = message_of([&] { GradBuffers g({p, p}); });
  EXPECT_NE(m.find("listed twice"), std::string::npos) << m;
  m = message_of([] { GradBuffers g({Tensor::randn({3}, 1) * 2.0}); });
  EXPECT_NE(m.find("leaf"), std::string::npos) << m;
  GradBuffers g({param({200}, 3)}, {.shard_count = 2});  // one bucket of 256 elements
  m = message_of([&] { (void)g.buffer(0).buckets()[0].shard(0, 3); });
  EXPECT_NE(m.find("GradBucket::shard"), std::string::npos) << m;
  EXPECT_NE(m.find("3 equal shards"), std::string::npos) << m;
  m = message_of([&] { (void)g.shard(2, 2); });
  EXPECT_NE(m.find("rank 2 of 2"), std::string::npos) << m;
}

}  // namespace grad_buffers_test
}  // namespace kiln
