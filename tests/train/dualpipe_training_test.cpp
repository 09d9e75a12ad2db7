// DualPipe (`pretrain-gpt --pipeline-schedule dualpipe`) in pretrain-gpt's loop, under `mpirun -np 2`
// and `-np 4` (ctest train_dualpipe_mpirun_2/4; alone, a world of one, the tests skip). Every rank
// also trains the one-process reference and the same layout under 1F1B on the same global batches;
// DualPipe must give the reference's losses, gradient norms and evaluation losses over 10 AdamW steps
// with clipping, and its final weights (the checkpoint, one copy of each stage gathered to whole
// tensors) must be the reference's and 1F1B's; the two copies of every stage must end bit-identical
// (GptTrainSummary::dualpipe_copy_difference, measured over each pair of ranks after the run):
//   2 ranks: PP2 (rank 0 holds stage 0 and a copy of stage 1, rank 1 the other way round), PP2 with
//            --recompute-granularity full;
//   4 ranks: PP4, PP2 x DP2 with the distributed optimizer, PP2 x DP2 with --overlap-grad-reduce,
//            TP2 x PP2 with sequence parallelism; for the MoE shape also EP2 x PP2;
// for a GPT-2 shape (tied embeddings: ranks 0 and p - 1 each hold the word embeddings and their
// copy), a Llama shape (untied) and a Llama-shaped MoE (expert bias: the copies' routing counts summed). Checkpoints
// move: a DualPipe checkpoint at iteration 5 continued by one process, and a one-process checkpoint continued under
// DualPipe, give the reference's iterations 6 to 10. --rewind rolls an injected NaN and spike back as one process does
// (2 ranks). An odd number of micro-batches is refused naming the flags.
//
// Dropout is off: each copy of a stage draws its own masks, so DualPipe's masks are not one process's.
#include <gtest/gtest.h>

#include <string>

#include "kiln/dist/process_groups.h"
#include "kiln/runtime/error.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/gpt_pretrain.h"
#include "parallel_training_util.h"

namespace kiln::train {
namespace dualpipe_training_test {

namespace fs = std::filesystem;
using namespace parallel_testing;  // NOLINT(google-build-using-namespace): the shared helpers

models::GptConfig shape_of(const std::string& name) {
  models::GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = testing::kVocab;
  c.make_vocab_size_divisible_by = 1;
  c.attention_dropout = 0.0;
  c.hidden_dropout = 0.0;
  if (name == "llama" || name == "moe") {
    c.position_embedding_type = models::PositionEmbedding::Rope;
    c.normalization = models::Normalization::RMSNorm;
    c.swiglu = true;
    c.ffn_hidden_size = 48;
    c.num_attention_heads = 8;
    c.num_query_groups = 4;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
  }
  if (name == "moe") {
    // Layers 1-3 MoE: 4 experts top-2 with the aux and z losses and DeepSeek-V3's expert bias, so
    // the two copies of each MoE layer must sum their routing counts for the bias update.
    c.num_experts = 4;
    c.moe_ffn_hidden_size = 16;
    c.moe_router_topk = 2;
    c.moe_grouped_gemm = true;
    c.moe_aux_loss_coeff = 1e-2;
    c.moe_z_loss_coeff = 1e-3;
    c.moe_router_enable_expert_bias = true;
    c.moe_router_score_function = models::MoeRouterScore::Sigmoid;
    c.moe_router_bias_update_rate = 1e-2;
    c.moe_layer_pattern = {0, 1, 1, 1};
  }
  return c;
}

struct Layout {
  int pp = 2;
  int tp = 1;
  bool sequence_parallel = false;
  bool distributed_optimizer = false;
  bool overlap_grad_reduce = false;  // small buckets: several per stage
  bool recompute = false;            // --recompute-granularity full, one layer per chunk
  bool dualpipe = true;
  int ep = 1;  // MoE: the experts over the stage's expert-parallel group
};

std::string layout_name(const Layout& l, int world) {
  return (l.tp > 1 ? "tp" + std::to_string(l.tp) + "x" : std::string()) + "pp" + std::to_string(l.pp) + "xdp" +
         std::to_string(world / l.pp / l.tp) + (l.sequence_parallel ? "+sp" : "") +
         (l.distributed_optimizer ? "+zero1" : "") + (l.overlap_grad_reduce ? "+overlap" : "") +
         (l.recompute ? "+recompute" : "") + (l.ep > 1 ? "+ep" + std::to_string(l.ep) : "") +
         (l.dualpipe ? "+dualpipe" : "+1f1b");
}

// The run's groups on every rank of the world (collective).
void join(GptTrainOptions& o, models::GptConfig& c, const Layout& l) {
  auto groups = std::make_shared<const dist::ProcessGroups>(dist::Communicator::world(),
                                                            dist::ParallelSizes{.tp = l.tp, .pp = l.pp, .ep = l.ep});
  o.data_parallel = groups->dp_cp();
  o.pipeline_parallel = groups->pp();
  if (l.tp > 1) o.tensor_parallel = groups->tp();
  c.tensor_model_parallel_size = l.tp;
  c.sequence_parallel = l.sequence_parallel;
  c.expert_model_parallel_size = l.ep;
  o.process_groups = groups;
  o.use_distributed_optimizer = l.distributed_optimizer;
  o.dualpipe_schedule = l.dualpipe;
  o.overlap_grad_reduce = l.overlap_grad_reduce;
  if (l.overlap_grad_reduce) o.ddp_bucket_size = 2000;
  if (l.recompute) {
    c.recompute_granularity = models::RecomputeGranularity::Full;
    c.recompute_num_layers = 1;
  }
}

class DualPipeTraining : public ::testing::TestWithParam<std::string> {};  // the model's shape

TEST_P(DualPipeTraining, MatchesOneProcessAnd1F1B) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_dualpipe_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = shape_of(GetParam());

  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  ASSERT_EQ(reference.logs.size(), 10u);

