// GptModel split over a tensor-parallel group, under `mpirun -np 2` and `-np 4` (ctest
// models_tp_mpirun_2/4; alone, a world of one, the tests skip): every rank builds the one-process
// model and the tensor-parallel one from the same seed, and
//   - the shards gathered are the one-process weights, exactly (the whole tensor drawn, then sliced);
//   - the loss (with a loss mask), the logits, and every parameter's gradient (shards gathered;
//     under sequence parallelism the replicated ones summed over the group, as training does) equal
//     the one-process values within float32 rounding;
// for a GPT-2 shape (learned positions, LayerNorm, GELU, biases, tied embeddings) and a Llama shape
// (RoPE, RMSNorm, SwiGLU, GQA, no biases, untied output layer), with and without sequence
// parallelism, with both --transformer-impl local and transformer_engine; and for multi-latent
// attention (Megatron's layout: the down projections and their norms whole on every rank, on its
// tokens, the up projections column-parallel by heads, linear_proj row-parallel) and multi-token
// prediction (the vocabulary-parallel embedding and loss, eh_proj column-parallel with its output
// gathered, a tensor-parallel transformer layer): also each MTP depth's loss.
// Tolerance: the ranks' partial products are summed in another order than one GEMM's: measured
// (2026-12-03) within 1.1e-6 relative (to the tensor's largest value for gradients and logits);
// asserted 2e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "kiln/autograd/functions.h"
#include "kiln/dist/process_groups.h"
#include "kiln/models/gpt_model.h"
#include "kiln/nn/layers.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"
#include "mla_configs.h"

