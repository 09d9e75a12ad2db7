// The pretrain-gpt loop (train_language_model) on the CPU with a small real language model (an
// embedding, dropout, LayerNorm and an output projection: a bigram model), on bytes of
// tinyshakespeare: it learns, gradient accumulation equals the big batch, a resumed run continues
// bit-identically, and checkpoints of another shape, diverging losses and missing data are refused
// with messages that say what to do; the checkpoints are a CheckpointStore (a damaged newest one is
// passed over, --keep-last, --async-save), --rewind rolls injected NaNs and spikes back and ends
// where a clean run given the same skip list ends, and --finetune / --no-load-optim load the model
// only. The GPT itself is exercised by the CLI tests (tests/cli).
#include "kiln/train/gpt_trainer.h"

#include <gtest/gtest.h>

#include <cmath>
#include <csignal>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "bigram_lm.h"
#include "kiln/autograd/functions.h"
#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/nn/layers.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/optim/grad_buffers.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/checkpoint_store.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/gpt_checkpoint.h"

namespace kiln::train {
namespace gpt_trainer_test {

namespace fs = std::filesystem;
using testing::bigram;
using testing::BigramLm;
using testing::kVocab;
using testing::shakespeare_dataset;

fs::path scratch(const std::string& name) {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  fs::path dir = fs::path(KILN_BINARY_DIR) / "test_scratch" / "train" /
                 (std::string(info->test_suite_name()) + "." + info->name()) / name;
  fs::remove_all(dir);
  fs::create_directories(dir);
  return dir;
}

GptTrainOptions quick_options(const std::string& data) {
  GptTrainOptions o;
  o.micro_batch_size = 4;
  o.global_batch_size = 8;
  o.train_iters = 8;
  o.lr = 1e-2;
  o.min_lr = 1e-3;
  o.lr_decay_style = "cosine";
  o.lr_warmup_iters = 2;
  o.weight_decay = 0.1;
  o.data_path = {{1.0, data}};
  o.split = "90,10,0";
  o.eval_interval = 4;
  o.eval_iters = 1;
  o.log_interval = 2;
  o.progress = false;
  return o;
}

GptTrainCallbacks quiet() {
  GptTrainCallbacks c;
  c.message = [](const std::string&) {};
  return c;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(GptTrainer, LearnsShakespeareBigrams) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 60;
  o.log_interval = 10;
  o.eval_interval = 30;
  o.eval_iters = 2;
  o.save = dir / "checkpoints";
  o.tensorboard_dir = dir / "tb";
  auto summary = train_language_model(bigram(), o, quiet());
  ASSERT_EQ(summary.logs.size(), 6u);
  // Uniform guessing over 128 bytes is ln 128 = 4.85 nats; English byte bigrams are near 2.5.
  EXPECT_GT(summary.logs.front().loss, 3.5);
  EXPECT_LT(summary.logs.back().loss, 3.0) << "training loss after 60 iterations";
  ASSERT_FALSE(summary.evals.empty());
  EXPECT_LT(summary.evals.back().loss, 3.1) << "validation loss";
  EXPECT_NEAR(summary.evals.back().perplexity, std::exp(summary.evals.back().loss), 1e-9);
  for (const auto& r : summary.logs) {
    EXPECT_TRUE(std::isfinite(r.grad_norm) && r.grad_norm > 0);
    EXPECT_GT(r.tokens_per_second, 0);
    EXPECT_FALSE(r.mfu.has_value()) << "the CPU has no known peak: MFU is n/a";
  }
  EXPECT_EQ(summary.logs.back().consumed_samples, 60 * 8);
  // Megatron's layout, the log, the curve and TensorBoard's events.
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 60);
  EXPECT_TRUE(fs::exists(o.save / "iter_0000060" / "model.safetensors"));
  EXPECT_TRUE(fs::exists(o.save / "iter_0000060" / "optimizer.safetensors"));
  EXPECT_TRUE(fs::exists(o.save / "iter_0000060" / "checkpoint.json"));
  EXPECT_TRUE(fs::exists(o.save / "iter_0000060" / "manifest.json"));
  EXPECT_FALSE(CheckpointStore(o.save).verify(60).has_value()) << "every file matches its checksum";
  EXPECT_TRUE(fs::exists(o.save / "loss_curve.png"));
  std::ifstream log(o.save / "log.jsonl");
  int lines = 0;
  for (std::string line; std::getline(log, line);) {
    auto j = nlohmann::json::parse(line);
    EXPECT_TRUE(j.contains("iteration"));
    ++lines;
  }
  EXPECT_EQ(lines, 6 + 2 + 0 + 1) << "6 log lines, 2 evaluations (the test split is empty), 1 checkpoint save";
  bool events = false;
  for (const auto& e : fs::directory_iterator(o.tensorboard_dir))
    events = events || e.path().filename().string().starts_with("events.out.tfevents");
  EXPECT_TRUE(events);
}

TEST(GptTrainer, AccumulatedMicroBatchesEqualOneBigBatch) {
  const std::string data = shakespeare_dataset(scratch("data"));
  GptTrainOptions o = quick_options(data);
  o.eval_iters = 0;
  o.log_interval = 1;
  o.micro_batch_size = 8;
  auto big = train_language_model(bigram(32, 0.0), o, quiet());
  o.micro_batch_size = 2;  // four micro-batches accumulate
  auto accumulated = train_language_model(bigram(32, 0.0), o, quiet());
  ASSERT_EQ(big.logs.size(), accumulated.logs.size());
  for (std::size_t i = 0; i < big.logs.size(); ++i) {
    EXPECT_NEAR(big.logs[i].loss, accumulated.logs[i].loss, 2e-5 * big.logs[i].loss) << "iteration " << i + 1;
    EXPECT_NEAR(big.logs[i].grad_norm, accumulated.logs[i].grad_norm, 1e-4 * big.logs[i].grad_norm);
  }
}

TEST(GptTrainer, ResumedRunContinuesBitIdentically) {
  const fs::path dir = scratch("runs");
  const std::string data = shakespeare_dataset(dir);
  GptTrainOptions o = quick_options(data);
  o.train_iters = 10;
  o.save = dir / "straight";
  auto straight = train_language_model(bigram(), o, quiet());

  // Stopped at iteration 5 (inside a log window: lines come at 2, 4, 6, ...), then resumed.
  o.save = o.load = dir / "resumed";
  o.exit_interval = 5;
  auto first = train_language_model(bigram(), o, quiet());
  EXPECT_EQ(first.iterations, 5);
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 5);
  o.exit_interval = 0;
  // A model built from another seed: everything must come from the checkpoint.
  auto second = train_language_model(bigram(32, 0.1, 99), o, quiet());
  EXPECT_EQ(second.start_iteration, 5);

