// Tensor (and sequence) parallelism in `pretrain-gpt`'s loop (pretrain_gpt with process groups),
// under `mpirun -np 2` and `-np 4` (ctest train_tp_mpirun_2/4; alone, a world of one, the tests
// skip). Every rank also trains the one-process reference on the same global batches; each layout
// must give its losses and gradient norms over 10 AdamW steps with clipping, and the final weights
// (the checkpoint it writes, gathered into whole tensors):
//   2 ranks: TP2, TP2 + sequence parallelism;
//   4 ranks: TP4, TP4 + SP, TP2 x DP2 (+ SP, with the distributed optimizer);
// for a GPT-2 shape and a Llama shape (RoPE, RMSNorm, SwiGLU, GQA, untied, no biases). Checkpoints
// are layout independent: a TP checkpoint at iteration 5 continued by one process, and a
// one-process checkpoint continued under TP, give the reference's iterations 6 to 10.
//
// Tolerance: the ranks' partial sums are added in another order than one process's GEMMs; measured
// (2026-12-03, -np 2 and -np 4) over 10 steps: losses and gradient norms within 2.1e-7 relative,
// final weights within 1.4e-6 absolute; asserted 2e-5 for both. Counting the replicated
// parameters on every rank in the gradient norm fails it (from the first step), and so does leaving
// out the sum of the sequence-parallel gradients over the group.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <string>

#include "bigram_lm.h"
#include "kiln/dist/process_groups.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/gpt_pretrain.h"

namespace kiln::train {
namespace {

namespace fs = std::filesystem;

constexpr double kTolerance = 2e-5;

fs::path shared_scratch(const dist::Communicator& world) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name() + ".np" + std::to_string(world.size());
  for (char& ch : name)
    if (ch == '/') ch = '_';
  const fs::path dir = fs::path(KILN_BINARY_DIR) / "test_scratch" / "train" / name;
  if (world.rank() == 0) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    testing::shakespeare_dataset(dir);
  }
  world.barrier();
  return dir;
}

models::GptConfig gpt2_shape() {
  models::GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = testing::kVocab;  // 128: splits over 2 and 4 ranks
  c.make_vocab_size_divisible_by = 1;
  c.attention_dropout = 0;  // the ranks' masks would differ from one process's
  c.hidden_dropout = 0;
  return c;
}

