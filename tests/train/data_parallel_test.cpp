// Data parallelism in the pretrain-gpt loop (train_language_model with a data-parallel group),
// run under `mpirun -np 2` and `-np 4` (tests/train/CMakeLists.txt; alone, a world of one, the tests
// skip). Each rank also trains the single-process reference itself, on the same global batches, and
// the data-parallel run must match it: the same losses, gradient norms and final weights, with and
// without the distributed optimizer and with the gradient reduction overlapped with backward
// (several buckets). Checkpoints are written by rank 0 in the single-process format: a resumed
// data-parallel run continues the same curve, and a single process continues a data-parallel one.
//
// Tolerance: the ranks' gradients are averaged in another order than one process adds its
// micro-batches, so values differ by float32 rounding. Measured over 8 AdamW steps on 2 and 4
// ranks: losses and gradient norms within 1.2e-7 relative, weights (O(0.1-1)) within 1.2e-7
// absolute; the bounds below are 1e-6 (relative for losses and norms, absolute for weights).
#include "kiln/train/data_parallel.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <iterator>
#include <string>

#include "bigram_lm.h"
#include "kiln/autograd/functions.h"
#include "kiln/dist/communicator.h"
#include "kiln/nn/layers.h"
#include "kiln/optim/grad_buffers.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/gpt_trainer.h"

namespace kiln::train {
namespace data_parallel_test {

namespace fs = std::filesystem;
using testing::bigram;

constexpr double kLossTolerance = 1e-6;    // relative
constexpr double kWeightTolerance = 1e-6;  // absolute

// One folder per test, made by rank 0 while the others wait.
fs::path shared_scratch(const dist::Communicator& world) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  const fs::path dir =
      fs::path(KILN_BINARY_DIR) / "test_scratch" / "train" /
      (std::string(info->test_suite_name()) + "." + info->name() + ".np" + std::to_string(world.size()));
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    testing::shakespeare_dataset(dir);
  }
  world.barrier();
  return dir;
}

// 16 sequences per global batch: 8 micro-batches of 2 in one process, 4 per rank on 2 ranks, 2 on 4.
GptTrainOptions options(const fs::path& dir) {
  GptTrainOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 16;
  o.train_iters = 8;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.lr_decay_style = "cosine";
  o.lr_warmup_iters = 2;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;  // clipping is on in most steps: the global norm must be the right one
  o.data_path = {{1.0, (dir / "shakespeare_text_document").string()}};
  o.split = "90,10,0";
  o.eval_interval = 4;
  o.eval_iters = 1;
  o.log_interval = 1;
  o.progress = false;
  return o;
}

GptTrainCallbacks quiet() {
  GptTrainCallbacks c;
  c.message = [](const std::string&) {};
  return c;
}

struct Trained {
  GptTrainSummary summary;
  TensorDict weights;
};

Trained train(const GptTrainOptions& o) {
  LanguageModelHandle h = bigram(32, 0.0);  // no dropout: the ranks' masks would differ from one process's
  Trained r;
  r.summary = train_language_model(h, o, quiet());
  r.weights = h.module->state_dict();
  return r;
}

void expect_same_training(const std::vector<GptLogRecord>& expected, const std::vector<GptLogRecord>& got,
                          const std::string& what) {
  ASSERT_EQ(expected.size(), got.size()) << what;
  for (std::size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(expected[i].iteration, got[i].iteration) << what;
    EXPECT_EQ(expected[i].consumed_samples, got[i].consumed_samples) << what;
    EXPECT_NEAR(expected[i].loss, got[i].loss, kLossTolerance * expected[i].loss)
        << what << ", iteration " << got[i].iteration;
    EXPECT_NEAR(expected[i].grad_norm, got[i].grad_norm, kLossTolerance * expected[i].grad_norm)
        << what << ", iteration " << got[i].iteration;
  }
}

