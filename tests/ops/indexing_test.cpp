// embedding, index_select, gather, scatter_add, cat, stack, split and topk.
#include "kiln/ops/indexing.h"

#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "test_util.h"

namespace kiln {
namespace indexing_test {

using namespace kiln::testing;

TEST(Indexing, EmbeddingAndIndexSelect) {
  for (DType dt : float_dtypes()) {
    Tensor w = randn({5, 3}, 60, dt);
    Tensor idx = Tensor::from_vector<std::int64_t>({4, 0, 4, 2, 1, 4}, {2, 3});
    Tensor y = embedding(w, idx);
    ASSERT_EQ(y.shape(), (Shape{2, 3, 3}));
    auto wv = host(w);
    std::vector<double> ref;
    for (std::int64_t i : {4, 0, 4, 2, 1, 4})
      for (int j = 0; j < 3; ++j) ref.push_back(wv[i * 3 + j]);
    expect_close(y, ref, 0, "embedding");
    // index_select along dim 1.
    Tensor sel = index_select(w, 1, Tensor::from_vector<std::int64_t>({2, 2, 0}));
    std::vector<double> sref;
    for (int i = 0; i < 5; ++i)
      for (int j : {2, 2, 0}) sref.push_back(wv[i * 3 + j]);
    expect_close(sel, sref, 0, "index_select");
  }
  // Embedding backward accumulates repeated rows.
  Tensor w = randn({5, 2}, 61, DType::F64).requires_grad_();
  sum(embedding(w, Tensor::from_vector<std::int64_t>({4, 0, 4}))).backward();
  EXPECT_EQ(w.grad().to_vector<double>(), (std::vector<double>{1, 1, 0, 0, 0, 0, 0, 0, 2, 2}));
  EXPECT_THROW((void)embedding(w, Tensor::from_vector<std::int64_t>({5})), Error);
  EXPECT_THROW((void)embedding(w, Tensor::from_vector<float>({1})), Error);
}

TEST(Indexing, GatherAndScatterAdd) {
  Tensor x = Tensor::arange(0, 12, 1, DType::F64).reshape({3, 4});
  Tensor idx = Tensor::from_vector<std::int64_t>({3, 0, 1, 1, 2, 2}, {3, 2});
  EXPECT_EQ(gather(x, 1, idx).to_vector<double>(), (std::vector<double>{3, 0, 5, 5, 10, 10}));
  Tensor idx0 = Tensor::from_vector<std::int64_t>({2, 0, 1, 0}, {1, 4});
  EXPECT_EQ(gather(x, 0, idx0).to_vector<double>(), (std::vector<double>{8, 1, 6, 3}));
  Tensor src = Tensor::ones({3, 3}, DType::F64);
  Tensor out = scatter_add(Tensor::zeros({3, 4}, DType::F64), 1, idx, src);
  EXPECT_EQ(out.to_vector<double>(), (std::vector<double>{1, 0, 0, 1, 0, 2, 0, 0, 0, 0, 2, 0}));
  EXPECT_THROW((void)gather(x, 1, Tensor::from_vector<std::int64_t>({4}, {1, 1})), Error);
  EXPECT_THROW((void)gather(x, 1, Tensor::from_vector<std::int64_t>({0}, {1})), Error);
}

TEST(Indexing, CatStackSplit) {
  for (DType dt : float_dtypes()) {
    Tensor a = randn({2, 3}, 62, dt), b = randn({2, 1}, 63, dt);
    Tensor c = cat({a, b}, 1);
    ASSERT_EQ(c.shape(), (Shape{2, 4}));
    auto av = host(a), bv = host(b);
    expect_close(c, {av[0], av[1], av[2], bv[0], av[3], av[4], av[5], bv[1]}, 0, "cat");
    Tensor s = stack({a, a}, 1);
    ASSERT_EQ(s.shape(), (Shape{2, 2, 3}));
    expect_close(s, {av[0], av[1], av[2], av[0], av[1], av[2], av[3], av[4], av[5], av[3], av[4], av[5]}, 0, "stack");
    auto parts = split(c, 3, 1);
    ASSERT_EQ(parts.size(), 2u);
    EXPECT_EQ(parts[0].shape(), (Shape{2, 3}));
    EXPECT_EQ(parts[1].shape(), (Shape{2, 1}));
    expect_close(parts[1], bv, 0, "split");
    auto sized = split_sizes(c, {1, 3}, 1);
    expect_close(sized[0], {av[0], av[3]}, 0, "split_sizes");
  }
  EXPECT_THROW((void)cat({Tensor::ones({2, 3}), Tensor::ones({3, 3})}, 1), Error);
  EXPECT_THROW((void)split_sizes(Tensor::ones({4}), {1, 2}), Error);
}

TEST(Indexing, TopkSortedWithIndices) {
  Tensor x = Tensor::from_vector<float>({3, 1, 4, 1, 5, 9, 2, 6}, {2, 4});
  auto [v, i] = topk(x, 2);
  EXPECT_EQ(v.to_vector<float>(), (std::vector<float>{4, 3, 9, 6}));
  EXPECT_EQ(i.to_vector<std::int64_t>(), (std::vector<std::int64_t>{2, 0, 1, 3}));
  auto [vs, is] = topk(x, 3, false);
  EXPECT_EQ(vs.to_vector<float>(), (std::vector<float>{1, 1, 3, 2, 5, 6}));
  EXPECT_EQ(is.to_vector<std::int64_t>(), (std::vector<std::int64_t>{1, 3, 0, 2, 0, 3}));
  Tensor xg = Tensor::from_vector<double>({3, 1, 4, 1}).requires_grad_();
  sum(topk(xg, 2).first).backward();
  EXPECT_EQ(xg.grad().to_vector<double>(), (std::vector<double>{1, 0, 1, 0}));
  EXPECT_THROW((void)topk(x, 5), Error);
}

}  // namespace indexing_test
}  // namespace kiln
