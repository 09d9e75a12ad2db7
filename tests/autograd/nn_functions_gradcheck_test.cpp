// Finite-difference gradchecks (float64) of conv/pool, normalisation, softmax/losses, dropout,
// embedding and indexing functions.
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/gradcheck.h"

namespace kiln {
namespace nn_functions_gradcheck_test {

using autograd::gradcheck;
using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

Tensor rnd(Shape s, std::uint64_t seed) { return Tensor::randn(std::move(s), seed, DType::F64); }

void check(const char* what, const Fn& f, std::vector<Tensor> inputs) {
  auto r = gradcheck(f, std::move(inputs));
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
}

TEST(GradcheckNN, Conv2d) {
  ops::Conv2dParams plain;
  check("conv2d", [&](const auto& in) { return conv2d(in[0], in[1], in[2], plain); },
        {rnd({2, 2, 5, 4}, 1), rnd({3, 2, 3, 2}, 2), rnd({3}, 3)});
  check("conv2d unbatched", [&](const auto& in) { return conv2d(in[0], in[1], Tensor(), plain); },
        {rnd({2, 4, 3}, 9), rnd({3, 2, 2, 2}, 10)});
  ops::Conv2dParams p;
  p.stride_h = 2;
  p.pad_h = p.pad_w = 1;
  p.dilation_w = 2;
  check("conv2d strided/dilated", [&](const auto& in) { return conv2d(in[0], in[1], Tensor(), p); },
        {rnd({1, 2, 6, 5}, 4), rnd({2, 2, 3, 2}, 5)});
  ops::Conv2dParams g;
  g.groups = 2;
  g.pad_h = 1;
  check("conv2d groups", [&](const auto& in) { return conv2d(in[0], in[1], in[2], g); },
        {rnd({2, 4, 4, 3}, 6), rnd({4, 2, 2, 2}, 7), rnd({4}, 8)});
}

TEST(GradcheckNN, Pooling) {
  check("max_pool2d", [](const auto& in) { return max_pool2d(in[0], 2); }, {rnd({2, 2, 4, 6}, 10)});
  check("max_pool2d pad", [](const auto& in) { return max_pool2d(in[0], 3, 2, 1); }, {rnd({1, 2, 5, 5}, 11)});
  check("avg_pool2d", [](const auto& in) { return avg_pool2d(in[0], 3, 2, 1); }, {rnd({1, 2, 5, 6}, 12)});
  check("avg_pool2d exclude pad", [](const auto& in) { return avg_pool2d(in[0], 3, 2, 1, false); },
        {rnd({1, 2, 5, 6}, 13)});
  check("adaptive_avg_pool2d", [](const auto& in) { return adaptive_avg_pool2d(in[0], 3, 2); },
        {rnd({2, 1, 7, 5}, 14)});
}

TEST(GradcheckNN, Normalisation) {
  check("batch_norm train NCHW",
        [](const auto& in) {
          Tensor rm = Tensor::zeros({3}, DType::F64), rv = Tensor::ones({3}, DType::F64);
          return batch_norm(in[0], in[1], in[2], rm, rv, true);
        },
        {rnd({3, 3, 2, 2}, 20), rnd({3}, 21), rnd({3}, 22)});
  check("batch_norm train NC no stats",
        [](const auto& in) { return batch_norm(in[0], in[1], in[2], Tensor(), Tensor(), true); },
        {rnd({5, 3}, 23), rnd({3}, 24), rnd({3}, 25)});
  check("batch_norm eval",
        [](const auto& in) {
          Tensor rm = Tensor::from_vector<double>({0.1, -0.2}), rv = Tensor::from_vector<double>({0.5, 2.0});
          return batch_norm(in[0], in[1], in[2], rm, rv, false);
        },
        {rnd({2, 2, 3}, 26), rnd({2}, 27), rnd({2}, 28)});
  check("layer_norm", [](const auto& in) { return layer_norm(in[0], in[1], in[2]); },
        {rnd({2, 3, 5}, 29), rnd({5}, 30), rnd({5}, 31)});
  check("layer_norm 2-D weight", [](const auto& in) { return layer_norm(in[0], in[1], in[2]); },
        {rnd({2, 3, 4}, 32), rnd({3, 4}, 33), rnd({3, 4}, 34)});
  check("layer_norm no affine", [](const auto& in) { return layer_norm(in[0], Tensor(), Tensor()); },
        {rnd({4, 6}, 35)});
  check("rms_norm", [](const auto& in) { return rms_norm(in[0], in[1]); }, {rnd({3, 6}, 36), rnd({6}, 37)});
}

TEST(GradcheckNN, SoftmaxAndLosses) {
  for (int dim : {0, 1, 2}) {
    check("softmax", [dim](const auto& in) { return softmax(in[0], dim); }, {rnd({2, 3, 4}, 40 + dim)});
    check("log_softmax", [dim](const auto& in) { return log_softmax(in[0], dim); }, {rnd({2, 3, 4}, 43 + dim)});
  }
  Tensor t = Tensor::from_vector<std::int64_t>({1, 0, -100, 3, 3});
  check("cross_entropy", [&](const auto& in) { return cross_entropy(in[0], t); }, {rnd({5, 4}, 46)});
  check("cross_entropy smoothing", [&](const auto& in) { return cross_entropy(in[0], t, -100, 0.2); },
        {rnd({5, 4}, 47)});
  Tensor t3 = Tensor::from_vector<std::int64_t>({0, 2, 1, 1, 2, 0}, {2, 3});
  check("cross_entropy [N, C, L]", [&](const auto& in) { return cross_entropy(in[0], t3, 2, 0.1); },
        {rnd({2, 3, 3}, 48)});
  check("mse_loss", [](const auto& in) { return mse_loss(in[0], in[1]); }, {rnd({3, 4}, 49), rnd({3, 4}, 50)});
}

TEST(GradcheckNN, DropoutEmbeddingIndexing) {
  check("dropout", [](const auto& in) { return dropout(in[0], 0.4, true, 99, 5); }, {rnd({4, 5}, 60)});
  Tensor idx = Tensor::from_vector<std::int64_t>({2, 0, 2, 3}, {2, 2});
  check("embedding", [&](const auto& in) { return embedding(in[0], idx); }, {rnd({4, 3}, 61)});
  Tensor sel = Tensor::from_vector<std::int64_t>({1, 1, 0});
  check("index_select", [&](const auto& in) { return index_select(in[0], 1, sel); }, {rnd({2, 3, 2}, 62)});
  Tensor gi = Tensor::from_vector<std::int64_t>({0, 2, 2, 1, 1, 0}, {2, 3});
  check("gather", [&](const auto& in) { return gather(in[0], 1, gi); }, {rnd({2, 4}, 63)});
  check("scatter_add", [&](const auto& in) { return scatter_add(in[0], 1, gi, in[1]); },
        {rnd({2, 4}, 64), rnd({3, 4}, 65)});
  check("cat", [](const auto& in) { return cat({in[0], in[1], in[0]}, 1); }, {rnd({2, 3}, 66), rnd({2, 1}, 67)});
  check("stack", [](const auto& in) { return stack({in[0], in[1]}, 2); }, {rnd({2, 3}, 68), rnd({2, 3}, 69)});
  check("split", [](const auto& in) { return split(in[0], 2, 0)[1] * 2.0; }, {rnd({5, 2}, 70)});
  check("split_sizes", [](const auto& in) { return split_sizes(in[0], {1, 3}, 1)[1]; }, {rnd({2, 4}, 71)});
  check("topk", [](const auto& in) { return topk(in[0], 2).first; }, {rnd({3, 5}, 72)});
  check("topk smallest", [](const auto& in) { return topk(in[0], 3, false).first; }, {rnd({2, 4}, 73)});
}

}  // namespace nn_functions_gradcheck_test
}  // namespace kiln