  std::vector<GptLogRecord> resumed = first.logs;
  resumed.insert(resumed.end(), second.logs.begin(), second.logs.end());
  ASSERT_EQ(straight.logs.size(), resumed.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(straight.logs[i].iteration, resumed[i].iteration);
    EXPECT_EQ(straight.logs[i].loss, resumed[i].loss) << "iteration " << resumed[i].iteration;
    EXPECT_EQ(straight.logs[i].grad_norm, resumed[i].grad_norm) << "iteration " << resumed[i].iteration;
    EXPECT_EQ(straight.logs[i].lr, resumed[i].lr);
    EXPECT_EQ(straight.logs[i].consumed_samples, resumed[i].consumed_samples);
  }
  ASSERT_FALSE(straight.evals.empty());
  EXPECT_EQ(straight.evals.back().loss, second.evals.back().loss);
  // The resumed run's log reads like the straight one's: iterations 2, 4, ..., 10 once each.
  std::ifstream log(o.save / "log.jsonl");
  std::vector<std::int64_t> logged;
  for (std::string line; std::getline(log, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains("lm_loss")) logged.push_back(j["iteration"]);
  }
  EXPECT_EQ(logged, (std::vector<std::int64_t>{2, 4, 6, 8, 10}));
}

TEST(GptTrainer, Bf16TrainsOnFp32MastersAndResumesBitIdentically) {
  const fs::path dir = scratch("runs");
  const std::string data = shakespeare_dataset(dir);
  GptTrainOptions o = quick_options(data);
  o.bf16 = true;
  o.train_iters = 6;
  o.eval_iters = 0;
  o.save = dir / "straight";
  auto straight = train_language_model(bigram(), o, quiet());
  ASSERT_EQ(straight.logs.size(), 3u);
  EXPECT_LT(straight.logs.back().loss, straight.logs.front().loss);
  // The checkpoint holds bf16 weights and the fp32 masters they are rounded from.
  const auto weights = read_gpt_checkpoint_weights(o.save);
  EXPECT_EQ(weights.model.find("output.weight")->dtype(), DType::BF16);

  o.save = o.load = dir / "resumed";
  o.exit_interval = 3;
  auto first = train_language_model(bigram(), o, quiet());
  o.exit_interval = 0;
  auto second = train_language_model(bigram(), o, quiet());
  std::vector<GptLogRecord> resumed = first.logs;
  resumed.insert(resumed.end(), second.logs.begin(), second.logs.end());
  ASSERT_EQ(resumed.size(), straight.logs.size());
  for (std::size_t i = 0; i < resumed.size(); ++i) {
    EXPECT_EQ(straight.logs[i].loss, resumed[i].loss) << "iteration " << resumed[i].iteration;
    EXPECT_EQ(straight.logs[i].grad_norm, resumed[i].grad_norm) << "iteration " << resumed[i].iteration;
  }
}