void expect_same_weights(const TensorDict& expected, const TensorDict& got, const std::string& what) {
  ASSERT_EQ(expected.size(), got.size());
  for (const auto& [name, t] : expected) {
    const Tensor* g = got.find(name);
    ASSERT_NE(g, nullptr) << name;
    const auto a = t.contiguous().to_vector<float>(), b = g->contiguous().to_vector<float>();
    ASSERT_EQ(a.size(), b.size()) << name;
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    EXPECT_LE(worst, kWeightTolerance) << what << ": " << name << " differs by " << worst;
  }
}

class DataParallelTraining : public ::testing::TestWithParam<bool> {};  // the distributed optimizer or not

TEST_P(DataParallelTraining, MatchesOneProcessOnTheSameGlobalBatches) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  const Trained single = train(o);

  o.data_parallel = world;
  o.use_distributed_optimizer = GetParam();
  const Trained parallel = train(o);
  expect_same_training(single.summary.logs, parallel.summary.logs, "one reduction after backward");
  ASSERT_EQ(single.summary.evals.size(), parallel.summary.evals.size());
  for (std::size_t i = 0; i < single.summary.evals.size(); ++i)
    EXPECT_NEAR(single.summary.evals[i].loss, parallel.summary.evals[i].loss,
                kLossTolerance * single.summary.evals[i].loss);
  expect_same_weights(single.weights, parallel.weights, "one reduction after backward");

  // Buckets of 2000 elements (the model has ~8.5k parameters in 6 tensors): several reductions,
  // started from the grad-ready hooks while backward runs.
  o.overlap_grad_reduce = true;
  o.overlap_param_gather = GetParam();
  o.ddp_bucket_size = 2000;
  const Trained overlapped = train(o);
  expect_same_training(single.summary.logs, overlapped.summary.logs, "overlapped buckets");
  expect_same_weights(single.weights, overlapped.weights, "overlapped buckets");
}

TEST_P(DataParallelTraining, CheckpointsResumeAtAnyDataParallelSize) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  o.eval_iters = 0;
  o.data_parallel = world;
  o.use_distributed_optimizer = GetParam();
  o.overlap_grad_reduce = true;
  o.ddp_bucket_size = 2000;
  const Trained straight = train(o);

  // Stopped at iteration 4 and resumed with the same layout.
  o.save = o.load = dir / "resumed";
  o.exit_interval = 4;
  const Trained first = train(o);
  EXPECT_EQ(first.summary.iterations, 4);
  if (world.rank() == 0) {
    EXPECT_TRUE(fs::exists(o.save / "iter_0000004" / "optimizer.safetensors"));
    // The checkpoint is the single-process format: whole tensors, no shards.
    const auto index = fs::path(o.save / "iter_0000004" / "checkpoint.json");
    std::ifstream in(index);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text.find(".shard"), std::string::npos) << "a gathered optimizer state has no shard entries";
  }
  o.exit_interval = 0;
  const Trained second = train(o);
  EXPECT_EQ(second.summary.start_iteration, 4);
  std::vector<GptLogRecord> resumed = first.summary.logs;
  resumed.insert(resumed.end(), second.summary.logs.begin(), second.summary.logs.end());
  expect_same_training(straight.summary.logs, resumed, "resumed with the same layout");
  expect_same_weights(straight.weights, second.weights, "resumed with the same layout");

  // The data-parallel checkpoint continued by one process (every rank alone, from a copy of it),
  // and by the other optimizer kind: the same curve.
  GptTrainOptions alone = options(dir);
  alone.eval_iters = 0;
  alone.load = dir / "resumed";
  alone.save = dir / fmt::format("alone_{}", world.rank());
  alone.train_iters = 8;
  // Resume from iteration 4: a copy of the checkpoint folder at 4 only.
  if (world.rank() == 0) {
    fs::create_directories(dir / "at4");
    fs::copy(o.save / "iter_0000004", dir / "at4" / "iter_0000004", fs::copy_options::recursive);
    std::ofstream(dir / "at4" / "latest_checkpointed_iteration.txt") << "4\n";
  }
  world.barrier();
  alone.load = dir / "at4";
  const Trained single = train(alone);
  EXPECT_EQ(single.summary.start_iteration, 4);
  expect_same_training(std::vector<GptLogRecord>(straight.summary.logs.begin() + 4, straight.summary.logs.end()),
                       single.summary.logs, "one process resuming a data-parallel checkpoint");
  expect_same_weights(straight.weights, single.weights, "one process resuming a data-parallel checkpoint");

  GptTrainOptions other = o;
  other.use_distributed_optimizer = !GetParam();
  other.load = dir / "at4";
  other.save = dir / "other";
  const Trained switched = train(other);
  EXPECT_EQ(switched.summary.start_iteration, 4);
  expect_same_weights(straight.weights, switched.weights, "resumed with the other optimizer layout");
}

