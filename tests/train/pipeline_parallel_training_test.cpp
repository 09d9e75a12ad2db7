// Pipeline parallelism in `pretrain-gpt`'s loop (pretrain_gpt with a pipeline group), under
// `mpirun -np 2` and `-np 4` (ctest train_pp_mpirun_2/4; alone, a world of one, the tests skip).
// Every rank also trains the one-process reference on the same global batches; each layout must
// give its losses, gradient norms and evaluation losses over 10 AdamW steps with clipping, and the
// final weights (the checkpoint it writes, gathered to whole tensors in the one-process format):
//   2 ranks: PP2 1F1B, PP2 interleaved (2 chunks per rank), PP2 with an uneven split (1 + 3 layers),
//            PP2 zero-bubble (ZB-H1: weight gradients deferred to their W passes);
//   4 ranks: PP4 1F1B, PP2 x DP2 with the distributed optimizer, PP2 x DP2 interleaved, TP2 x PP2
//            interleaved with sequence parallelism, PP4 zero-bubble, PP2 x DP2 zero-bubble with the
//            distributed optimizer, TP2 x PP2 zero-bubble with sequence parallelism, CP2 x PP2 1F1B
//            and interleaved (each stage holds the rank's two sequence chunks, attention over the ring);
//   8 ranks: TP2 x PP2 x DP2 interleaved, sequence parallel, with the distributed optimizer;
// and MLA on 2 and 4 ranks;
// for a GPT-2 shape (tied embeddings: the last stage's copy and the first stage's word embeddings
// get the sum of both gradients) and a Llama shape (RoPE, RMSNorm, SwiGLU, GQA, untied, no biases).
// Checkpoints are layout independent: a PP2 checkpoint at iteration 5 continued by one process, and
// a one-process checkpoint continued under PP2 interleaved (TP2 x PP2 + SP on 4 and 8 ranks), give the
// reference's iterations 6 to 10.
//
// Tolerance: as the tensor-parallel test's (2e-5 relative for losses and norms, absolute for the
// weights); the stages compute what one process computes, in the same order per layer, so the
// differences are those of the gradient norm's sum over the stages.
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
namespace pipeline_parallel_training_test {

namespace fs = std::filesystem;
using namespace parallel_testing;  // NOLINT(google-build-using-namespace): the shared helpers

// Dropout on where every layout is pipeline parallelism alone (2 ranks): each layer's masks come from
// its own stream, drawn for the micro-batches in the same order as in one process. Off with data
// parallelism, whose ranks draw for their own slices.
models::GptConfig gpt2_shape(bool dropout) {
  models::GptConfig c;
  c.num_layers = 4;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 16;
  c.vocab_size = testing::kVocab;
  c.make_vocab_size_divisible_by = 1;
  c.attention_dropout = dropout ? 0.1 : 0.0;
  c.hidden_dropout = dropout ? 0.1 : 0.0;
  return c;
}

models::GptConfig llama_shape(bool dropout) {
  models::GptConfig c = gpt2_shape(dropout);
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

struct Layout {
  int pp = 2;
  int tp = 1;  // tensor parallelism inside each stage
  int cp = 1;  // context parallelism inside each stage
  bool sequence_parallel = false;
  std::int64_t layers_per_chunk = 0;  // interleaved when > 0
  std::int64_t first_layers = 0, last_layers = 0;
  bool distributed_optimizer = false;
  bool zero_bubble = false;  // --pipeline-schedule zero-bubble
};

std::string layout_name(const Layout& l, int world) {
  return (l.tp > 1 ? "tp" + std::to_string(l.tp) + "x" : std::string()) +
         (l.cp > 1 ? "cp" + std::to_string(l.cp) + "x" : std::string()) + "pp" + std::to_string(l.pp) + "xdp" +
         std::to_string(world / l.pp / l.tp / l.cp) + (l.sequence_parallel ? "+sp" : "") +
         (l.layers_per_chunk > 0 ? "+interleaved" : "") +
         (l.first_layers > 0 ? "+first" + std::to_string(l.first_layers) : "") +
         (l.last_layers > 0 ? "+last" + std::to_string(l.last_layers) : "") +
         (l.distributed_optimizer ? "+zero1" : "") + (l.zero_bubble ? "+zb" : "");
}

// The run's groups on every rank of the world (collective).
void join(GptTrainOptions& o, models::GptConfig& c, const Layout& l) {
  auto groups = std::make_shared<const dist::ProcessGroups>(dist::Communicator::world(),
                                                            dist::ParallelSizes{.tp = l.tp, .pp = l.pp, .cp = l.cp});
  o.data_parallel = l.cp > 1 ? groups->dp() : groups->dp_cp();
  if (l.cp > 1) {
    o.context_parallel = groups->cp();
    o.data_context_parallel = groups->dp_cp();
  }
  c.context_parallel_size = l.cp;
  o.pipeline_parallel = groups->pp();
  if (l.tp > 1) o.tensor_parallel = groups->tp();
  c.tensor_model_parallel_size = l.tp;
  c.sequence_parallel = l.sequence_parallel;
  o.process_groups = groups;
  o.use_distributed_optimizer = l.distributed_optimizer;
  o.num_layers_per_virtual_pipeline_stage = l.layers_per_chunk;
  o.decoder_first_pipeline_num_layers = l.first_layers;
  o.decoder_last_pipeline_num_layers = l.last_layers;
  o.zero_bubble_schedule = l.zero_bubble;
}

class PipelineParallelTraining : public ::testing::TestWithParam<std::string> {};  // the model's shape

TEST_P(PipelineParallelTraining, EveryLayoutMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2, 4 or 8 (ctest: train_pp_mpirun_2/4/8)";
  const fs::path dir = shared_scratch(world);
  const bool dropout = world.size() == 2;
  const models::GptConfig shape = GetParam() == "gpt2" ? gpt2_shape(dropout) : llama_shape(dropout);

  GptTrainOptions single = options(dir);
  single.save = dir / ("single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  ASSERT_EQ(reference.logs.size(), 10u);

  std::vector<Layout> layouts;
  if (world.size() == 2) {
    layouts = {{.pp = 2},
               {.pp = 2, .layers_per_chunk = 1},
               {.pp = 2, .first_layers = 1, .last_layers = 3},
               {.pp = 2, .zero_bubble = true}};
  } else if (world.size() == 8) {
    layouts = {{.pp = 2, .tp = 2, .sequence_parallel = true, .layers_per_chunk = 1, .distributed_optimizer = true}};
  } else {
    layouts = {{.pp = 4},
               {.pp = 2, .distributed_optimizer = true},
               {.pp = 2, .layers_per_chunk = 1},
               {.pp = 2, .tp = 2, .sequence_parallel = true, .layers_per_chunk = 1},
               {.pp = 4, .zero_bubble = true},
               {.pp = 2, .distributed_optimizer = true, .zero_bubble = true},
               {.pp = 2, .tp = 2, .sequence_parallel = true, .zero_bubble = true},
               {.pp = 2, .cp = 2},
               {.pp = 2, .cp = 2, .layers_per_chunk = 1}};
  }
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
    if (world.rank() == 0) expect_same_checkpoint_weights(single.save, o.save, what);
    world.barrier();
  }
}

// Multi-head latent attention (DeepSeek's MLA: compressed queries and keys/values, decoupled RoPE)
// split over pipeline stages like any layer, with an MTP depth on the last stage (its copy of the
// embedding, untied here): PP2 1F1B and interleaved on 2 ranks, TP2 x PP2 with sequence parallelism
// and CP2 x PP2 on 4, against one process (the MTP depth's logged loss too).
TEST(PipelineParallelTrainingMla, EveryLayoutMatchesOneProcess) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() != 2 && world.size() != 4) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: train_pp_mpirun_2/4)";
  const fs::path dir = shared_scratch(world);
  const models::GptConfig shape = with_mla_mtp(llama_shape(false));
  GptTrainOptions single = options(dir);
  single.save = dir / ("mla_single_rank" + std::to_string(world.rank()));
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());
  std::vector<Layout> layouts = {{.pp = 2}, {.pp = 2, .layers_per_chunk = 1}};
  if (world.size() == 4) layouts = {{.pp = 2, .tp = 2, .sequence_parallel = true}, {.pp = 2, .cp = 2}};
  for (const Layout& l : layouts) {
    const std::string what = "mla_" + layout_name(l, world.size());
    GptTrainOptions o = options(dir);
    models::GptConfig c = shape;
    join(o, c, l);
    o.save = dir / what;
    const GptTrainSummary s = pretrain_gpt(c, o, {}, quiet());
    expect_same_logs(reference.logs, s.logs, what);
    if (world.rank() == 0) expect_same_checkpoint_weights(single.save, o.save, what);
    world.barrier();
  }
}