// --bf16 adds the linear's and the embedding's weight gradients into the fp32 buffers in their
// GEMM / scatter (gradient-accumulation fusion, on by default): the same training to bf16 rounding
// as --no-gradient-accumulation-fusion's bf16 gradients plus a pass, but not the same bits.
TEST(GptTrainer, Bf16GradientAccumulationFusionTrainsAsTheUnfusedPath) {
  const fs::path dir = scratch("runs");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.bf16 = true;
  o.train_iters = 6;
  o.eval_iters = 0;
  o.micro_batch_size = 2;
  o.global_batch_size = 4;  // two micro-batches: the second adds into what the first left
  ASSERT_TRUE(o.gradient_accumulation_fusion);
  const auto fused = train_language_model(bigram(32, 0.0), o, quiet());
  o.gradient_accumulation_fusion = false;
  const auto unfused = train_language_model(bigram(32, 0.0), o, quiet());
  ASSERT_EQ(fused.logs.size(), unfused.logs.size());
  bool any_difference = false;
  for (std::size_t i = 0; i < fused.logs.size(); ++i) {
    EXPECT_NEAR(fused.logs[i].loss, unfused.logs[i].loss, 2e-2 * unfused.logs[i].loss) << i;
    EXPECT_NEAR(fused.logs[i].grad_norm, unfused.logs[i].grad_norm, 5e-2 * unfused.logs[i].grad_norm) << i;
    any_difference = any_difference || fused.logs[i].grad_norm != unfused.logs[i].grad_norm;
  }
  EXPECT_TRUE(any_difference) << "the fused run's gradients equal the unfused run's bit for bit: fusion did not apply";
  EXPECT_LT(fused.logs.back().loss, fused.logs.front().loss);
}

TEST(GptTrainer, TrainSamplesGiveTheIterations) {
  GptTrainOptions o = quick_options(shakespeare_dataset(scratch("data")));
  o.train_iters = 0;
  o.train_samples = 44;  // 5 whole global batches of 8
  o.eval_iters = 0;
  o.lr_warmup_iters = 1;
  auto summary = train_language_model(bigram(), o, quiet());
  EXPECT_EQ(summary.iterations, 5);
  EXPECT_EQ(summary.logs.back().consumed_samples, 40);
}