INSTANTIATE_TEST_SUITE_P(, DataParallelTraining, ::testing::Bool(), [](const ::testing::TestParamInfo<bool>& p) {
  return p.param ? std::string("DistributedOptimizer") : std::string("AllReduce");
});

// --rewind with the distributed optimizer: a NaN loss on one rank alone reaches every rank (the
// averaged loss and gradients), all of them roll back to the same snapshot (each its own shard of
// the optimizer state) and skip the batch, ending where one process told to skip it ends.
TEST(DataParallelRewind, ANanOnOneRankRewindsThemAll) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  o.eval_iters = 0;
  o.skip_batches = {5};
  const Trained clean = train(o);

  o.skip_batches = {};
  o.data_parallel = world;
  o.use_distributed_optimizer = true;
  o.overlap_grad_reduce = true;
  o.ddp_bucket_size = 2000;
  o.rewind.enabled = true;
  o.rewind.snapshot_interval = 2;
  o.rewind.thresholds.min_history = 4;
  if (world.rank() == 1) set_fault_plan_for_testing("nan_loss@5");
  const Trained rewound = train(o);
  set_fault_plan_for_testing("");
  ASSERT_EQ(rewound.summary.rewinds.size(), 1u);
  EXPECT_EQ(rewound.summary.rewinds[0].step, 5);
  EXPECT_EQ(rewound.summary.rewinds[0].restored_to, 4);
  EXPECT_EQ(rewound.summary.skipped_batches, (std::set<std::int64_t>{5}));
  EXPECT_NEAR(clean.summary.final_loss, rewound.summary.final_loss, kLossTolerance * clean.summary.final_loss);
  expect_same_weights(clean.weights, rewound.weights, "rewound on every rank");
}

// bf16 weights: the distributed optimizer's fp32 masters are sharded too, gathered whole into the
// checkpoint, and one process continues from them. bf16 rounding of the weights can differ by one
// unit (2^-8 relative) where the masters differ in the last float32 bit, so the bounds allow one
// unit (1e-2 for weights of magnitude up to 2, 1e-3 relative for losses); measured on 2 and 4
// ranks: equal.
TEST(DataParallelBf16, ShardedMastersGatherIntoTheCheckpoint) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  o.eval_iters = 0;
  o.bf16 = true;
  o.train_iters = 6;
  o.data_parallel = world;
  o.use_distributed_optimizer = true;
  const Trained straight = train(o);

  o.save = dir / "bf16";
  o.exit_interval = 4;
  train(o);
  if (world.rank() == 0) {
    std::ifstream in(o.save / "iter_0000004" / "checkpoint.json");
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_NE(text.find("state.0.master"), std::string::npos) << "the fp32 masters of the bf16 weights";
    EXPECT_EQ(text.find(".shard"), std::string::npos);
  }
  world.barrier();
  GptTrainOptions alone = options(dir);
  alone.eval_iters = 0;
  alone.bf16 = true;
  alone.train_iters = 6;
  alone.load = o.save;  // read only: it saves nowhere
  const Trained resumed = train(alone);
  EXPECT_EQ(resumed.summary.start_iteration, 4);
  ASSERT_EQ(resumed.summary.logs.size(), 2u);
  for (std::size_t i = 0; i < 2; ++i)
    EXPECT_NEAR(straight.summary.logs[4 + i].loss, resumed.summary.logs[i].loss, 1e-3 * resumed.summary.logs[i].loss);
  for (const auto& [name, t] : straight.weights) {
    const auto a = t.to(DType::F32).contiguous().to_vector<float>();
    const auto b = resumed.weights.find(name)->to(DType::F32).contiguous().to_vector<float>();
    double worst = 0;
    for (std::size_t i = 0; i < a.size(); ++i) worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    EXPECT_LE(worst, 1e-2) << name;
  }
}

