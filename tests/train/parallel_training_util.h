#pragma once
// What the parallel-layout training tests (tensor_, pipeline_, context_ and expert_parallel_training_test)
// share: a scratch folder every rank of the world sees, with the tinyshakespeare dataset; an MLA + MTP
// variant of a RoPE shape; the training options every layout runs (10 AdamW steps with clipping,
// evaluation every 5); silent callbacks; and the comparisons with the one-process run (logged losses,
// MTP depth losses and gradient norms, final checkpoint weights) within kTolerance.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "bigram_lm.h"
#include "kiln/dist/communicator.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/gpt_pretrain.h"

namespace kiln::train::parallel_testing {

namespace fs = std::filesystem;

// float32 sums in other orders (the tests print what they measured).
constexpr double kTolerance = 2e-5;

// One folder per test and world size; rank 0 makes it and the dataset, the others wait.
inline fs::path shared_scratch(const dist::Communicator& world) {
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

// DeepSeek-V3 style in miniature on a RoPE shape (the tests' Llama one): multi-latent attention with
// query compression (qk head 8 + RoPE 4 against value head 6, 4 heads) and one MTP depth.
inline models::GptConfig with_mla_mtp(models::GptConfig c) {
  c.num_attention_heads = 4;
  c.num_query_groups = 0;  // MLA's keys and values are per head
  c.multi_latent_attention = true;
  c.q_lora_rank = 12;
  c.kv_lora_rank = 10;
  c.qk_head_dim = 8;
  c.qk_pos_emb_head_dim = 4;
  c.v_head_dim = 6;
  c.mtp_num_layers = 1;
  c.mtp_loss_scaling_factor = 0.3;
  return c;
}

// Clipping on in most steps: the norm must count each parameter once, whatever the layout.
inline GptTrainOptions options(const fs::path& dir) {
  GptTrainOptions o;
  o.micro_batch_size = 2;
  o.global_batch_size = 8;
  o.train_iters = 10;
  o.lr = 3e-3;
  o.min_lr = 3e-4;
  o.lr_decay_style = "cosine";
  o.lr_warmup_iters = 2;
  o.weight_decay = 0.1;
  o.clip_grad = 0.5;
  o.data_path = {{1.0, (dir / "shakespeare_text_document").string()}};
  o.split = "90,10,0";
  o.eval_interval = 5;
  o.eval_iters = 1;
  o.log_interval = 1;
  o.progress = false;
  o.seed = 7;
  return o;
}

inline GptTrainCallbacks quiet() {
  GptTrainCallbacks c;
  c.message = [](const std::string&) {};
  return c;
}

// The one-process run's checkpoints (saved every 5 of 10 iterations) cut back to iteration 5 in a
// folder every rank sees: rank 0 copies them, every rank waits. What a layout resumes from.
inline fs::path single_checkpoint_at5(const dist::Communicator& world, const fs::path& single_save,
                                      const fs::path& dir) {
  world.barrier();
  const fs::path at5 = dir / "single_at5";
  if (world.rank() == 0) {
    fs::copy(single_save, at5, fs::copy_options::recursive);
    fs::remove_all(at5 / "iter_0000010");
    std::ofstream(at5 / "latest_checkpointed_iteration.txt") << "5";
  }
  world.barrier();
  return at5;
}

// A layout's checkpoint at 5 continued by one process, on this rank's own copy `copy` (so ranks do
// not write into one folder): the reference's iterations 6 to 10.
inline GptTrainSummary continue_by_one_process(const fs::path& saved, const fs::path& copy, const fs::path& dir,
                                               const models::GptConfig& shape) {
  fs::copy(saved, copy, fs::copy_options::recursive);
  GptTrainOptions alone = options(dir);
  alone.load = copy;
  alone.save = copy;
  const GptTrainSummary continued = pretrain_gpt(shape, alone, {}, quiet());
  EXPECT_EQ(continued.start_iteration, 5);
  return continued;
}

inline void expect_same_logs(const std::vector<GptLogRecord>& expected, const std::vector<GptLogRecord>& got,
                             const std::string& what, double tolerance = kTolerance) {
  ASSERT_FALSE(got.empty()) << what;
  std::size_t offset = 0;  // `got` may start later (a resumed run): compare from its first iteration
  while (offset < expected.size() && expected[offset].iteration != got[0].iteration) ++offset;
  ASSERT_EQ(expected.size() - offset, got.size()) << what;
  double worst = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const GptLogRecord &e = expected[offset + i], &g = got[i];
    EXPECT_EQ(e.iteration, g.iteration) << what;
    EXPECT_NEAR(e.loss, g.loss, tolerance * e.loss) << what << ", loss at iteration " << g.iteration;
    EXPECT_NEAR(e.grad_norm, g.grad_norm, tolerance * e.grad_norm) << what << ", grad norm at " << g.iteration;
    // MTP: each depth's logged loss.
    EXPECT_EQ(e.auxiliary_losses.size(), g.auxiliary_losses.size()) << what;
    for (std::size_t k = 0; k < std::min(e.auxiliary_losses.size(), g.auxiliary_losses.size()); ++k)
      EXPECT_NEAR(e.auxiliary_losses[k].second, g.auxiliary_losses[k].second, tolerance * e.auxiliary_losses[k].second)
          << what << ", " << e.auxiliary_losses[k].first << " at " << g.iteration;
    worst = std::max({worst, std::abs(e.loss - g.loss) / e.loss, std::abs(e.grad_norm - g.grad_norm) / e.grad_norm});
  }
  if (dist::Communicator::world().rank() == 0)
    std::printf("%s: worst relative difference of losses and gradient norms from one process %.2e\n", what.c_str(),
                worst);
}

inline void expect_same_checkpoint_weights(const fs::path& expected, const fs::path& got, const std::string& what,
                                           double tolerance = kTolerance) {
  const TensorDict a = read_gpt_checkpoint_weights(expected).model, b = read_gpt_checkpoint_weights(got).model;
  ASSERT_EQ(a.size(), b.size()) << what;
  double worst_weight = 0;
  for (const auto& [name, t] : a) {
    const Tensor* g = b.find(name);
    ASSERT_NE(g, nullptr) << what << ": " << name;
    ASSERT_EQ(t.shape(), g->shape()) << what << ": " << name;
    const auto x = t.contiguous().to(DType::F32).to_vector<float>(),
               y = g->contiguous().to(DType::F32).to_vector<float>();
    double worst = 0;
    // Absolute below 1, relative above (FP8 scales run into the hundreds).
    for (std::size_t i = 0; i < x.size(); ++i)
      worst = std::max(worst, std::abs(double(x[i]) - double(y[i])) / std::max(1.0, std::abs(double(x[i]))));
    EXPECT_LE(worst, tolerance) << what << ": " << name << " differs by " << worst;
    worst_weight = std::max(worst_weight, worst);
  }
  std::printf("%s: final weights differ from one process's by at most %.2e\n", what.c_str(), worst_weight);
}

}  // namespace kiln::train::parallel_testing
