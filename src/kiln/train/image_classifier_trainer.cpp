#include "kiln/train/image_classifier_trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/io/jsonl_writer.h"
#include "kiln/io/safetensors.h"
#include "kiln/io/stale_temporaries.h"
#include "kiln/io/tfevents_writer.h"
#include "kiln/io/training_curves.h"
#include "kiln/models/cifar_models.h"
#include "kiln/nn/graph_safe_random.h"
#include "kiln/nn/layers.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/elapsed.h"
#include "kiln/vision/image_augment.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "kiln/runtime/gpu_monitor.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/async_checkpoint_saver.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/checkpoint_store.h"
#include "kiln/train/cifar10_tensors.h"
#include "kiln/train/classifier_eval.h"
#include "kiln/train/fault_injection.h"
#include "kiln/train/nonfinite_guard.h"
#include "kiln/train/training_log.h"
#include "kiln/train/training_state.h"
#include "kiln/vision/seeded_random.h"

namespace kiln::train {

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<optim::Optimizer> make_optimizer(const ImageClassifierOptions& o, std::vector<Tensor> params) {
  if (o.optimizer == "adam") {
    optim::AdamOptions a;
    a.lr = o.lr;
    a.weight_decay = o.weight_decay;
    a.capturable = o.cuda_graph;
    return std::make_unique<optim::Adam>(std::move(params), a);
  }
  if (o.optimizer == "adamw") {
    optim::AdamOptions a = optim::AdamW::defaults();
    a.lr = o.lr;
    a.weight_decay = o.weight_decay;
    a.capturable = o.cuda_graph;
    return std::make_unique<optim::AdamW>(std::move(params), a);
  }
  if (o.optimizer == "sgd") {
    optim::SGDOptions s;
    s.lr = o.lr;
    s.momentum = o.momentum;
    s.weight_decay = o.weight_decay;
    s.capturable = o.cuda_graph;
    return std::make_unique<optim::SGD>(std::move(params), s);
  }
  KILN_FAIL("unknown optimizer '{}': expected adam, adamw or sgd", o.optimizer);
}

std::unique_ptr<optim::LRSchedule> make_schedule(const ImageClassifierOptions& o, std::int64_t total_steps) {
  if (o.lr_schedule == "constant") return std::make_unique<optim::ConstantLR>(o.lr);
  if (o.lr_schedule == "cosine") return std::make_unique<optim::CosineAnnealingLR>(o.lr, total_steps);
  if (o.lr_schedule == "step")
    return std::make_unique<optim::StepLR>(o.lr, std::max<std::int64_t>(total_steps / 3, 1), 0.1);
  KILN_FAIL("unknown lr schedule '{}': expected constant, cosine or step", o.lr_schedule);
}

std::string duration_text(double s) {
  const long long total = std::isfinite(s) && s > 0 ? static_cast<long long>(s + 0.5) : 0;
  return total >= 3600 ? fmt::format("{}h{:02}m{:02}s", total / 3600, total / 60 % 60, total % 60)
                       : fmt::format("{}m{:02}s", total / 60, total % 60);
}

// Where the in-epoch progress goes: a bar redrawn in place needs a terminal; anything else (a
// pipe, a file, CI) gets a plain line now and then, so a log shows that the run is alive.
enum class ProgressStyle { None, Bar, Lines };

ProgressStyle progress_style(const ImageClassifierOptions& o) {
  if (!o.progress) return ProgressStyle::None;
  return isatty(STDOUT_FILENO) && isatty(STDERR_FILENO) ? ProgressStyle::Bar : ProgressStyle::Lines;
}

struct StepProgress {
  int epoch, epochs;
  std::int64_t step, steps;  // steps done in the epoch, of `steps`
  double loss, accuracy, images_per_second, seconds;
  double seconds_left() const { return step > 0 ? seconds / static_cast<double>(step) * (steps - step) : 0; }
};

// [=====>    ] 312/781 loss 1.234 acc 55.1% 12345 img/s 0m38s left, redrawn in place on stderr.
void draw_progress_bar(const StepProgress& p) {
  constexpr int width = 30;
  int filled = static_cast<int>(width * p.step / std::max<std::int64_t>(p.steps, 1));
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(width, ' ');
  fmt::print(stderr, "\r  [{}] {}/{} loss {:.4f} acc {:.2f}% {:.0f} img/s {} left ", bar, p.step, p.steps, p.loss,
             p.accuracy * 100, p.images_per_second, duration_text(p.seconds_left()));
}

// One line on stdout for logs: "  epoch 2/10, step 312/781: loss ... 0m38s left in the epoch".
void print_progress_line(const StepProgress& p) {
  fmt::print("  epoch {}/{}, step {}/{}: loss {:.4f} acc {:.2f}% {:.0f} img/s, {} left in the epoch\n", p.epoch,
             p.epochs, p.step, p.steps, p.loss, p.accuracy * 100, p.images_per_second, duration_text(p.seconds_left()));
  std::fflush(stdout);
}

void check_options(const ImageClassifierOptions& o) {
  KILN_CHECK(o.epochs > 0 && o.epochs <= kMaxEpochs, "--epochs must be from 1 to {}, got {}", kMaxEpochs, o.epochs);
  KILN_CHECK(o.batch_size > 0, "--batch-size must be positive, got {}", o.batch_size);
  KILN_CHECK(o.eval_batch_size > 0, "the evaluation batch size must be positive, got {}", o.eval_batch_size);
  KILN_CHECK(std::isfinite(o.lr) && o.lr > 0, "--lr must be a positive number, got {}", o.lr);
  KILN_CHECK(std::isfinite(o.momentum) && o.momentum >= 0, "--momentum must be a number >= 0, got {}", o.momentum);
  KILN_CHECK(std::isfinite(o.weight_decay) && o.weight_decay >= 0, "--weight-decay must be a number >= 0, got {}",
             o.weight_decay);
  KILN_CHECK(o.limit_train >= 0, "--limit-train must be >= 0 (0: all images), got {}", o.limit_train);
  KILN_CHECK(o.limit_test >= 0, "--limit-test must be >= 0 (0: all images), got {}", o.limit_test);
  KILN_CHECK(std::isfinite(o.progress_seconds) && o.progress_seconds >= 0,
             "--progress-seconds must be a number >= 0, got {}", o.progress_seconds);
}

void say_removed(const std::vector<io::RemovedTemporary>& removed) {
  if (!removed.empty()) fmt::print("{}\n", io::describe_removed(removed));
}

// The epoch a best.safetensors holds, or nullopt when it is missing or unreadable.
std::optional<int> checkpoint_epoch(const std::filesystem::path& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return std::nullopt;
  try {
    auto meta = io::load_safetensors(path.string()).metadata;
    return training_state_from_metadata(meta, path).epoch;
  } catch (const Error&) {
    return std::nullopt;
  }
}

void write_curves(const std::filesystem::path& png, const std::vector<EpochReport>& epochs, const std::string& title) {
  io::TrainingHistory h;
  for (const auto& e : epochs) {
    h.train_loss.push_back(e.train_loss);
    h.val_loss.push_back(e.val_loss);
    h.train_accuracy.push_back(e.train_accuracy);
    h.val_accuracy.push_back(e.val_accuracy);
  }
  io::write_training_curves(png, h, title);
}

}  // namespace