TEST(GptTrainer, ACheckpointAtTheEndHasNothingLeftToTrain) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 4;
  o.eval_iters = 0;
  o.save = o.load = dir / "checkpoints";
  train_language_model(bigram(), o, quiet());
  std::string said;
  GptTrainCallbacks c;
  c.message = [&](const std::string& m) { said += m + "\n"; };
  auto again = train_language_model(bigram(), o, c);
  EXPECT_EQ(again.start_iteration, 4);
  EXPECT_TRUE(again.logs.empty());
  EXPECT_NE(said.find("nothing to train"), std::string::npos) << said;
}

TEST(GptTrainer, ASignalEndsTheRunWithACheckpoint) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.eval_iters = 0;
  o.save = dir / "checkpoints";
  o.exit_signal_handler = true;
  LanguageModelHandle h = bigram();
  auto calls = std::make_shared<int>(0);
  auto inner = h.loss;
  // A scheduler's SIGTERM arrives during iteration 3 (micro-batches 5 and 6).
  h.loss = [inner, calls](const Tensor& t, const Tensor& l, const Tensor& m) {
    if (++*calls == 5) std::raise(SIGTERM);
    return inner(t, l, m);
  };
  std::string said;
  GptTrainCallbacks c;
  c.message = [&](const std::string& m) { said += m + "\n"; };
  auto summary = train_language_model(h, o, c);
  EXPECT_EQ(summary.iterations, 3) << "the iteration in progress completes";
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 3);
  EXPECT_NE(said.find("exiting at iteration 3 (SIGTERM received, --exit-signal-handler)"), std::string::npos) << said;
}

TEST(GptCheckpoint, ASnapshotIsUntouchedByLaterSteps) {
  const fs::path dir = scratch("run");
  LanguageModelHandle h = bigram();
  auto& model = static_cast<BigramLm&>(*h.module);
  optim::GradBuffers buffers(model.parameters());
  optim::FlatAdamW optimizer(buffers);
  GptCheckpointState state;
  state.iteration = 7;
  GptCheckpointSnapshot snapshot = snapshot_gpt_checkpoint(model, optimizer, state);
  const float before = model.output->weight.flatten().slice(0, 0, 1).item();
  {
    NoGradGuard no_grad;
    model.output->weight.add_(Tensor::ones(model.output->weight.shape()));  // training goes on meanwhile
  }
  write_gpt_checkpoint(dir / "checkpoints", snapshot);
  const auto written = read_gpt_checkpoint_weights(dir / "checkpoints");
  EXPECT_EQ(written.iteration, 7);
  EXPECT_EQ(written.model.find("output.weight")->flatten().slice(0, 0, 1).item(), before);
}

TEST(GptTrainer, CheckpointOfAnotherShapeNamesTheFlagAndTheTensor) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 2;
  o.lr_warmup_iters = 0;
  o.eval_iters = 0;
  o.save = o.load = dir / "checkpoints";
  train_language_model(bigram(32), o, quiet());

  const std::string flag_error = error_of([&] { train_language_model(bigram(48), o, quiet()); });
  EXPECT_NE(flag_error.find("--hidden-size: 32 in the checkpoint, 48 in this run"), std::string::npos) << flag_error;

  LanguageModelHandle liar = bigram(48);
  liar.shape_flags = {{"--hidden-size", "32"}};  // flags that agree, tensors that do not
  const std::string tensor_error = error_of([&] { train_language_model(liar, o, quiet()); });
  EXPECT_NE(tensor_error.find("tensor 'embedding.weight' is [128, 32] there but [128, 48] in this model"),
            std::string::npos)
      << tensor_error;

  o.bf16 = true;  // the optimizer's state would not fit either: --bf16 is part of what must agree
  const std::string bf16_error = error_of([&] { train_language_model(bigram(32), o, quiet()); });
  EXPECT_NE(bf16_error.find("--bf16: false in the checkpoint, true in this run"), std::string::npos) << bf16_error;
}