models::GptConfig llama_shape() {
  models::GptConfig c = gpt2_shape();
  c.position_embedding_type = models::PositionEmbedding::Rope;
  c.normalization = models::Normalization::RMSNorm;
  c.swiglu = true;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

GptTrainOptions options(const fs::path& dir) {
  GptTrainOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 8;
  o.train_iters = 10;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.lr_decay_style = "cosine";
  o.lr_warmup_iters = 2;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;  // clipping on in most steps: the norm must count each parameter once
  o.data_path = {{1.0, (dir / "shakespeare_text_document").string()}};
  o.split = "90,10,0";
  o.eval_interval = 5;
  o.eval_iters = 1;
  o.log_interval = 1;
  o.progress = false;
  o.seed = 7;
  return o;
}

GptTrainCallbacks quiet() {
  GptTrainCallbacks c;
  c.message = [](const std::string&) {};
  return c;
}

struct Layout {
  int tp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
};

std::string layout_name(const Layout& l, int world) {
  return "tp" + std::to_string(l.tp) + "xdp" + std::to_string(world / l.tp) + (l.sequence_parallel ? "+sp" : "") +
         (l.distributed_optimizer ? "+zero1" : "");
}

// The run's groups on every rank of the world (collective).
void join(GptTrainOptions& o, models::GptConfig& c, const Layout& l) {
  auto groups =
      std::make_shared<const dist::ProcessGroups>(dist::Communicator::world(), dist::ParallelSizes{.tp = l.tp});
  o.data_parallel = groups->dp_cp();
  if (l.tp > 1) o.tensor_parallel = groups->tp();
  o.process_groups = groups;
  o.use_distributed_optimizer = l.distributed_optimizer;
  c.tensor_model_parallel_size = l.tp;
  c.sequence_parallel = l.sequence_parallel;
}

void expect_same_logs(const std::vector<GptLogRecord>& expected, const std::vector<GptLogRecord>& got,
                      const std::string& what) {
  ASSERT_FALSE(got.empty()) << what;
  // `got` may start later (a resumed run): compare from its first iteration.
  std::size_t offset = 0;
  while (offset < expected.size() && expected[offset].iteration != got[0].iteration) ++offset;
  ASSERT_EQ(expected.size() - offset, got.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const GptLogRecord &e = expected[offset + i], &g = got[i];
    EXPECT_EQ(e.iteration, g.iteration) << what;
    EXPECT_NEAR(e.loss, g.loss, kTolerance * e.loss) << what << ", loss at iteration " << g.iteration;
    EXPECT_NEAR(e.grad_norm, g.grad_norm, kTolerance * e.grad_norm) << what << ", grad norm at " << g.iteration;
    worst = std::max({worst, std::abs(e.loss - g.loss) / e.loss, std::abs(e.grad_norm - g.grad_norm) / e.grad_norm});
  }
  if (dist::Communicator::world().rank() == 0)
    std::printf("%s: worst relative difference of losses and gradient norms from one process %.2e\n", what.c_str(),
                worst);
}

void expect_same_checkpoint_weights(const fs::path& expected, const fs::path& got, const std::string& what) {
  const TensorDict a = read_gpt_checkpoint_weights(expected).model, b = read_gpt_checkpoint_weights(got).model;
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst_weight = 0;
  for (const auto& [name, t] : a) {
    const Tensor* g = b.find(name);
    ASSERT_NE(g, nullptr) << what << ": " << name;
    ASSERT_EQ(t.shape(), g->shape()) << what << ": " << name;
    const auto x = t.contiguous().to_vector<float>(), y = g->contiguous().to_vector<float>();
    double worst = 0;
    for (std::size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::abs(double(x[i]) - double(y[i])));
    EXPECT_LE(worst, kTolerance) << what << ": " << name << " differs by " << worst;
    worst_weight = std::max(worst_weight, worst);
  }
  std::printf("%s: final weights differ from one process's by at most %.2e\n", what.c_str(), worst_weight);
}

class TensorParallelTraining : public ::testing::TestWithParam<std::string> {};  // the model's shape

TEST_P(TensorParallelTraining, EveryLayoutMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_tp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = GetParam() == "gpt2" ? gpt2_shape() : llama_shape();

  // The reference: one process (each rank its own, in its own folder).
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  ASSERT_EQ(reference.logs.size(), 10u);

  std::vector<Layout> layouts = {{world.size(), false, false}, {world.size(), true, false}};
  if (world.size() == 4) layouts.push_back({2, true, true});
  for (const Layout& l : layouts) {
    const std::string what = layout_name(l, world.size());
    GptTrainOptions o = options(dir);
    models::GptConfig c = shape;
    join(o, c, l);
    o.save = dir / what;
    const GptTrainSummary s = pretrain_gpt(c, o, {}, quiet());
    expect_same_logs(reference.logs, s.logs, what);
    ASSERT_EQ(s.evals.size(), reference.evals.size()) << what;
    for (std::size_t i = 0; i < s.evals.size(); ++i)
      EXPECT_NEAR(s.evals[i].loss, reference.evals[i].loss, kTolerance * reference.evals[i].loss) << what;
    // Rank 0 wrote whole tensors: the one-process checkpoint's names and shapes, and its values.
    if (world.rank() == 0) expect_same_checkpoint_weights(single.save, o.save, what);
    world.barrier();
  }
}

TEST_P(TensorParallelTraining, CheckpointsLoadInAnotherLayout) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_tp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = GetParam() == "gpt2" ? gpt2_shape() : llama_shape();
  const Layout tp_layout{2, true, false};  // tp2 (x dp2 on 4 ranks), sequence parallel
  const std::string mine = "rank" + std::to_string(world.rank());

  // The reference, whole, and its checkpoint at iteration 5 (each rank its own).
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_" + mine);
  single.save_interval = 5;
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());

  // TP stopped at 5 ...
  GptTrainOptions first = options(dir);
  models::GptConfig c = shape;
  join(first, c, tp_layout);
  first.save = dir / "tp_first";
  first.exit_interval = 5;
  const GptTrainSummary stopped = pretrain_gpt(c, first, {}, quiet());
  ASSERT_EQ(stopped.iterations, 5);
  // ... continued by one process (each rank on its own copy): the reference's iterations 6 to 10.
  const fs::path copy = dir / ("tp_first_continued_" + mine);
  fs::copy(first.save, copy, fs::copy_options::recursive);
  GptTrainOptions alone = options(dir);
  alone.load = copy;
  alone.save = copy;
  const GptTrainSummary continued = pretrain_gpt(shape, alone, {}, quiet());
  EXPECT_EQ(continued.start_iteration, 5);
  expect_same_logs(reference.logs, continued.logs, "a TP checkpoint continued by one process");

  // A one-process checkpoint at 5 (rank 0's reference, cut at 5) continued under TP.
  world.barrier();
  const fs::path at5 = dir / "single_at5";
  if (world.rank() == 0) {
    fs::copy(single.save, at5, fs::copy_options::recursive);
    fs::remove_all(at5 / "iter_0000010");
    std::ofstream(at5 / "latest_checkpointed_iteration.txt") << "5";
  }
  world.barrier();
  GptTrainOptions resumed = options(dir);
  models::GptConfig rc = shape;
  join(resumed, rc, tp_layout);
  resumed.load = at5;
  resumed.save = dir / "tp_resumed";
  const GptTrainSummary under_tp = pretrain_gpt(rc, resumed, {}, quiet());
  EXPECT_EQ(under_tp.start_iteration, 5);
  expect_same_logs(reference.logs, under_tp.logs, "a one-process checkpoint continued under TP");
}

INSTANTIATE_TEST_SUITE_P(, TensorParallelTraining, ::testing::Values("gpt2", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace
}  // namespace kiln::train
