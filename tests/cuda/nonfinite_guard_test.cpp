// train::NonFiniteGuard on the GPU: eager and inside a captured CUDA graph (as train-cifar10 runs
// it), the first step with a non-finite loss or gradient is named; replays count the steps.
#include "kiln/train/nonfinite_guard.h"

#include <gtest/gtest.h>

#include <limits>

#include "kiln/ops/copy.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "test_util.h"

namespace kiln::cudatest {
namespace nonfinite_guard_test {

#if KILN_WITH_CUDA

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

// A parameter on the GPU whose gradient is `grad`.
Tensor param_with(const std::vector<float>& grad) {
  Tensor p = Tensor::zeros({static_cast<std::int64_t>(grad.size())}, DType::F32, gpu());
  p.set_grad(Tensor::from_vector(grad, {static_cast<std::int64_t>(grad.size())}, gpu()));
  return p;
}

TEST(CudaNonFiniteGuard, EagerNamesTheFirstBadStep) {
  KILN_REQUIRE_CUDA();
  train::NonFiniteGuard guard(gpu());
  Tensor p = param_with({1, 2, 3});
  guard.record(Tensor::scalar(1.0, DType::F32, gpu()), {p});
  EXPECT_FALSE(guard.first_bad_step());
  guard.record(Tensor::scalar(1.0, DType::F32, gpu()), {p, param_with({1, kInf})});
  guard.record(Tensor::scalar(kNaN, DType::F32, gpu()), {p});
  ASSERT_TRUE(guard.first_bad_step());
  EXPECT_EQ(*guard.first_bad_step(), 2);
}

TEST(CudaNonFiniteGuard, InsideACapturedGraph) {
  KILN_REQUIRE_CUDA();
  train::NonFiniteGuard guard(gpu());
  Tensor loss = Tensor::scalar(0.5, DType::F32, gpu());
  Tensor p = param_with(std::vector<float>(5000, 0.25f));  // several chunks of the multi-tensor kernel
  guard.record(loss, {p});                                 // step 1, eager (the capture needs warm state)
  CudaGraph graph;
  graph.capture_begin(gpu());
  guard.record(loss, {p});  // recorded, not run
  graph.capture_end();
  for (int i = 0; i < 3; ++i) graph.replay();  // steps 2..4
  EXPECT_FALSE(guard.first_bad_step());
  ops::copy_into(p.grad().slice(0, 4321, 4322), Tensor::from_vector<float>({kNaN}, {1}, gpu()));
  graph.replay();  // step 5: a NaN gradient
  ops::copy_into(p.grad().slice(0, 4321, 4322), Tensor::from_vector<float>({1.0f}, {1}, gpu()));
  graph.replay();  // step 6: fine again, the first bad one stays
  ASSERT_TRUE(guard.first_bad_step());
  EXPECT_EQ(*guard.first_bad_step(), 5);
}

#endif

}  // namespace nonfinite_guard_test
}  // namespace kiln::cudatest