TEST(GptTrainer, AKilledSaveLeavesThePreviousCheckpoint) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 4;
  o.eval_iters = 0;
  o.save = dir / "checkpoints";
  o.save_interval = 2;
  train_language_model(bigram(), o, quiet());
  ASSERT_EQ(latest_checkpoint_iteration(o.save), 4);
  // What a save killed half-way leaves: a partial folder of a process that is gone.
  const fs::path partial = o.save / "iter_0000006.partial.999999999";
  fs::create_directories(partial);
  std::ofstream(partial / "model.safetensors") << "half";
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 4);
  o.load = o.save;
  o.train_iters = 6;
  auto resumed = train_language_model(bigram(), o, quiet());
  EXPECT_EQ(resumed.start_iteration, 4);
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 6);
  EXPECT_FALSE(fs::exists(partial));
}

TEST(GptTrainer, NonFiniteLossNamesTheIterationAndWhatToDo) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.eval_iters = 0;
  o.save = dir / "checkpoints";
  o.save_interval = 2;
  LanguageModelHandle h = bigram();
  auto calls = std::make_shared<int>(0);
  auto inner = h.loss;
  // Fault injection: from the 7th micro-batch (iteration 4, two micro-batches each) the loss is NaN.
  h.loss = [inner, calls](const Tensor& t, const Tensor& l, const Tensor& m) {
    Tensor loss = inner(t, l, m);
    return ++*calls >= 7 ? loss * std::numeric_limits<double>::quiet_NaN() : loss;
  };
  const std::string error = error_of([&] { train_language_model(h, o, quiet()); });
  EXPECT_NE(error.find("not finite (NaN or inf) at iteration 4"), std::string::npos) << error;
  EXPECT_NE(error.find("The last checkpoint is iteration 2"), std::string::npos) << error;
  EXPECT_NE(error.find("Lower --lr"), std::string::npos) << error;
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 2) << "no checkpoint of the diverged model";
}

TEST(GptTrainer, MissingDataSaysHowToMakeIt) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options((dir / "nowhere_text_document").string());
  const std::string error = error_of([&] { train_language_model(bigram(), o, quiet()); });
  EXPECT_NE(error.find("nowhere_text_document.bin does not exist"), std::string::npos) << error;
  EXPECT_NE(error.find("kiln preprocess-data"), std::string::npos) << error;
}

TEST(GptTrainer, TruncatedDataSaysToRebuildIt) {
  const fs::path dir = scratch("run");
  const std::string prefix = shakespeare_dataset(dir);
  fs::resize_file(prefix + ".bin", fs::file_size(prefix + ".bin") / 2);
  const std::string error = error_of([&] { train_language_model(bigram(), quick_options(prefix), quiet()); });
  EXPECT_NE(error.find("run `kiln preprocess-data` again"), std::string::npos) << error;
}

TEST(GptTrainer, OptionErrorsNameTheFlag) {
  const std::string data = shakespeare_dataset(scratch("data"));
  auto error_for = [&](const std::function<void(GptTrainOptions&)>& edit) {
    GptTrainOptions o = quick_options(data);
    edit(o);
    return error_of([&] { train_language_model(bigram(), o, quiet()); });
  };
  EXPECT_NE(error_for([](auto& o) { o.global_batch_size = 6; }).find("--global-batch-size (6) must be a multiple"),
            std::string::npos);
  EXPECT_NE(error_for([](auto& o) { o.min_lr = 1; }).find("--min-lr"), std::string::npos);
  EXPECT_NE(error_for([](auto& o) { o.lr_decay_style = "WSD"; }).find("--lr-wsd-decay-iters"), std::string::npos);
  EXPECT_NE(error_for([](auto& o) { o.lr_warmup_iters = 20; }).find("--lr-decay-iters (8) must exceed"),
            std::string::npos);
  EXPECT_NE(error_for([](auto& o) { o.train_samples = 80; }).find("exactly one of --train-iters and --train-samples"),
            std::string::npos);
}