  std::vector<Layout> layouts;
  if (world.size() == 2)
    layouts = {{.pp = 2}, {.pp = 2, .recompute = true}};
  else
    layouts = {{.pp = 4},
               {.pp = 2, .distributed_optimizer = true},
               {.pp = 2, .overlap_grad_reduce = true},
               {.pp = 2, .tp = 2, .sequence_parallel = true}};
  if (world.size() == 4 && GetParam() == "moe") layouts.push_back({.pp = 2, .ep = 2});  // EP2 x PP2
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
    EXPECT_EQ(s.dualpipe_copy_difference, 0.0) << what << ": the two copies of a stage drifted apart";

    // The same layout under 1F1B: the same weights (DualPipe only reorders the passes and splits the
    // micro-batches over two copies of each stage).
    Layout plain = l;
    plain.dualpipe = false;
    const std::string plain_what = layout_name(plain, world.size());
    GptTrainOptions po = options(dir);
    models::GptConfig pc = shape;
    join(po, pc, plain);
    po.save = dir / plain_what;
    const GptTrainSummary ps = pretrain_gpt(pc, po, {}, quiet());
    EXPECT_EQ(ps.dualpipe_copy_difference, 0.0);
    expect_same_logs(ps.logs, s.logs, what + " against " + plain_what);
    if (world.rank() == 0) {
      expect_same_checkpoint_weights(single.save, o.save, what);
      expect_same_checkpoint_weights(po.save, o.save, what + " against " + plain_what);
    }
    world.barrier();
  }
}

TEST_P(DualPipeTraining, CheckpointsMoveBetweenDualPipeAndOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (ctest: train_dualpipe_mpirun_2)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = shape_of(GetParam());
  const std::string mine = "rank" + std::to_string(world.rank());

  GptTrainOptions single = options(dir);
  single.save = dir / ("single_" + mine);
  single.save_interval = 5;
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());

  // DualPipe stopped at 5 (one copy of each stage saved) ...
  GptTrainOptions first = options(dir);
  models::GptConfig fc = shape;
  join(first, fc, Layout{});
  first.save = dir / "dualpipe_first";
  first.exit_interval = 5;
  const GptTrainSummary stopped = pretrain_gpt(fc, first, {}, quiet());
  ASSERT_EQ(stopped.iterations, 5);
  // ... continued by one process.
  const GptTrainSummary continued =
      continue_by_one_process(first.save, dir / ("dualpipe_first_continued_" + mine), dir, shape);
  expect_same_logs(reference.logs, continued.logs, "a DualPipe checkpoint continued by one process");

  // A one-process checkpoint at 5 continued under DualPipe: both copies of each stage load it.
  const fs::path at5 = single_checkpoint_at5(world, single.save, dir);
  GptTrainOptions resumed = options(dir);
  models::GptConfig rc = shape;
  join(resumed, rc, Layout{});
  resumed.load = at5;
  resumed.save = dir / "dualpipe_resumed";
  const GptTrainSummary under = pretrain_gpt(rc, resumed, {}, quiet());
  EXPECT_EQ(under.start_iteration, 5);
  expect_same_logs(reference.logs, under.logs, "a one-process checkpoint continued under DualPipe");
  EXPECT_EQ(under.dualpipe_copy_difference, 0.0);
}