// DataParallel alone, on a two-layer MLP whose input differs per rank: with overlap_grad_reduce the
// buckets' reductions start inside backward (before GradBuffers::finish_backward), and afterwards
// every rank holds the mean of all ranks' gradients, computed here by one process from every
// rank's input; with the distributed optimizer, each rank its shard of it.
TEST(DataParallelGradients, BucketsReduceDuringBackwardToTheRanksMean) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  auto input_of = [](int rank) { return Tensor::randn({4, 16}, 100 + static_cast<std::uint64_t>(rank)); };
  auto model = [] {
    manual_seed(3);
    auto a = std::make_shared<nn::Linear>(16, 32), b = std::make_shared<nn::Linear>(32, 8);
    return std::make_pair(a, b);
  };
  auto loss_of = [](auto& m, const Tensor& x) { return sum(mul(m.second->forward(m.first->forward(x)), 0.5)); };

  // The mean of every rank's gradients, by one process.
  auto reference = model();
  for (int r = 0; r < world.size(); ++r) mul(loss_of(reference, input_of(r)), 1.0 / world.size()).backward();
  const std::vector<Tensor> expected = {reference.first->weight.grad(), reference.first->bias.grad(),
                                        reference.second->weight.grad(), reference.second->bias.grad()};

  for (const bool distributed : {false, true}) {
    auto m = model();
    const std::vector<Tensor> params = {m.first->weight, m.first->bias, m.second->weight, m.second->bias};
    optim::GradBuffers buffers(params, {.bucket_size = 200, .shard_count = distributed ? world.size() : 1});
    ASSERT_GE(buffers.buffer(0).buckets().size(), 2u);
    DataParallel dp(buffers, world, {.distributed_optimizer = distributed, .overlap_grad_reduce = true});
    loss_of(m, input_of(world.rank())).backward();
    EXPECT_GE(dp.reductions_in_flight(), 1u) << "reductions started from the grad-ready hooks, during backward";
    buffers.finish_backward();
    dp.finish_grad_sync();
    EXPECT_EQ(dp.reductions_in_flight(), 0u);
    for (std::size_t i = 0; i < params.size(); ++i) {
      const auto want = expected[i].contiguous().to_vector<float>();
      const auto got = params[i].grad().contiguous().to_vector<float>();
      // With the distributed optimizer only this rank's shard of the flat buffer is reduced.
      const auto where = buffers.locate(params[i]);
      const optim::ElementRange range = buffers.buffer(where->buffer).range_of(where->index);
      std::vector<optim::ElementRange> mine = buffers.buffer(where->buffer).shard_ranges(world.rank(), world.size());
      for (std::size_t k = 0; k < want.size(); ++k) {
        const std::int64_t flat = range.begin + static_cast<std::int64_t>(k);
        bool reduced = !distributed;
        for (const auto& r : mine) reduced = reduced || (flat >= r.begin && flat < r.end);
        if (reduced) {
          EXPECT_NEAR(got[k], want[k], 1e-5 * (1 + std::abs(want[k]))) << "parameter " << i << "[" << k << "]";
        }
      }
    }
  }
}

TEST(DataParallelBatches, AGlobalBatchTheRanksCannotShareIsRefused) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or more (ctest: train_dp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  o.data_parallel = world;
  o.global_batch_size = 2 * world.size() + 2;  // a multiple of the micro-batch, not of micro x dp
  std::string error;
  try {
    train(o);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("--global-batch-size"), std::string::npos) << error;
  EXPECT_NE(error.find("data-parallel size"), std::string::npos) << error;
}

}  // namespace data_parallel_test
}  // namespace kiln::train
