// GptPipelineStage in one process: how the layers split over stages and model chunks (the flags'
// refusals), the stages' parameters are the whole model's (the same names and values; the tied
// copy equal to the word embeddings), and running the virtual stages in order, each on the
// previous one's output, gives the whole model's loss and gradients (dropout on: each layer draws
// its own masks, as in the whole model); DualPipe's two chunks per rank, one per direction.
#include "kiln/models/gpt_pipeline_stage.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kiln/models/gpt_model.h"
#include "kiln/runtime/error.h"
#include "small_configs.h"

namespace kiln::models {
namespace gpt_pipeline_stage_test {

Tensor ids(std::int64_t b, std::int64_t t, std::int64_t vocab, std::int64_t salt) {
  std::vector<std::int64_t> v(static_cast<std::size_t>(b * t));
  for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<std::int64_t>((i * 7 + 3 + salt * 13) % vocab);
  return Tensor::from_vector(v, {b, t});
}

using Ranges = std::vector<std::pair<std::int64_t, std::int64_t>>;

TEST(PipelineLayerRanges, EvenUnevenAndInterleavedSplits) {
  EXPECT_EQ(pipeline_layer_ranges(8, {.stages = 4}), (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));
  EXPECT_EQ(pipeline_layer_ranges(8, {.stages = 2, .layers_per_virtual_stage = 2}),
            (Ranges{{0, 2}, {2, 4}, {4, 6}, {6, 8}}));  // virtual stages c p + r: rank 0 holds [0,2) and [4,6)
  EXPECT_EQ(pipeline_layer_ranges(8, {.stages = 4, .first_stage_layers = 1, .last_stage_layers = 3}),
            (Ranges{{0, 1}, {1, 3}, {3, 5}, {5, 8}}));
  EXPECT_EQ(pipeline_layer_ranges(7, {.stages = 3, .first_stage_layers = 3}), (Ranges{{0, 3}, {3, 5}, {5, 7}}));
  EXPECT_EQ((PipelineSplit{.stages = 2, .layers_per_virtual_stage = 2}.chunks(8)), 2);
  EXPECT_THROW(pipeline_layer_ranges(6, {.stages = 4}), Error);                                 // not divisible
  EXPECT_THROW(pipeline_layer_ranges(8, {.stages = 2, .layers_per_virtual_stage = 3}), Error);  // chunks
  EXPECT_THROW(pipeline_layer_ranges(8, {.stages = 2, .layers_per_virtual_stage = 4}), Error);  // one chunk a rank
  EXPECT_THROW(pipeline_layer_ranges(8, {.stages = 4, .first_stage_layers = 3}), Error);        // 5 over 3 stages
}

// The whole model's loss and gradients against the stages run one after the other.
void expect_stages_match_whole(GptConfig c, const PipelineSplit& split) {
  const std::uint64_t seed = 5;
  GptModel whole(c, seed);
  whole.train();
  const Tensor tokens = ids(2, c.seq_length, c.vocab_size, 1), labels = ids(2, c.seq_length, c.vocab_size, 4);
  const Tensor loss = whole.loss(tokens, labels, Tensor());
  loss.backward();

  std::vector<std::shared_ptr<GptPipelineStage>> stages;
  for (int r = 0; r < split.stages; ++r) {
    stages.push_back(std::make_shared<GptPipelineStage>(c, seed, r, split));
    stages.back()->train();
  }
  // The stages' parameters: the whole model's, by name and value; the tied copy is the embeddings,
  // and with MTP the last stage's copy of the embedding holds the first stage's names.
  const TensorDict expected = whole.named_parameters();
  const auto whole_name = [](const GptPipelineStage& stage, const std::string& name) {
    return stage.tied_output_copy().defined() && name == GptPipelineStage::kTiedCopyName
               ? std::string("embedding.word_embeddings.weight")
               : name;
  };
  std::set<std::string> held;
  for (const auto& stage : stages)
    for (const auto& [name, p] : stage->named_parameters()) {
      const Tensor* w = expected.find(whole_name(*stage, name));
      ASSERT_NE(w, nullptr) << name;
      EXPECT_EQ(p.to_vector<float>(), w->to_vector<float>()) << name;
      held.insert(whole_name(*stage, name));
    }
  EXPECT_EQ(held.size(), expected.size());

  // Forward through the virtual stages in order; backward from the loss through them in reverse.
  const int p = split.stages, v = stages[0]->num_chunks();
  std::vector<Tensor> inputs, outputs;
  Tensor x;
  for (int s = 0; s < p * v; ++s) {
    GptPipelineStage& stage = *stages[static_cast<std::size_t>(s % p)];
    Tensor in = x.defined() ? x.detach().requires_grad_(true) : Tensor();
    Tensor out = stage.forward_chunk(s / p, in, tokens, labels, Tensor());
    inputs.push_back(in);
    outputs.push_back(out);
    x = out;
  }
  EXPECT_NEAR(outputs.back().item(), loss.item(), 1e-6 * std::abs(loss.item()));
  if (c.mtp_num_layers > 0) {  // each depth's loss, kept by the last stage
    const std::vector<float> depths = stages.back()->take_mtp_loss_sums().to_vector<float>();
    ASSERT_EQ(depths.size(), whole.mtp_losses().size());
    for (std::size_t k = 0; k < depths.size(); ++k)
      EXPECT_NEAR(depths[k], whole.mtp_losses()[k].item(), 1e-6 * std::abs(whole.mtp_losses()[k].item())) << k;
  }
  outputs.back().backward();
  for (int s = p * v - 2; s >= 0; --s)
    outputs[static_cast<std::size_t>(s)].backward(inputs[static_cast<std::size_t>(s + 1)].grad());
  // Gradients: a parameter held by two stages (the tied copy, MTP's copy of the embedding) gets the
  // sum of both copies' gradients (the embedding group's), which is the whole model's.
  std::map<std::string, std::vector<double>> grads;
  for (const auto& stage : stages)
    for (const auto& [name, param] : stage->named_parameters()) {
      const std::vector<float> g = param.grad().to_vector<float>();
      std::vector<double>& sum = grads[whole_name(*stage, name)];
      sum.resize(g.size(), 0.0);
      for (std::size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
  for (const auto& [name, got] : grads) {
    const std::vector<float> want = expected.find(name)->grad().to_vector<float>();
    ASSERT_EQ(got.size(), want.size()) << name;
    double worst = 0, scale = 1e-6;
    for (std::size_t i = 0; i < got.size(); ++i) {
      worst = std::max(worst, std::abs(got[i] - double(want[i])));
      scale = std::max(scale, std::abs(double(want[i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << name;
  }
}

TEST(GptPipelineStage, StagesInOrderGiveTheWholeModelsLossAndGradients) {
  GptConfig gpt2 = test_configs::small_gpt2();
  gpt2.num_layers = 4;
  gpt2.attention_dropout = 0.2;
  gpt2.hidden_dropout = 0.1;
  GptConfig llama = test_configs::small_llama();
  llama.num_layers = 4;
  for (const GptConfig& c : {gpt2, llama}) {
    expect_stages_match_whole(c, {.stages = 2});
    expect_stages_match_whole(c, {.stages = 4});
    expect_stages_match_whole(c, {.stages = 2, .layers_per_virtual_stage = 1});
    expect_stages_match_whole(c, {.stages = 2, .first_stage_layers = 1, .last_stage_layers = 3});
  }
}

// MTP: the last stage holds the depths and a copy of the embedding (tied: its word embeddings are the
// output layer's weight); the depths' losses and every gradient are the whole model's, the dropout
// masks of the copy the whole model's embedding's (the GPT-2 shape draws them).
TEST(GptPipelineStage, MtpOnTheLastStageGivesTheWholeModelsLossesAndGradients) {
  GptConfig gpt2 = test_configs::small_gpt2();             // LayerNorm, GELU, biases, tied output layer
  gpt2.position_embedding_type = PositionEmbedding::Rope;  // MTP takes no learned positions
  gpt2.num_layers = 4;
  gpt2.attention_dropout = 0.2;
  gpt2.hidden_dropout = 0.1;
  gpt2.mtp_num_layers = 2;
  gpt2.mtp_loss_scaling_factor = 0.3;
  GptConfig llama = test_configs::small_llama();  // RoPE, untied
  llama.num_layers = 4;
  llama.mtp_num_layers = 1;
  for (const GptConfig& c : {gpt2, llama}) {
    expect_stages_match_whole(c, {.stages = 2});
    expect_stages_match_whole(c, {.stages = 4});
    expect_stages_match_whole(c, {.stages = 2, .layers_per_virtual_stage = 1});
  }
}

// MoE: each stage's MoE layers attach their routers' aux and z losses to the stage's activations,
// so the stages' backwards together give the whole model's gradients (the losses' gradient scale is
// the process-wide one, 1 here); a stage without MoE layers (the uneven split's first) is fine.
TEST(GptPipelineStage, MoeStagesGiveTheWholeModelsLossAndGradients) {
  GptConfig c = test_configs::small_llama();
  c.num_layers = 4;
  c.num_experts = 4;
  c.moe_ffn_hidden_size = 16;
  c.moe_router_topk = 2;
  c.moe_aux_loss_coeff = 1e-2;
  c.moe_z_loss_coeff = 1e-3;
  c.moe_layer_pattern = {0, 1, 1, 1};
  expect_stages_match_whole(c, {.stages = 2});
  expect_stages_match_whole(c, {.stages = 2, .layers_per_virtual_stage = 1});
  expect_stages_match_whole(c, {.stages = 2, .first_stage_layers = 1, .last_stage_layers = 3});
}

// --recompute-granularity full: each model chunk recomputes its own layers (uniform chunks and the
// block's first layers counted from the chunk's first, as Megatron's pipeline ranks); the gradients
// are the whole model's (dropout on: the recompute replays each layer's masks).
TEST(GptPipelineStage, RecomputedStagesGiveTheWholeModelsLossAndGradients) {
  GptConfig c = test_configs::small_gpt2();
  c.num_layers = 4;
  c.attention_dropout = 0.2;
  c.hidden_dropout = 0.1;
  c.recompute_granularity = RecomputeGranularity::Full;
  for (const RecomputeMethod method : {RecomputeMethod::Uniform, RecomputeMethod::Block}) {
    c.recompute_method = method;
    c.recompute_num_layers = 1;
    expect_stages_match_whole(c, {.stages = 2});
    expect_stages_match_whole(c, {.stages = 2, .layers_per_virtual_stage = 1});
    c.recompute_num_layers = 2;
    expect_stages_match_whole(c, {.stages = 2, .first_stage_layers = 1, .last_stage_layers = 3});
  }
}

// DualPipe: rank r holds stage r as chunk 0 and a copy of stage p - 1 - r as chunk 1 (equal weights,
// the one-process names); direction 0 through the ranks' chunk 0 in order and direction 1 through
// their chunk 1 in reverse each give the whole model's loss; every parameter is in one chunk, and
// chunk 1's names on rank r are chunk 0's on rank p - 1 - r. Odd sizes, interleaving and MoE are
// refused naming the flag.
TEST(GptPipelineStage, DualPipeHoldsAStageAndACopyAndRunsBothDirections) {
  GptConfig gpt2 = test_configs::small_gpt2();
  gpt2.num_layers = 4;
  GptConfig llama = test_configs::small_llama();
  llama.num_layers = 4;
  for (const GptConfig& c : {gpt2, llama})
    for (int p : {2, 4}) {
      const std::uint64_t seed = 5;
      GptModel whole(c, seed);
      const Tensor tokens = ids(2, c.seq_length, c.vocab_size, 1), labels = ids(2, c.seq_length, c.vocab_size, 4);
      const double want = whole.loss(tokens, labels, Tensor()).item();
      const PipelineSplit split{.stages = p, .dualpipe = true};
      EXPECT_EQ(split.chunks(c.num_layers), 2);
      const Ranges ranges = pipeline_layer_ranges(c.num_layers, {.stages = p});
      std::vector<std::shared_ptr<GptPipelineStage>> stages;
      for (int r = 0; r < p; ++r) stages.push_back(std::make_shared<GptPipelineStage>(c, seed, r, split));
      const TensorDict expected = whole.named_parameters();
      std::vector<std::vector<std::string>> chunk_names(static_cast<std::size_t>(2 * p));
      for (int r = 0; r < p; ++r) {
        const GptPipelineStage& st = *stages[static_cast<std::size_t>(r)];
        ASSERT_EQ(st.num_chunks(), 2);
        EXPECT_EQ(st.layers_of_chunk(0), ranges[static_cast<std::size_t>(r)]);
        EXPECT_EQ(st.layers_of_chunk(1), ranges[static_cast<std::size_t>(p - 1 - r)]);
        EXPECT_EQ(st.is_first_virtual_stage(0), r == 0);
        EXPECT_EQ(st.is_last_virtual_stage(0), r == p - 1);
        EXPECT_EQ(st.is_first_virtual_stage(1), r == p - 1);
        EXPECT_EQ(st.is_last_virtual_stage(1), r == 0);
        for (const auto& [name, t] : st.named_parameters()) {
          EXPECT_NE(st.in_chunk(name, 0), st.in_chunk(name, 1)) << name << " on rank " << r;
          chunk_names[static_cast<std::size_t>(2 * r + (st.in_chunk(name, 0) ? 0 : 1))].push_back(name);
          const Tensor* w = expected.find(name == GptPipelineStage::kTiedCopyName && st.tied_output_copy().defined()
                                              ? std::string("embedding.word_embeddings.weight")
                                              : name);
          ASSERT_NE(w, nullptr) << name;
          EXPECT_EQ(t.to_vector<float>(), w->to_vector<float>()) << name;
        }
      }
      std::size_t originals = 0;
      for (int r = 0; r < p; ++r) {
        auto mine = chunk_names[static_cast<std::size_t>(2 * r + 1)];
        auto original = chunk_names[static_cast<std::size_t>(2 * (p - 1 - r))];
        std::sort(mine.begin(), mine.end());
        std::sort(original.begin(), original.end());
        EXPECT_EQ(mine, original) << "rank " << r << "'s copy";
        originals += original.size();
      }
      // The originals are the whole model (the tied copy besides, with tied embeddings).
      EXPECT_EQ(originals, expected.size() + (c.untie_embeddings_and_output_weights ? 0 : 1));
      for (int direction = 0; direction < 2; ++direction) {
        Tensor x;
        for (int k = 0; k < p; ++k) {
          GptPipelineStage& st = *stages[static_cast<std::size_t>(direction == 0 ? k : p - 1 - k)];
          x = st.forward_chunk(direction, x, tokens, labels, Tensor());
        }
        EXPECT_NEAR(x.item(), want, 1e-6 * std::abs(want)) << "direction " << direction << " p " << p;
      }
    }
  GptConfig c = test_configs::small_gpt2();
  c.num_layers = 6;
  EXPECT_THROW(GptPipelineStage(c, 1, 0, {.stages = 3, .dualpipe = true}), Error) << "odd p";
  c.num_layers = 4;
  EXPECT_THROW(GptPipelineStage(c, 1, 0, {.stages = 2, .layers_per_virtual_stage = 1, .dualpipe = true}), Error);
  GptConfig moe = test_configs::small_llama();
  moe.num_layers = 4;
  moe.num_experts = 4;
  moe.moe_ffn_hidden_size = 16;
  moe.moe_router_topk = 2;
  // MoE runs under DualPipe (train_dualpipe_mpirun_*, with and without expert parallelism).
  EXPECT_NO_THROW(GptPipelineStage(moe, 1, 0, {.stages = 2, .dualpipe = true}));
}

// MTP under DualPipe (both ends of the pipeline are last stages) is refused naming the flag.
TEST(GptPipelineStage, RefusesMtpUnderDualPipe) {
  GptConfig c = test_configs::small_llama();  // RoPE: a model MTP takes
  c.num_layers = 4;
  c.mtp_num_layers = 1;
  EXPECT_NO_THROW(GptPipelineStage(c, 1, 1, {.stages = 2}));
  try {
    GptPipelineStage(c, 1, 0, {.stages = 2, .dualpipe = true});
    ADD_FAILURE() << "MTP under DualPipe was not refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("--mtp-num-layers does not combine with --pipeline-schedule dualpipe"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace gpt_pipeline_stage_test
}  // namespace kiln::models