// Rewind options for the short runs below: snapshots every 3 iterations, spikes judged after 4
// good iterations (the defaults wait for 10).
RewindOptions quick_rewind() {
  RewindOptions r;
  r.enabled = true;
  r.snapshot_interval = 3;
  r.thresholds.min_history = 4;
  return r;
}

// Clears the fault plan when a test ends, failed or not.
struct FaultPlanScope {
  explicit FaultPlanScope(const std::string& spec) { set_fault_plan_for_testing(spec); }
  ~FaultPlanScope() { set_fault_plan_for_testing(""); }
};

TEST(GptTrainer, RewindOnNanAndSpikeEndsAsACleanRunThatSkipsTheSameBatches) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 20;
  o.eval_iters = 0;
  o.log_interval = 5;
  o.save = dir / "rewound";
  o.save_interval = 10;
  o.rewind = quick_rewind();
  GptTrainSummary rewound;
  std::string said;
  {
    FaultPlanScope faults("nan_loss@7,spike@14");
    GptTrainCallbacks c;
    c.message = [&](const std::string& m) { said += m + "\n"; };
    rewound = train_language_model(bigram(), o, c);
  }
  ASSERT_EQ(rewound.rewinds.size(), 2u) << said;
  EXPECT_EQ(rewound.rewinds[0].step, 7);
  EXPECT_EQ(rewound.rewinds[0].anomaly.kind, "nonfinite_loss");
  EXPECT_EQ(rewound.rewinds[0].restored_to, 6);
  EXPECT_EQ(rewound.rewinds[1].step, 14);
  EXPECT_EQ(rewound.rewinds[1].anomaly.kind, "loss_spike");
  EXPECT_EQ(rewound.rewinds[1].restored_to, 12);
  EXPECT_EQ(rewound.skipped_batches, (std::set<std::int64_t>{7, 14}));
  EXPECT_NE(said.find("rewind at iteration 7: nonfinite_loss"), std::string::npos) << said;
  EXPECT_TRUE(std::isfinite(rewound.final_loss));

  // The skip list is in the checkpoint; the log holds the events.
  std::ifstream index(o.save / "iter_0000020" / "checkpoint.json");
  EXPECT_EQ(nlohmann::json::parse(index).value("skipped_batches", ""), "7,14");
  std::ifstream log(o.save / "log.jsonl");
  std::string line;
  int rewind_lines = 0;
  while (std::getline(log, line)) rewind_lines += line.find("\"rewind\"") != std::string::npos;
  EXPECT_EQ(rewind_lines, 2);

  // A clean run told to skip the same global batches ends with the same loss, bit for bit.
  GptTrainOptions clean = o;
  clean.save = dir / "clean";
  clean.rewind = RewindOptions{};
  clean.skip_batches = {7, 14};
  const GptTrainSummary replay = train_language_model(bigram(), clean, quiet());
  EXPECT_TRUE(replay.rewinds.empty());
  EXPECT_EQ(replay.final_loss, rewound.final_loss);
  ASSERT_EQ(replay.logs.size(), rewound.logs.size());
  for (std::size_t i = 0; i < replay.logs.size(); ++i)
    EXPECT_EQ(replay.logs[i].loss, rewound.logs[i].loss) << "iteration " << replay.logs[i].iteration;
  // ... and skipping matters: a run that trains on every batch ends elsewhere.
  clean.skip_batches = {};
  clean.save = dir / "all";
  EXPECT_NE(train_language_model(bigram(), clean, quiet()).final_loss, rewound.final_loss);
}

TEST(GptTrainer, RewindsPastTheBudgetStopWithTheReport) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.train_iters = 12;
  o.eval_iters = 0;
  o.rewind = quick_rewind();
  o.rewind.max_rewinds = 1;
  FaultPlanScope faults("nan_loss@3,nan_loss@5");
  const std::string error = error_of([&] { train_language_model(bigram(), o, quiet()); });
  EXPECT_NE(error.find("step 3"), std::string::npos) << error;
  EXPECT_NE(error.find("step 5"), std::string::npos) << error;
}