TEST_P(PipelineParallelTraining, CheckpointsLoadInAnotherLayout) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2, 4 or 8 (ctest: train_pp_mpirun_2/4/8)";
  const fs::path dir = shared_scratch(world);
  const bool dropout = world.size() == 2;
  const models::GptConfig shape = GetParam() == "gpt2" ? gpt2_shape(dropout) : llama_shape(dropout);
  const std::string mine = "rank" + std::to_string(world.rank());

  GptTrainOptions single = options(dir);
  single.save = dir / ("single_" + mine);
  single.save_interval = 5;
  const GptTrainSummary reference = pretrain_gpt(shape, single, {}, quiet());

  // PP2 stopped at 5 ...
  GptTrainOptions first = options(dir);
  models::GptConfig fc = shape;
  join(first, fc, Layout{.pp = 2});
  first.save = dir / "pp_first";
  first.exit_interval = 5;
  const GptTrainSummary stopped = pretrain_gpt(fc, first, {}, quiet());
  ASSERT_EQ(stopped.iterations, 5);
  // ... continued by one process.
  const GptTrainSummary continued =
      continue_by_one_process(first.save, dir / ("pp_first_continued_" + mine), dir, shape);
  expect_same_logs(reference.logs, continued.logs, "a PP2 checkpoint continued by one process");

  // A one-process checkpoint at 5 continued under PP2, interleaved.
  const fs::path at5 = single_checkpoint_at5(world, single.save, dir);
  GptTrainOptions resumed = options(dir);
  models::GptConfig rc = shape;
  // 4 ranks: TP2 x PP2 interleaved, sequence parallel.
  join(resumed, rc,
       world.size() >= 4 ? Layout{.pp = 2, .tp = 2, .sequence_parallel = true, .layers_per_chunk = 1}
                         : Layout{.pp = 2, .layers_per_chunk = 1});
  resumed.load = at5;
  resumed.save = dir / "pp_resumed";
  const GptTrainSummary under_pp = pretrain_gpt(rc, resumed, {}, quiet());
  EXPECT_EQ(under_pp.start_iteration, 5);
  expect_same_logs(reference.logs, under_pp.logs, "a one-process checkpoint continued under PP2 interleaved");
}

INSTANTIATE_TEST_SUITE_P(, PipelineParallelTraining, ::testing::Values("gpt2", "llama"),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

}  // namespace pipeline_parallel_training_test
}  // namespace kiln::train