namespace {

// The (seed, offset) of every Dropout, as JSON text (64-bit values as strings): what a resume or a
// rewind restores so the masks continue exactly where they were.
std::string random_state_json(nn::Module& model) {
  nlohmann::json j = nlohmann::json::object();
  for (const auto& [name, m] : model.named_modules())
    if (auto* d = dynamic_cast<nn::Dropout*>(m.get()))
      j[name] = {{"seed", std::to_string(d->seed)}, {"offset", std::to_string(d->offset)}};
  return j.dump();
}

void restore_random_state(nn::Module& model, const std::string& text, const std::filesystem::path& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
    for (const auto& [name, m] : model.named_modules()) {
      auto* d = dynamic_cast<nn::Dropout*>(m.get());
      if (!d) continue;
      KILN_CHECK(j.contains(name), "checkpoint {}: metadata 'random_state' has no entry for dropout '{}'",
                 source.string(), name);
      d->seed = std::stoull(j[name].at("seed").get<std::string>());
      d->offset = std::stoull(j[name].at("offset").get<std::string>());
    }
  } catch (const std::exception& e) {
    if (dynamic_cast<const Error*>(&e)) throw;
    KILN_FAIL("checkpoint {}: metadata 'random_state' is malformed: {}", source.string(), e.what());
  }
}

// The iteration folders in `dir` (without creating anything).
bool has_store_checkpoints(const std::filesystem::path& dir) {
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
    if (parse_iteration_dir(entry.path().filename().string())) return true;
  return false;
}

// The state a rewind rolls back to, on the host: weights, optimizer state, the epoch's loss and
// accuracy sums, the dropout positions and the detector's windows, after `position` steps.
struct MemorySnapshot {
  std::int64_t position = -1;
  TensorDict tensors;  // views of `arena`: one host block (pinned with a GPU), reused snapshot to snapshot
  PinnedBuffer arena;
  std::size_t arena_bytes = 0;
  std::string random_state;
  AnomalyDetector detector;
};

}  // namespace

