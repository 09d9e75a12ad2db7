// The vocabulary split over a tensor-parallel group of all ranks (vocab_parallel.h) under
// `mpirun -np 2` and `-np 4` (tests/models/CMakeLists.txt; alone they skip): the embedding and the
// cross-entropy of each rank's vocabulary rows give the one-process embedding and cross-entropy of
// the whole table and logits, values and gradients (each rank its rows' part), within 1e-5 relative.
#include "kiln/models/vocab_parallel.h"

#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/dist/communicator.h"
#include "kiln/runtime/error.h"

namespace kiln::models {
namespace vocab_parallel_test {

constexpr std::int64_t kVocab = 24, kHidden = 5, kTokens = 7;

void expect_close(const Tensor& expected, const Tensor& got, const std::string& what) {
  ASSERT_EQ(expected.shape(), got.shape()) << what;
  const auto a = expected.contiguous().to_vector<float>(), b = got.contiguous().to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(a[i]))) << what << "[" << i << "]";
}

// Labels and tokens that fall into every rank's range (ids spread over the whole vocabulary).
Tensor ids() { return Tensor::from_vector<std::int64_t>({0, 23, 5, 12, 17, 6, 11}, {kTokens}); }

TEST(VocabParallel, CrossEntropyEqualsTheWholeLogits) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const std::int64_t part = kVocab / world.size(), start = vocab_range_start(kVocab, world.rank(), world.size());
  Tensor logits = mul(Tensor::randn({kTokens, kVocab}, 21), 3.0).requires_grad_();
  Tensor expected = cross_entropy(logits, ids());
  expected.backward();

  Tensor mine = logits.detach().narrow(1, start, part).contiguous().requires_grad_();
  Tensor loss = vocab_parallel_cross_entropy(mine, ids(), kVocab, world);
  loss.backward();
  expect_close(expected.detach(), loss.detach(), "loss");
  expect_close(logits.grad().narrow(1, start, part), mine.grad(), "this rank's logits' gradient");
}

TEST(VocabParallel, EmbeddingEqualsTheWholeTable) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const std::int64_t part = kVocab / world.size(), start = vocab_range_start(kVocab, world.rank(), world.size());
  Tensor table = Tensor::randn({kVocab, kHidden}, 22).requires_grad_();
  const Tensor probe = Tensor::randn({kTokens, kHidden}, 23);
  Tensor expected = embedding(table, ids());
  sum(mul(expected, probe)).backward();

  Tensor rows = table.detach().narrow(0, start, part).contiguous().requires_grad_();
  Tensor got = vocab_parallel_embedding(rows, ids(), kVocab, world);
  sum(mul(got, probe)).backward();
  expect_close(expected.detach(), got.detach(), "embeddings");
  expect_close(table.grad().narrow(0, start, part), rows.grad(), "this rank's rows' gradient");
}

TEST(VocabParallel, AVocabularyTheGroupCannotSplitIsRefused) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  std::string error;
  try {
    vocab_range_start(4 * world.size() + 1, 0, world.size());
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("is not divisible by --tensor-model-parallel-size"), std::string::npos) << error;
}

}  // namespace vocab_parallel_test
}  // namespace kiln::models