TEST(GptTrainer, ADamagedNewestCheckpointIsPassedOverSayingWhy) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.eval_iters = 0;
  o.train_iters = 4;
  o.save = dir / "checkpoints";
  o.save_interval = 2;
  train_language_model(bigram(), o, quiet());
  EXPECT_FALSE(CheckpointStore(o.save).verify(4).has_value());
  {
    // Bit rot in the newest checkpoint's weights.
    const fs::path weights = o.save / "iter_0000004" / "model.safetensors";
    std::fstream f(weights, std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(fs::file_size(weights) - 3));
    f.put('\x7f');
  }
  o.load = o.save;
  o.train_iters = 6;
  std::string said;
  GptTrainCallbacks c;
  c.message = [&](const std::string& m) { said += m + "\n"; };
  const GptTrainSummary resumed = train_language_model(bigram(), o, c);
  EXPECT_EQ(resumed.start_iteration, 2) << said;
  EXPECT_NE(said.find("passed over iter_0000004: model.safetensors: crc32c"), std::string::npos) << said;
  EXPECT_EQ(resumed.iterations, 6);
}

TEST(GptTrainer, KeepLastAndAsyncSaveKeepTheNewestIntactCheckpoints) {
  const fs::path dir = scratch("run");
  const std::string data = shakespeare_dataset(dir);
  GptTrainOptions o = quick_options(data);
  o.eval_iters = 0;
  o.save = dir / "sync";
  o.save_interval = 2;
  const GptTrainSummary sync = train_language_model(bigram(), o, quiet());
  o.save = dir / "async";
  o.async_save = true;
  o.keep_last = 2;
  const GptTrainSummary async = train_language_model(bigram(), o, quiet());
  EXPECT_EQ(async.final_loss, sync.final_loss) << "saving in the background does not touch training";
  CheckpointStore store(o.save);
  EXPECT_EQ(store.iterations(), (std::vector<std::int64_t>{6, 8}));
  EXPECT_FALSE(store.verify(8).has_value());
  EXPECT_EQ(latest_checkpoint_iteration(o.save), 8);
  // Resuming the async run's iteration-6 checkpoint continues bit-identically.
  fs::remove_all(o.save / "iter_0000008");
  o.load = o.save;
  o.async_save = false;
  const GptTrainSummary resumed = train_language_model(bigram(), o, quiet());
  EXPECT_EQ(resumed.start_iteration, 6);
  EXPECT_EQ(resumed.final_loss, sync.final_loss);
}

TEST(GptTrainer, FinetuneLoadsTheModelOnlyAndNoLoadOptimKeepsTheIteration) {
  const fs::path dir = scratch("run");
  GptTrainOptions o = quick_options(shakespeare_dataset(dir));
  o.eval_iters = 0;
  o.train_iters = 4;
  o.save = dir / "pretrained";
  const GptTrainSummary pretrained = train_language_model(bigram(), o, quiet());
  GptTrainOptions f = o;
  f.load = o.save;
  f.save = dir / "finetuned";
  f.finetune = true;
  const GptTrainSummary finetuned = train_language_model(bigram(), f, quiet());
  EXPECT_EQ(finetuned.start_iteration, 0);
  EXPECT_EQ(finetuned.iterations, 4);
  // Trained on from the loaded weights: its first logged loss is below the fresh model's.
  EXPECT_LT(finetuned.logs.front().loss, pretrained.logs.front().loss);
  GptTrainOptions n = o;
  n.load = o.save;
  n.save = dir / "no_optim";
  n.no_load_optim = true;
  n.train_iters = 6;
  const GptTrainSummary continued = train_language_model(bigram(), n, quiet());
  EXPECT_EQ(continued.start_iteration, 4);
  EXPECT_EQ(continued.iterations, 6);
}

}  // namespace gpt_trainer_test
}  // namespace kiln::train