TrainingSummary train_image_classifier(const ImageClassifierOptions& o,
                                       const std::function<void(const EpochReport&)>& on_epoch) {
  check_options(o);
  arm_faults_from_environment();
  if (o.rewind.enabled) check_rewind_options(o.rewind);
  KILN_CHECK(o.save_interval >= 0, "--save-interval must be >= 0 (0: no step checkpoints), got {}", o.save_interval);
  KILN_CHECK(o.keep_last >= 0, "--keep-last must be >= 0 (0: keep all), got {}", o.keep_last);
  const bool use_store = o.save_interval > 0 || o.async_save;
  KILN_CHECK(o.keep_last == 0 || use_store,
             "--keep-last applies to the step checkpoints: pass --save-interval N (or --async-save) too");
  const Device device = o.device;
  backend_for(device);  // fails early, naming the device, if it does not exist
  KILN_CHECK(!o.cuda_graph || device.is_cuda(), "--cuda-graph on needs a CUDA device, got {}", device.str());
  KILN_CHECK(!(o.cuda_graph && o.rewind.enabled),
             "--rewind needs --cuda-graph off: a rollback replaces the optimizer's state tensors that a captured "
             "graph points at");
#if !KILN_WITH_CUDA
  KILN_CHECK(!o.cuda_graph, "--cuda-graph on: this build has no CUDA");
#endif
  const auto checkpoints = o.out_dir / "checkpoints";
  const auto latest_path = checkpoints / "latest.safetensors";
  const auto best_path = checkpoints / "best.safetensors";
  // Before anything is read or written: a resume with nothing to resume from is a mistake (a
  // mistyped --out-dir, a deleted run), not a reason to start over over the old log and best.
  const bool store_present = has_store_checkpoints(checkpoints);
  KILN_CHECK(!o.resume || std::filesystem::exists(latest_path) || store_present,
             "--resume: there is no checkpoint to resume from in {} ({} does not exist, nor any iter_* folder); "
             "nothing was changed. Run without --resume to start a new run there",
             o.out_dir.string(), latest_path.string());
  for (const auto& dir : {o.out_dir, checkpoints, o.out_dir / "tensorboard"})
    say_removed(io::remove_stale_temporaries(dir));

  ImageSet train_set = load_cifar10(o.data_dir, true, device, o.limit_train, o.download);
  ImageSet test_set = load_cifar10(o.data_dir, false, device, o.limit_test, o.download);
  const std::int64_t n_train = train_set.images.shape()[0];
  KILN_CHECK(n_train >= o.batch_size, "the training set has {} images, fewer than one batch of {}", n_train,
             o.batch_size);

  manual_seed(o.seed);
  auto model = models::make_cifar_model(o.model);
  model->to(device);
  if (o.cuda_graph) nn::set_graph_safe_random(*model);  // dropout offsets advance on the device
  auto optimizer = make_optimizer(o, model->parameters());
  const std::int64_t steps_per_epoch = n_train / o.batch_size;  // drop_last: every step has a full batch
  auto schedule = make_schedule(o, steps_per_epoch * o.epochs);

  // The epoch's loss and correct-prediction sums stay on the device (no sync per step); one pair
  // for the whole run, zeroed per epoch, because a captured step adds into these very tensors.
  Tensor loss_sum = Tensor::zeros({}, DType::F32, device);
  Tensor correct = Tensor::zeros({}, DType::I64, device);

  std::optional<CheckpointStore> store;
  if (use_store || (o.resume && store_present))
    store.emplace(checkpoints, CheckpointStoreOptions{.keep_last = o.keep_last});
  std::set<std::int64_t> skipped = o.skip_batches;

  TrainingSummary summary;
  TrainingState state;
  state.normalization = o.normalization;
  int start_epoch = 1;
  std::int64_t start_step_in_epoch = 0;  // a mid-epoch store checkpoint resumes inside its epoch
  if (o.resume) {
    CheckpointMetadata meta;
    std::filesystem::path source = latest_path;
    std::optional<LoadedCheckpoint> loaded;
    if (store_present) {
      loaded = store->load_newest_intact();
      for (const auto& why : store->passed_over())
        fmt::print("checkpoint passed over: {} (in {})\n", why, checkpoints.string());
      if (!loaded)
        fmt::print("no intact checkpoint among the iter_* folders of {}{}\n", checkpoints.string(),
                   std::filesystem::exists(latest_path) ? fmt::format("; using {}", latest_path.string()) : "");
      // latest.safetensors written later (by a run without --save-interval) wins over an older store.
      if (loaded && std::filesystem::exists(latest_path)) {
        const std::optional<int> latest_epoch = checkpoint_epoch(latest_path);
        if (latest_epoch && static_cast<std::int64_t>(*latest_epoch) * steps_per_epoch > loaded->iteration)
          loaded.reset();
      }
    }
    if (loaded) {
      source = loaded->dir;
      meta = loaded->metadata;
      TensorDict all;
      for (const auto& [file, tensors] : loaded->files)
        for (const auto& [name, t] : tensors) all.insert(name, t);
      restore_checkpoint(source, all, meta, o.model, *model, o.reset_optimizer ? nullptr : optimizer.get());
      KILN_CHECK(meta.count("steps_per_epoch") && std::stoll(meta.at("steps_per_epoch")) == steps_per_epoch,
                 "--resume: {} was written with {} steps per epoch, this run has {} (--batch-size and "
                 "--limit-train must be as before)",
                 source.string(), meta.count("steps_per_epoch") ? meta.at("steps_per_epoch") : "an unknown number of",
                 steps_per_epoch);
      state = training_state_from_metadata(meta, source, 0);
      const std::int64_t position = loaded->iteration;
      KILN_CHECK(position / steps_per_epoch == state.epoch,
                 "checkpoint {}: iteration {} is in epoch {} but its metadata says {} epochs are complete",
                 source.string(), position, position / steps_per_epoch + 1, state.epoch);
      start_step_in_epoch = position % steps_per_epoch;
      if (start_step_in_epoch > 0) {
        ops::copy_into(loss_sum, all.at("train.loss_sum"));
        ops::copy_into(correct, all.at("train.correct"));
      }
      restore_random_state(*model, meta.at("random_state"), source);
      for (std::int64_t s : parse_skip_list(meta.at("skipped_batches"), source.string())) skipped.insert(s);
      fmt::print("resumed from {} (step {}, checksums verified){}\n", source.string(), position,
                 o.reset_optimizer ? fmt::format(" (optimizer state reset: {} starts afresh)", optimizer->name()) : "");
      std::fflush(stdout);  // in a log before anything else happens: a kill loses unflushed lines
    } else {
      meta = load_checkpoint(latest_path, o.model, *model, o.reset_optimizer ? nullptr : optimizer.get());
      state = training_state_from_metadata(meta, latest_path);
      // Written by this version: the skip list and the dropout positions (older files lack them).
      if (meta.count("skipped_batches"))
        for (std::int64_t s : parse_skip_list(meta.at("skipped_batches"), latest_path.string())) skipped.insert(s);
      if (meta.count("random_state")) restore_random_state(*model, meta.at("random_state"), latest_path);
      fmt::print("resumed from {} after epoch {}{}\n", latest_path.string(), state.epoch,
                 o.reset_optimizer ? fmt::format(" (optimizer state reset: {} starts afresh)", optimizer->name()) : "");
    }
    KILN_CHECK(state.normalization.empty() || state.normalization == o.normalization,
               "--resume: {} was trained with --normalization {}, this run asks for {}; pass --normalization {}",
               source.string(), state.normalization, o.normalization, state.normalization);
    state.normalization = o.normalization;
    start_epoch = state.epoch + 1;
    summary.epochs = state.history;
    summary.best_val_accuracy = state.best_val_accuracy;
    summary.best_epoch = state.best_epoch;
    if (state.epoch >= o.epochs)
      fmt::print("the checkpoint already holds {} epochs; nothing to train (pass --epochs above {} to go on)\n",
                 state.epoch, state.epoch);
    // latest is saved before best: a run stopped between the two leaves best one improvement
    // behind, and latest, holding that very epoch's weights, puts it right.
    const std::optional<int> best_holds = checkpoint_epoch(best_path);
    if (state.epoch > 0 && best_holds != state.best_epoch) {
      const std::string held = best_holds ? fmt::format("epoch {}", *best_holds) : "nothing readable";
      if (state.best_epoch == state.epoch && start_step_in_epoch == 0) {
        save_checkpoint(best_path, *model, nullptr, training_metadata(o.model, state));
        fmt::print(
            "repaired {}: it held {}, the best is epoch {} (the last run stopped between saving latest and "
            "best)\n",
            best_path.string(), held, state.best_epoch);
      } else {
        fmt::print(stderr,
                   "warning: {} holds {} but the best was epoch {}, whose weights are gone; it is replaced when an "
                   "epoch does better\n",
                   best_path.string(), held, state.best_epoch);
      }
    }
    const std::string log_change = reconcile_training_log(o.out_dir / "log.jsonl", state.history, o.model);
    if (!log_change.empty()) fmt::print("{}\n", log_change);
  }
  summary.skipped_batches = skipped;
  std::filesystem::create_directories(checkpoints);
  io::JsonlWriter log(o.out_dir / "log.jsonl",
                      o.resume ? io::JsonlWriter::Mode::Append : io::JsonlWriter::Mode::Truncate);
  io::TfEventsWriter events(o.out_dir / "tensorboard");
  // Rewinds and saves, one line each (the epoch log keeps one line per epoch).
  std::optional<io::JsonlWriter> event_log;
  if (use_store || o.rewind.enabled)
    event_log.emplace(o.out_dir / "events.jsonl",
                      o.resume ? io::JsonlWriter::Mode::Append : io::JsonlWriter::Mode::Truncate);
  std::optional<AsyncCheckpointSaver> saver;
  if (use_store) saver.emplace(*store, o.async_save);

  vision::AugmentParams augment = cifar10_normalization(o.normalization);
  if (o.augment) {
    augment.pad = 4;
    augment.flip = true;
  }
  augment.seed = o.seed;
  const ProgressStyle progress = progress_style(o);
  // Finds the first step whose loss or gradients are not finite, on the device; checked where the
  // host synchronises anyway (progress, end of epoch). Step k of the guard is the k-th step this
  // process trained. With --rewind, the per-step check below finds them instead (and rolls back).
  NonFiniteGuard guard(device);
  std::vector<std::int64_t> guard_steps;  // the global step of each guard record
  const std::vector<Tensor> params = model->parameters();
  auto stop_if_diverged = [&] {
    auto bad = guard.first_bad_step();
    if (!bad) return;
    const std::int64_t step = guard_steps.at(static_cast<std::size_t>(*bad - 1));
    const std::int64_t epoch = (step - 1) / steps_per_epoch + 1, batch = (step - 1) % steps_per_epoch + 1;
    if (progress == ProgressStyle::Bar) fmt::print(stderr, "\n");
    if (saver) saver->wait();
    KILN_FAIL(
        "training diverged at step {} (epoch {}, batch {} of {}): the loss or the gradients are not finite (NaN or "
        "inf). Nothing of epoch {} was saved; {}. Try a lower --lr, or --rewind to roll such steps back",
        step, epoch, batch, steps_per_epoch, epoch,
        store && !store->iterations().empty()
            ? fmt::format("{} holds step {} (continue from it with --resume)",
                          store->dir_of(store->iterations().back()).string(), store->iterations().back())
        : epoch > 1 ? fmt::format("{} holds epoch {} (continue from it with --resume)", latest_path.string(), epoch - 1)
                    : "no checkpoint was written");
  };
  auto run_start = Clock::now();

  // With --rewind: each trained step's loss and squared gradient norm land in a device ring; the
  // host reads the ring (one sync) only at snapshot points, before saves and at the epoch's end, and
  // judges the steps in order. A rewind goes back to the snapshot anyway, so checking later than
  // each step changes nothing but the syncs (and a few steps computed in vain after a bad one).
  const std::int64_t ring_size = o.rewind.snapshot_interval > 0 ? o.rewind.snapshot_interval : 1;
  Tensor loss_ring, grad_sq_ring, step_grad_sq;
  if (o.rewind.enabled) {
    loss_ring = Tensor::zeros({ring_size}, DType::F32, device);
    grad_sq_ring = Tensor::zeros({ring_size}, DType::F32, device);
    step_grad_sq = Tensor::zeros({}, DType::F32, device);
  }
  std::vector<std::int64_t> pending;  // the steps whose numbers are in the ring, in order
  // One training step on a batch; eager, or recorded once into the graph.
  auto train_step = [&](const Tensor& x, const Tensor& y, std::int64_t step) {
    Tensor logits;
    {
      AutocastGuard autocast(DType::BF16, o.amp_bf16);
      logits = model->forward(o.channels_last ? to_channels_last(x) : x);
    }
    logits = logits.to(DType::F32);
    Tensor loss = cross_entropy(logits, y);
    if (!o.cuda_graph)
      if (auto factor = loss_fault_factor(step)) loss = loss * *factor;
    optimizer->zero_grad();
    loss.backward();
    if (o.rewind.enabled) {
      NoGradGuard no_grad;
      std::vector<Tensor> grads;
      for (const Tensor& p : params)
        if (p.grad().defined()) grads.push_back(ops::contiguous(p.grad()));
      const auto slot = static_cast<std::int64_t>(pending.size());
      KILN_KERNEL(device, sum_of_squares)(grads, step_grad_sq);
      ops::copy_into(grad_sq_ring.slice(0, slot, slot + 1), step_grad_sq);
      ops::copy_into(loss_ring.slice(0, slot, slot + 1), loss.detach());
    } else {
      guard.record(loss, params);
    }
    optimizer->step();
    NoGradGuard no_grad;
    loss_sum.add_(loss.detach());
    correct.add_(sum(eq(argmax(logits.detach(), 1), y).to(DType::I64)));
  };
  // Graph mode: the batch is written into static tensors outside the graph (augmentation kernel,
  // label copy, lr write), then the captured step is replayed on them.
  Tensor x_static, y_static;
  if (o.cuda_graph) {
    x_static = Tensor::empty(
        {o.batch_size, train_set.images.shape()[1], train_set.images.shape()[2], train_set.images.shape()[3]},
        DType::F32, device);
    y_static = Tensor::empty({o.batch_size}, DType::I64, device);
  }
#if KILN_WITH_CUDA
  CudaGraph graph;
  int eager_steps = 0;  // graph mode: warm-up steps run so far
#endif

  // Everything a checkpoint or a snapshot holds, as live tensors.
  auto live_state = [&] {
    if (o.cuda_graph) nn::sync_random_offsets_from_device(*model);  // replays advanced them on the device
    TensorDict t;
    for (const auto& [name, v] : model->state_dict()) t.insert("model." + name, v);
    for (const auto& [name, v] : optimizer->state_dict()) t.insert("optimizer." + name, v);
    t.insert("train.loss_sum", loss_sum);
    t.insert("train.correct", correct);
    return t;
  };
  // A store checkpoint after `position` steps (state.epoch: the epochs complete by then).
  auto save_to_store = [&](std::int64_t position) {
    CheckpointContent c;
    c.iteration = position;
    TensorDict model_file, optimizer_file;
    for (const auto& [name, v] : live_state())
      (name.starts_with("model.") ? model_file : optimizer_file).insert(name, v);
    c.files = {{"model.safetensors", std::move(model_file)}, {"optimizer.safetensors", std::move(optimizer_file)}};
    c.metadata = training_metadata(o.model, state);
    c.metadata["steps_per_epoch"] = std::to_string(steps_per_epoch);
    c.metadata["batch_size"] = std::to_string(o.batch_size);
    c.metadata["random_state"] = random_state_json(*model);
    c.metadata["skipped_batches"] = skip_list_text(skipped);
    const SaveStall stall = saver->save(c);
    CheckpointStats& st = summary.checkpoints;
    ++st.saves;
    st.stall_seconds += stall.total();
    st.max_stall_seconds = std::max(st.max_stall_seconds, stall.total());
    st.write_seconds += o.async_save ? saver->last_write_seconds() : stall.write_seconds;
    if (progress == ProgressStyle::Bar) fmt::print(stderr, "\r{:110}\r", "");
    fmt::print("checkpoint {} ({:.1f} MB): the step waited {:.2f} ms{}\n", store->dir_of(position).filename().string(),
               static_cast<double>(stall.bytes) / 1e6, stall.total() * 1e3,
               o.async_save ? fmt::format(" ({:.2f} ms for the previous save, {:.2f} ms host copy); written in the "
                                          "background",
                                          stall.wait_seconds * 1e3, stall.copy_seconds * 1e3)
                            : " (written synchronously)");
    std::fflush(stdout);
    event_log->write({{"event", "checkpoint"},
                      {"iteration", position},
                      {"async", o.async_save},
                      {"stall_seconds", stall.total()},
                      {"wait_seconds", stall.wait_seconds},
                      {"copy_seconds", stall.copy_seconds},
                      {"bytes", stall.bytes}});
    events.add_scalar("checkpoint/stall_ms", static_cast<float>(stall.total() * 1e3), position);
  };

  std::optional<RewindPolicy> policy;
  if (o.rewind.enabled) policy.emplace(o.rewind);
  AnomalyDetector detector(o.rewind.thresholds);
  MemorySnapshot snapshot;
  auto take_snapshot = [&](std::int64_t position) {
    snapshot.position = position;
    CheckpointContent live;
    live.files = {{"state", live_state()}};
    snapshot.tensors = copy_to_host_arena(live, snapshot.arena, snapshot.arena_bytes).files.front().second;
    snapshot.random_state = random_state_json(*model);
    snapshot.detector = detector;
  };
  // Rolls back to the snapshot (else the newest store checkpoint of this epoch); returns its position.
  auto roll_back = [&](std::int64_t epoch_start, std::string& source) -> std::int64_t {
    if (snapshot.position >= epoch_start) {
      // Loaded without restore_checkpoint's completeness checks: a snapshot taken before the first
      // step holds no optimizer moments, and restoring it rightly clears them.
      TensorDict model_state, optimizer_state;
      for (const auto& [name, t] : snapshot.tensors) {
        if (name.starts_with("model.")) model_state.insert(name.substr(6), t);
        if (name.starts_with("optimizer.")) optimizer_state.insert(name.substr(10), t);
      }
      model->load_state_dict(model_state, /*strict=*/true);
      optimizer->load_state_dict(optimizer_state);
      ops::copy_into(loss_sum, snapshot.tensors.at("train.loss_sum"));
      ops::copy_into(correct, snapshot.tensors.at("train.correct"));
      restore_random_state(*model, snapshot.random_state, "the rewind snapshot");
      detector = snapshot.detector;
      source = "memory snapshot";
      return snapshot.position;
    }
    std::optional<LoadedCheckpoint> c;
    if (store) {
      saver->wait();
      c = store->load_newest_intact();
    }
    KILN_CHECK(c && c->iteration >= epoch_start,
               "--rewind: no state to roll back to within this epoch (no snapshot: --rewind-snapshot-interval is 0, "
               "and no store checkpoint since step {}); pass --rewind-snapshot-interval N",
               epoch_start);
    TensorDict all;
    for (const auto& [file, tensors] : c->files)
      for (const auto& [name, t] : tensors) all.insert(name, t);
    restore_checkpoint(c->dir, all, c->metadata, o.model, *model, optimizer.get());
    if (c->iteration > epoch_start) {
      ops::copy_into(loss_sum, all.at("train.loss_sum"));
      ops::copy_into(correct, all.at("train.correct"));
    } else {
      loss_sum.zero_();
      correct.zero_();
    }
    restore_random_state(*model, c->metadata.at("random_state"), c->dir);
    source = c->dir.string();
    return c->iteration;
  };

  // Judges the pending steps in order; on an anomaly rolls back and returns the step restored to.
  auto verify_pending = [&](std::int64_t epoch_start) -> std::optional<std::int64_t> {
    if (!policy || pending.empty()) return std::nullopt;
    const std::vector<float> losses = loss_ring.to_vector<float>(), grad_sqs = grad_sq_ring.to_vector<float>();
    const std::vector<std::int64_t> steps = std::exchange(pending, {});
    for (std::size_t i = 0; i < steps.size(); ++i) {
      const double loss_value = losses[i], grad_norm = std::sqrt(static_cast<double>(grad_sqs[i]));
      auto anomaly = detector.check(loss_value, grad_norm);
      if (!anomaly) {
        detector.accept(loss_value, grad_norm);
        continue;
      }
      const std::int64_t step = steps[i];
      RewindEvent e{step, *anomaly, loss_value, grad_norm, 0, ""};
      e.restored_to = roll_back(epoch_start, e.source);
      skipped.insert(step);
      summary.skipped_batches = skipped;
      summary.rewinds.push_back(e);
      if (progress == ProgressStyle::Bar) fmt::print(stderr, "\n");
      fmt::print(
          "rewind at step {} (epoch {}, batch {}): {}: {}; rolled back to step {} ({}); batch {} is skipped from "
          "now on{}\n",
          step, (step - 1) / steps_per_epoch + 1, (step - 1) % steps_per_epoch + 1, anomaly->kind, anomaly->detail,
          e.restored_to, e.source, step,
          o.rewind.lr_steps > 0 && o.rewind.lr_factor < 1
              ? fmt::format("; lr x{} for {} steps", o.rewind.lr_factor, o.rewind.lr_steps)
              : "");
      std::fflush(stdout);
      event_log->write(rewind_event_json(e));
      events.add_scalar("rewind/count", static_cast<float>(summary.rewinds.size()), step);
      policy->record(e);  // throws the report past the budget
      return e.restored_to;
    }
    return std::nullopt;
  };

  for (int epoch = start_epoch; epoch <= o.epochs; ++epoch) {
    model->train();
    backend_for(device).reset_peak_memory(device.index);
    auto epoch_start = Clock::now();
    const std::int64_t first_step = static_cast<std::int64_t>(epoch - 1) * steps_per_epoch;  // steps before it
    // The epoch's order: a seeded shuffle, uploaded once; labels gathered in that order once.
    auto order = vision::shuffled_indices(n_train, o.seed, epoch);
    Tensor perm = Tensor::from_vector(order, {n_train}, device);
    Tensor labels = index_select(train_set.labels, 0, perm);
    const std::int64_t s0 = epoch == start_epoch ? start_step_in_epoch : 0;
    if (s0 == 0) {
      loss_sum.zero_();
      correct.zero_();
    }
    auto last_draw = Clock::now();
    // s == steps_per_epoch is a last pass that only judges the epoch's pending steps.
    for (std::int64_t s = s0; s <= steps_per_epoch; ++s) {
      const std::int64_t global_step = first_step + s;  // steps done before this one
      const std::int64_t step = global_step + 1;        // this step's number (1-based), its checkpoint's iteration
      if (saver) saver->check();
      if (policy && (s == steps_per_epoch || policy->snapshot_due(global_step) ||
                     static_cast<std::int64_t>(pending.size()) == ring_size)) {
        if (auto back = verify_pending(first_step)) {
          s = *back - first_step - 1;  // the loop's ++s continues after the restored step
          continue;
        }
      }
      if (s == steps_per_epoch) break;
      if (policy && (s == s0 || policy->snapshot_due(global_step))) take_snapshot(global_step);
      if (skipped.contains(step)) continue;
      crash_if_planned(step);
      // capturable: a device write, before replay
      optimizer->set_lr(schedule->get_lr(global_step) * (policy ? policy->lr_scale(step) : 1.0));
      Tensor idx = perm.slice(0, s * o.batch_size, (s + 1) * o.batch_size);
      augment.offset = static_cast<std::uint64_t>(global_step) * static_cast<std::uint64_t>(o.batch_size);
      Tensor y = labels.slice(0, s * o.batch_size, (s + 1) * o.batch_size);
      if (!o.cuda_graph) {
        train_step(vision::augment_images(train_set.images, idx, augment), y, step);
      } else {
#if KILN_WITH_CUDA
        vision::augment_images_into(x_static, train_set.images, idx, augment);
        ops::copy_into(y_static, y);
        if (graph.captured()) {
          graph.replay();
        } else if (eager_steps < kGraphWarmupSteps) {
          train_step(x_static, y_static, step);
          ++eager_steps;
        } else {
          graph.capture_begin(device);
          train_step(x_static, y_static, step);  // recorded, not run
          graph.capture_end();
          graph.replay();
        }
#endif
      }
      if (policy)
        pending.push_back(step);
      else
        guard_steps.push_back(step);
      if (store && use_store && o.save_interval > 0 && step % o.save_interval == 0 && s + 1 < steps_per_epoch) {
        if (auto back = verify_pending(first_step)) {  // never a checkpoint of a step gone wrong
          s = *back - first_step - 1;
          continue;
        }
        state.epoch = epoch - 1;
        save_to_store(step);
      }
      const double since_draw = seconds_since(last_draw);
      const bool last = s + 1 == steps_per_epoch;
      if ((progress == ProgressStyle::Bar && (since_draw > 0.5 || last)) ||
          (progress == ProgressStyle::Lines && since_draw >= o.progress_seconds && !last)) {
        last_draw = Clock::now();
        const double done = static_cast<double>((s + 1) * o.batch_size), elapsed = seconds_since(epoch_start);
        StepProgress p{epoch,
                       o.epochs,
                       s + 1,
                       steps_per_epoch,
                       loss_sum.item() / static_cast<double>(s + 1),
                       correct.item() / done,
                       done / elapsed,
                       elapsed};
        stop_if_diverged();
        if (progress == ProgressStyle::Bar)
          draw_progress_bar(p);
        else
          print_progress_line(p);
      }
    }
    synchronize(device);
    stop_if_diverged();
    // Skipped batches are not in the epoch's averages.
    std::int64_t trained = steps_per_epoch;
    for (std::int64_t k = first_step + 1; k <= first_step + steps_per_epoch; ++k) trained -= skipped.contains(k);
    KILN_CHECK(trained > 0, "every batch of epoch {} was skipped ({}): nothing was trained", epoch,
               skip_list_text(skipped));
    const std::int64_t samples_trained = trained * o.batch_size;
    EpochReport r;
    r.epoch = epoch;
    r.seconds = seconds_since(epoch_start);
    r.images_per_second = static_cast<double>(samples_trained) / r.seconds;
    r.train_loss = loss_sum.item() / static_cast<double>(trained);
    r.train_accuracy = correct.item() / static_cast<double>(samples_trained);
    r.lr = optimizer->lr();
    auto stats = backend_for(device).memory_stats(device.index);
    r.peak_memory_bytes = stats.peak_allocated;
    r.reserved_memory_bytes = stats.reserved;
    if (device.is_cuda()) r.gpu_utilisation = gpu_utilisation(device.index);
    if (progress == ProgressStyle::Bar) fmt::print(stderr, "\r{:110}\r", "");

    ClassifierEval val =
        evaluate_classifier(*model, test_set.images, test_set.labels, augment, o.eval_batch_size, false, o.amp_bf16);
    r.val_loss = val.loss;
    r.val_accuracy = val.accuracy;
    summary.epochs.push_back(r);

    // latest first, then best: a run stopped between the two saves leaves best one improvement
    // behind, which the resume repairs from latest (the metadata says which epoch is the best).
    const bool is_best = r.val_accuracy > summary.best_val_accuracy || summary.best_epoch == 0;
    if (is_best) summary.best_val_accuracy = r.val_accuracy, summary.best_epoch = epoch;
    state.epoch = epoch;
    state.history = summary.epochs;
    state.best_epoch = summary.best_epoch;
    state.best_val_accuracy = summary.best_val_accuracy;
    if (o.cuda_graph) nn::sync_random_offsets_from_device(*model);  // replays advanced them on the device
    CheckpointMetadata meta = training_metadata(o.model, state);
    // latest.safetensors carries the skip list and the dropout positions too, as the store's checkpoints do.
    meta["skipped_batches"] = skip_list_text(skipped);
    meta["random_state"] = random_state_json(*model);
    if (use_store)
      save_to_store(first_step + steps_per_epoch);
    else
      save_checkpoint(latest_path, *model, optimizer.get(), meta);
    if (is_best) save_checkpoint(best_path, *model, nullptr, meta);
    log.write(epoch_log_record(r, o.model, device.str()));
    events.add_scalar("loss/train", static_cast<float>(r.train_loss), epoch);
    events.add_scalar("loss/val", static_cast<float>(r.val_loss), epoch);
    events.add_scalar("accuracy/train", static_cast<float>(r.train_accuracy), epoch);
    events.add_scalar("accuracy/val", static_cast<float>(r.val_accuracy), epoch);
    events.add_scalar("throughput/images_per_second", static_cast<float>(r.images_per_second), epoch);
    write_curves(o.out_dir / "training_curves.png", summary.epochs, fmt::format("{} on CIFAR-10", o.model));
    if (on_epoch) on_epoch(r);
  }
  if (saver) saver->wait();  // the last checkpoint is on disk, or its error is thrown here
  summary.total_seconds = seconds_since(run_start);
  double total = 0;
  int counted = 0;
  for (const auto& e : summary.epochs) {
    if (e.epoch >= start_epoch) total += e.seconds, ++counted;
  }
  summary.mean_epoch_seconds = counted ? total / counted : 0;
  summary.final_test_accuracy = summary.epochs.empty() ? 0 : summary.epochs.back().val_accuracy;
  return summary;
}

}  // namespace kiln::train
