#include "kiln/tensor/tensor.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"

namespace kiln {
namespace tensor_test {

TEST(Tensor, FactoriesAndHostRoundTrip) {
  Tensor t = Tensor::arange(0, 6).reshape({2, 3});
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 1, 2, 3, 4, 5}));
  EXPECT_EQ(Tensor::full({2}, 7.5, DType::F64).to_vector<double>(), (std::vector<double>{7.5, 7.5}));
  EXPECT_EQ(Tensor::zeros({3}, DType::I64).to_vector<std::int64_t>(), (std::vector<std::int64_t>{0, 0, 0}));
}

TEST(Tensor, ViewsShareStorage) {
  Tensor t = Tensor::arange(0, 6).reshape({2, 3});
  Tensor tt = t.t();
  EXPECT_FALSE(tt.is_contiguous());
  EXPECT_EQ(tt.contiguous().to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
  Tensor s = t.slice(1, 1, 3);
  EXPECT_EQ(s.to_vector<float>(), (std::vector<float>{1, 2, 4, 5}));
  s.fill_(9);
  EXPECT_EQ(t.to_vector<float>(), (std::vector<float>{0, 9, 9, 3, 9, 9}));
  EXPECT_EQ(t.select(0, 1).to_vector<float>(), (std::vector<float>{3, 9, 9}));
  EXPECT_EQ(Tensor::ones({3}).expand({2, 3}).shape(), (Shape{2, 3}));
  EXPECT_EQ(t.unsqueeze(0).shape(), (Shape{1, 2, 3}));
  EXPECT_EQ(t.unsqueeze(0).squeeze(0).shape(), (Shape{2, 3}));
  EXPECT_EQ(t.flatten().shape(), (Shape{6}));
}

TEST(Tensor, ReshapeOfNonContiguousCopies) {
  Tensor t = Tensor::arange(0, 6).reshape({2, 3}).t();
  EXPECT_THROW(t.view({6}), Error);
  EXPECT_EQ(t.reshape({6}).to_vector<float>(), (std::vector<float>{0, 3, 1, 4, 2, 5}));
}

TEST(Tensor, DtypeConversions) {
  Tensor t = Tensor::from_vector<float>({1.5f, -2.25f, 3.0f});
  EXPECT_EQ(t.to(DType::F64).to_vector<double>(), (std::vector<double>{1.5, -2.25, 3.0}));
  EXPECT_EQ(t.to(DType::BF16).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 3.0f}));
  EXPECT_EQ(t.to(DType::F16).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 3.0f}));
  EXPECT_EQ(t.to(DType::I64).to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, -2, 3}));
  EXPECT_EQ(t.to(DType::F8E4M3).to_vector<float>(), (std::vector<float>{1.5f, -2.25f, 3.0f}));
}

TEST(Tensor, Fp8SaturatesAndRounds) {
  EXPECT_EQ(static_cast<float>(Float8E4M3(1000.0f)), 448.0f);
  EXPECT_EQ(static_cast<float>(Float8E5M2(1e6f)), 57344.0f);
  EXPECT_EQ(static_cast<float>(Float8E4M3(0.0f)), 0.0f);
  EXPECT_EQ(static_cast<float>(Float8E4M3(1.0625f)), 1.0f);                 // ties to even
  EXPECT_EQ(static_cast<float>(Float8E4M3(-0.001953125f)), -0.001953125f);  // smallest subnormal 2^-9
}

TEST(Tensor, RandomIsDeterministicPerSeed) {
  auto a = Tensor::randn({1000}, 42).to_vector<float>();
  auto b = Tensor::randn({1000}, 42).to_vector<float>();
  auto c = Tensor::randn({1000}, 43).to_vector<float>();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  double mean = 0, sq = 0;
  for (float v : a) mean += v;
  mean /= 1000;
  for (float v : a) sq += (v - mean) * (v - mean);
  EXPECT_NEAR(mean, 0.0, 0.1);
  EXPECT_NEAR(sq / 999, 1.0, 0.15);
}

TEST(Tensor, ErrorsNameTheOpAndOperands) {
  Tensor a = Tensor::zeros({2, 3});
  Tensor b = Tensor::zeros({4});
  try {
    add(a, b);
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("add"), std::string::npos) << m;
    EXPECT_NE(m.find("[2, 3]"), std::string::npos) << m;
    EXPECT_NE(m.find("[4]"), std::string::npos) << m;
  }
  try {
    add(a, Tensor::zeros({2, 3}, DType::F64));
    FAIL();
  } catch (const Error& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("float32[2, 3] on cpu"), std::string::npos) << m;
    EXPECT_NE(m.find("float64[2, 3] on cpu"), std::string::npos) << m;
  }
}

TEST(Tensor, PrintsLikePyTorch) {
  EXPECT_EQ(Tensor::arange(0, 3).str(), "tensor([0.0000, 1.0000, 2.0000], dtype=float32, device=cpu)");
}

}  // namespace tensor_test
}  // namespace kiln