namespace kiln::models {
namespace gpt_tensor_parallel_test {

constexpr double kTolerance = 2e-5;

GptConfig gpt2_shape() {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 8;
  c.vocab_size = 60;
  c.make_vocab_size_divisible_by = 16;  // 64: splits over 2 and 4 ranks
  c.attention_dropout = 0;
  c.hidden_dropout = 0;
  return c;
}

GptConfig llama_shape() {
  GptConfig c = gpt2_shape();
  c.position_embedding_type = PositionEmbedding::Rope;
  c.normalization = Normalization::RMSNorm;
  c.swiglu = true;
  c.ffn_hidden_size = 48;
  c.num_attention_heads = 8;
  c.num_query_groups = 4;  // GQA: two heads per group; whole groups on each of 2 or 4 ranks
  c.add_bias_linear = false;
  c.untie_embeddings_and_output_weights = true;
  return c;
}

// DeepSeek-V3 style in miniature (mla_configs.h) for 2 and 4 ranks: "mla" with query compression
// (the down projections and their norms whole on every rank), "mla_q_proj" without (linear_q_proj
// column-parallel), "mla_mtp" with its 2 MTP depths.
GptConfig mla_shape(const std::string& name) {
  GptConfig c = test_configs::small_mla_mtp();
  c.seq_length = 8;                     // splits over 2 and 4 ranks under sequence parallelism
  c.make_vocab_size_divisible_by = 16;  // 64
  if (name != "mla_mtp") c.mtp_num_layers = 0;
  if (name == "mla_q_proj") c.q_lora_rank = 0;
  return c;
}

GptConfig shape_named(const std::string& name) {
  if (name == "gpt2") return gpt2_shape();
  if (name == "llama") return llama_shape();
  if (name == "llama_mtp") {  // MTP beside standard attention: one depth
    GptConfig c = llama_shape();
    c.mtp_num_layers = 1;
    c.mtp_loss_scaling_factor = 0.5;
    return c;
  }
  return mla_shape(name);
}

double worst_difference(const Tensor& expected, const Tensor& got) {
  const auto a = expected.contiguous().to(DType::F32).to_vector<float>();
  const auto b = got.contiguous().to(DType::F32).to_vector<float>();
  EXPECT_EQ(a.size(), b.size());
  double worst = 0, scale = 0;
  for (std::size_t i = 0; i < a.size() && i < b.size(); ++i) {
    worst = std::max(worst, std::abs(double(a[i]) - double(b[i])));
    scale = std::max(scale, std::abs(double(a[i])));
  }
  return worst / std::max(scale, 1e-6);
}

struct Batch {
  Tensor tokens, labels, mask;
};

Batch batch(const GptConfig& c) {
  const std::int64_t b = 2, t = c.seq_length;
  std::vector<std::int64_t> tokens, labels;
  std::vector<float> mask;
  for (std::int64_t i = 0; i < b * t; ++i) {
    tokens.push_back((i * 37 + 11) % c.vocab_size);
    labels.push_back((i * 53 + 5) % c.vocab_size);
    mask.push_back(i % 5 == 3 ? 0.0f : 1.0f);  // some tokens do not count
  }
  return {Tensor::from_vector(tokens, {b, t}), Tensor::from_vector(labels, {b, t}), Tensor::from_vector(mask, {b, t})};
}

void check_against_one_process(GptConfig config, int tp, bool sequence_parallel, TransformerImpl impl,
                               bool tp_comm_overlap = false) {
  dist::Communicator world = dist::Communicator::world();
  const dist::ProcessGroups groups(world, {.tp = tp});
  config.transformer_impl = impl;
  GptModel reference(config, 42);
  config.tensor_model_parallel_size = tp;
  config.sequence_parallel = sequence_parallel;
  config.tp_comm_overlap = tp_comm_overlap;
  GptModel model(config, 42, &groups);
  const TensorParallelLayout layout = model.tensor_parallel_layout();
  const dist::Communicator& group = groups.tp();

  // The same initial weights, exactly.
  const TensorDict whole = reference.named_parameters();
  for (const auto& [name, p] : model.named_parameters()) {
    const Tensor* expected = whole.find(name);
    ASSERT_NE(expected, nullptr) << name;
    EXPECT_EQ(worst_difference(*expected, gather_whole(p, split_of(layout, name), group)), 0.0) << name;
  }

  double worst = 0;  // reported, for the tolerance's comment and docs/parallel.md
  const Batch b = batch(config);
  Tensor loss_ref = reference.loss(b.tokens, b.labels, b.mask);
  loss_ref.backward();
  Tensor loss = model.loss(b.tokens, b.labels, b.mask);
  loss.backward();
  EXPECT_NEAR(loss.item(), loss_ref.item(), kTolerance * std::abs(loss_ref.item())) << "loss";
  worst = std::abs(loss.item() - loss_ref.item()) / std::abs(loss_ref.item());
  // MTP: each depth's loss (the vocabulary-parallel cross-entropy of its predictions).
  ASSERT_EQ(model.mtp_losses().size(), static_cast<std::size_t>(config.mtp_num_layers));
  ASSERT_EQ(reference.mtp_losses().size(), model.mtp_losses().size());
  for (std::size_t k = 0; k < model.mtp_losses().size(); ++k) {
    const double want = reference.mtp_losses()[k].item(), got = model.mtp_losses()[k].item();
    EXPECT_NEAR(got, want, kTolerance * std::abs(want)) << "MTP depth " << k + 1 << " loss";
    worst = std::max(worst, std::abs(got - want) / std::abs(want));
  }

  for (const auto& [name, p] : model.named_parameters()) {
    const TensorParallelSplit split = split_of(layout, name);
    Tensor grad = p.grad().clone();
    if (split.sequence_parallel) dist::all_reduce(group, grad, dist::ReduceOp::Sum).wait();  // as training does
    const double d = worst_difference(whole.find(name)->grad(), gather_whole(grad, split, group));
    EXPECT_LE(d, kTolerance) << name << " gradient";
    worst = std::max(worst, d);
  }
  NoGradGuard no_grad;
  const double logits = worst_difference(reference.forward(b.tokens), model.forward(b.tokens));
  EXPECT_LE(logits, kTolerance) << "logits";
  worst = std::max(worst, logits);
  if (world.rank() == 0)
    std::printf("tp %d%s%s: worst relative difference from one process %.2e\n", tp, sequence_parallel ? " + sp" : "",
                tp_comm_overlap ? " + tp-comm-overlap" : "", worst);
}

struct Case {
  std::string shape;
  bool sequence_parallel;
  TransformerImpl impl;
  bool tp_comm_overlap = false;  // --tp-comm-overlap (tensor_parallel_overlap.h)
};

class GptTensorParallel : public ::testing::TestWithParam<Case> {};

TEST_P(GptTensorParallel, EqualsOneProcessFromTheSameSeed) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const Case& c = GetParam();
  const GptConfig config = shape_named(c.shape);
  check_against_one_process(config, world.size(), c.sequence_parallel, c.impl, c.tp_comm_overlap);
  if (world.size() == 4)  // tp2 x dp2 groups
    check_against_one_process(config, 2, c.sequence_parallel, c.impl, c.tp_comm_overlap);
}

INSTANTIATE_TEST_SUITE_P(
    , GptTensorParallel,
    ::testing::Values(
        Case{"gpt2", false, TransformerImpl::Local}, Case{"gpt2", true, TransformerImpl::Local},
        Case{"llama", false, TransformerImpl::Local}, Case{"llama", true, TransformerImpl::Local},
        Case{"gpt2", true, TransformerImpl::TransformerEngine}, Case{"llama", true, TransformerImpl::TransformerEngine},
        Case{"mla", false, TransformerImpl::Local}, Case{"mla", true, TransformerImpl::TransformerEngine},
        Case{"mla_q_proj", true, TransformerImpl::Local}, Case{"mla_mtp", false, TransformerImpl::TransformerEngine},
        Case{"mla_mtp", true, TransformerImpl::Local}, Case{"llama_mtp", true, TransformerImpl::TransformerEngine},
        Case{"gpt2", true, TransformerImpl::TransformerEngine, true}, Case{"llama", true, TransformerImpl::Local, true},
        Case{"mla", true, TransformerImpl::TransformerEngine, true}),
    [](const ::testing::TestParamInfo<Case>& p) {
      return p.param.shape + (p.param.sequence_parallel ? "_sp" : "") +
             (p.param.impl == TransformerImpl::Local ? "_local" : "_te") + (p.param.tp_comm_overlap ? "_overlap" : "");
    });

// Dropout inside the tensor-parallel region (and on the sequence slices) draws different masks on
// each rank; a checkpoint holds rank 0's streams, and after loading them every rank gets its own
// streams back (the ones it was built with).
TEST(GptTensorParallelDropout, StreamsDifferPerRankAndSurviveALoad) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const dist::ProcessGroups groups(world, {.tp = world.size()});
  GptConfig c = gpt2_shape();
  c.attention_dropout = c.hidden_dropout = 0.1;
  c.tensor_model_parallel_size = world.size();
  c.sequence_parallel = true;
  GptModel model(c, 42, &groups);
  std::map<std::string, std::shared_ptr<nn::Dropout>> dropouts;
  for (const auto& [name, m] : model.named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) dropouts[name] = d;
  ASSERT_FALSE(dropouts.empty());
  std::map<std::string, std::uint64_t> built;
  for (const auto& [name, d] : dropouts) {
    built[name] = d->seed;
    const auto bits = static_cast<std::int64_t>(d->seed);
    const std::int64_t low = world.all_reduce_value(bits, dist::ReduceOp::Min);
    const std::int64_t high = world.all_reduce_value(bits, dist::ReduceOp::Max);
    EXPECT_NE(low, high) << name << ": the ranks share a dropout stream";
    // A load gives every rank rank 0's seed ...
    d->seed = static_cast<std::uint64_t>(world.all_reduce_value(world.rank() == 0 ? bits : std::int64_t{0}));
  }
  // ... and the model gives each rank its own again.
  model.reseed_tensor_parallel_dropout();
  for (const auto& [name, d] : dropouts) EXPECT_EQ(d->seed, built[name]) << name;
}