// --rewind with an injected NaN and a loss spike (KILN_FAULT's plan: both ends' losses and their
// gradients multiplied): DualPipe rolls back at the same steps to the same snapshots, skips the same
// batches and ends with the one-process losses; the copies are equal after the restores.
TEST(DualPipeTrainingRewind, RollsBackAsOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (ctest: train_dualpipe_mpirun_2)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = shape_of("gpt2");
  GptTrainOptions base = options(dir);
  base.train_iters = 20;
  base.eval_iters = 0;
  base.log_interval = 5;
  base.rewind.enabled = true;
  base.rewind.snapshot_interval = 3;
  base.rewind.thresholds.min_history = 4;
  auto run = [&](GptTrainOptions o, const models::GptConfig& c) {
    set_fault_plan_for_testing("nan_loss@7,spike@14");
    GptTrainSummary s;
    try {
      s = pretrain_gpt(c, o, {}, quiet());
    } catch (...) {
      set_fault_plan_for_testing("");
      throw;
    }
    set_fault_plan_for_testing("");
    return s;
  };
  GptTrainOptions single = base;
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = run(single, shape);
  ASSERT_EQ(reference.rewinds.size(), 2u);
  GptTrainOptions o = base;
  models::GptConfig c = shape;
  join(o, c, Layout{});
  o.save = dir / "dualpipe_rewind";
  const GptTrainSummary s = run(o, c);
  ASSERT_EQ(s.rewinds.size(), reference.rewinds.size());
  for (std::size_t i = 0; i < s.rewinds.size(); ++i) {
    EXPECT_EQ(s.rewinds[i].step, reference.rewinds[i].step);
    EXPECT_EQ(s.rewinds[i].anomaly.kind, reference.rewinds[i].anomaly.kind);
    EXPECT_EQ(s.rewinds[i].restored_to, reference.rewinds[i].restored_to);
  }
  EXPECT_EQ(s.skipped_batches, reference.skipped_batches);
  expect_same_logs(reference.logs, s.logs, "DualPipe with --rewind");
  EXPECT_EQ(s.dualpipe_copy_difference, 0.0);
  if (world.rank() == 0) expect_same_checkpoint_weights(single.save, o.save, "DualPipe with --rewind");
}

TEST(DualPipeTrainingSizes, OddMicroBatchesAreRefusedNamingTheFlags) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2) GTEST_SKIP() << "runs under mpirun -np 2 (ctest: train_dualpipe_mpirun_2)";
  const fs::path dir = shared_scratch(world);
  GptTrainOptions o = options(dir);
  o.global_batch_size = 6;  // 3 micro-batches of 2
  models::GptConfig c = shape_of("gpt2");
  join(o, c, Layout{});
  o.save = dir / "odd";
  try {
    (void)pretrain_gpt(c, o, {}, quiet());
    ADD_FAILURE() << "3 micro-batches accepted";
  } catch (const Error& e) {
    const std::string message = e.what();
    EXPECT_NE(message.find("--pipeline-schedule dualpipe"), std::string::npos) << message;
    EXPECT_NE(message.find("--global-batch-size"), std::string::npos) << message;
    EXPECT_NE(message.find("is 3"), std::string::npos) << message;
  }
}

INSTANTIATE_TEST_SUITE_P(, DualPipeTraining, ::testing::Values("gpt2", "llama", "moe"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace dualpipe_training_test
}  // namespace kiln::train
