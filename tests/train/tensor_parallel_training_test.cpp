// Tensor (and sequence) parallelism in `pretrain-gpt`'s loop (pretrain_gpt with process groups),
// under `mpirun -np 2` and `-np 4` (ctest train_tp_mpirun_2/4; alone, a world of one, the tests
// skip). Every rank also trains the one-process reference on the same global batches; each layout
// must give its losses and gradient norms over 10 AdamW steps with clipping, and the final weights
// (the checkpoint it writes, gathered into whole tensors):
//   2 ranks: TP2, TP2 + sequence parallelism;
//   4 ranks: TP4, TP4 + SP, TP2 x DP2 (+ SP, with the distributed optimizer);
// for a GPT-2 shape, a Llama shape (RoPE, RMSNorm, SwiGLU, GQA, untied, no biases) and a
// DeepSeek-V3 style one (multi-latent attention and an MTP depth, whose logged loss matches too). Checkpoints
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
#include "parallel_training_util.h"

namespace kiln::train {
namespace tensor_parallel_training_test {

namespace fs = std::filesystem;
using namespace parallel_testing;  // NOLINT(google-build-using-namespace): the shared helpers

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

models::GptConfig shape_named(const std::string& name) {
  return name == "gpt2" ? gpt2_shape() : name == "llama" ? llama_shape() : with_mla_mtp(llama_shape());
}

struct Layout {
  int tp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool tp_comm_overlap = false;
};

std::string layout_name(const Layout& l, int world) {
  return "tp" + std::to_string(l.tp) + "xdp" + std::to_string(world / l.tp) + (l.sequence_parallel ? "+sp" : "") +
         (l.distributed_optimizer ? "+zero1" : "") + (l.tp_comm_overlap ? "+tp-comm-overlap" : "");
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
  c.tp_comm_overlap = l.tp_comm_overlap;
}

class TensorParallelTraining : public ::testing::TestWithParam<std::string> {};  // the model's shape

TEST_P(TensorParallelTraining, EveryLayoutMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_tp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = shape_named(GetParam());

  // The reference: one process (each rank its own, in its own folder).
  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  ASSERT_EQ(reference.logs.size(), 10u);

  std::vector<Layout> layouts = {{world.size(), false, false}, {world.size(), true, false}};
  if (world.size() == 4) layouts.push_back({2, true, true});
  layouts.push_back({world.size(), true, false, true});  // --tp-comm-overlap
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
  const models::GptConfig shape = shape_named(GetParam());
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
  // ... continued by one process.
  const GptTrainSummary continued =
      continue_by_one_process(first.save, dir / ("tp_first_continued_" + mine), dir, shape);
  expect_same_logs(reference.logs, continued.logs, "a TP checkpoint continued by one process");

  // A one-process checkpoint at 5 (rank 0's reference, cut at 5) continued under TP.
  const fs::path at5 = single_checkpoint_at5(world, single.save, dir);
  GptTrainOptions resumed = options(dir);
  models::GptConfig rc = shape;
  join(resumed, rc, tp_layout);
  resumed.load = at5;
  resumed.save = dir / "tp_resumed";
  const GptTrainSummary under_tp = pretrain_gpt(rc, resumed, {}, quiet());
  EXPECT_EQ(under_tp.start_iteration, 5);
  expect_same_logs(reference.logs, under_tp.logs, "a one-process checkpoint continued under TP");
}

INSTANTIATE_TEST_SUITE_P(, TensorParallelTraining, ::testing::Values("gpt2", "llama", "mla_mtp"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace tensor_parallel_training_test
}  // namespace kiln::train