TEST(GptTensorParallelConfig, RefusesWhatDoesNotSplit) {
  auto error_of = [](GptConfig c) {
    try {
      c.validate();
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  GptConfig c = gpt2_shape();
  c.tensor_model_parallel_size = 3;
  EXPECT_NE(error_of(c).find("--num-attention-heads (4) must be divisible by --tensor-model-parallel-size (3)"),
            std::string::npos);
  c = llama_shape();
  c.tensor_model_parallel_size = 8;
  c.num_attention_heads = 8;
  EXPECT_NE(error_of(c).find("the query groups (4, --num-query-groups or one per head) must be divisible by "
                             "--tensor-model-parallel-size (8)"),
            std::string::npos)
      << error_of(c);
  c = gpt2_shape();
  c.sequence_parallel = true;
  EXPECT_NE(error_of(c).find("--sequence-parallel splits the sequence over the tensor-parallel group: it needs "
                             "--tensor-model-parallel-size above 1 (it is 1)"),
            std::string::npos);
  c.tensor_model_parallel_size = 2;
  c.seq_length = 7;
  EXPECT_NE(error_of(c).find("--seq-length (7) must be divisible by --tensor-model-parallel-size (2)"),
            std::string::npos);
  c = gpt2_shape();
  c.tensor_model_parallel_size = 2;
  c.make_vocab_size_divisible_by = 1;
  c.vocab_size = 61;
  EXPECT_NE(error_of(c).find("the padded vocabulary (61"), std::string::npos);
  c = gpt2_shape();
  c.tensor_model_parallel_size = 2;
  c.ffn_hidden_size = 33;
  EXPECT_NE(error_of(c).find("--ffn-hidden-size (33) must be divisible by --tensor-model-parallel-size (2)"),
            std::string::npos);
  // A model whose group is not the configured size is refused (one process, --tensor-model-parallel-size 2).
  c = gpt2_shape();
  c.tensor_model_parallel_size = 2;
  try {
    GptModel m(c, 1);
    ADD_FAILURE() << "a tensor-parallel config without its group was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("--tensor-model-parallel-size is 2, but the tensor-parallel group has 1"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace gpt_tensor_parallel_test
}  // namespace kiln::models
