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
#include "kiln/ops/copy.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/backend.h"
#include "kiln/vision/image_augment.h"
#if KILN_WITH_CUDA
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "kiln/runtime/gpu_monitor.h"
#include "kiln/tensor/autocast.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/checkpoint.h"
#include "kiln/train/cifar10_tensors.h"
#include "kiln/train/classifier_eval.h"
#include "kiln/train/nonfinite_guard.h"
#include "kiln/train/training_log.h"
#include "kiln/train/training_state.h"
#include "kiln/vision/seeded_random.h"

namespace kiln::train {

namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

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

TrainingSummary train_image_classifier(const ImageClassifierOptions& o,
                                       const std::function<void(const EpochReport&)>& on_epoch) {
  check_options(o);
  const Device device = o.device;
  backend_for(device);  // fails early, naming the device, if it does not exist
  KILN_CHECK(!o.cuda_graph || device.is_cuda(), "--cuda-graph on needs a CUDA device, got {}", device.str());
#if !KILN_WITH_CUDA
  KILN_CHECK(!o.cuda_graph, "--cuda-graph on: this build has no CUDA");
#endif
  const auto checkpoints = o.out_dir / "checkpoints";
  const auto latest_path = checkpoints / "latest.safetensors";
  const auto best_path = checkpoints / "best.safetensors";
  // Before anything is read or written: a resume with nothing to resume from is a mistake (a
  // mistyped --out-dir, a deleted run), not a reason to start over over the old log and best.
  KILN_CHECK(!o.resume || std::filesystem::exists(latest_path),
             "--resume: there is no checkpoint to resume from in {} ({} does not exist); nothing was changed. Run "
             "without --resume to start a new run there",
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

  TrainingSummary summary;
  TrainingState state;
  state.normalization = o.normalization;
  int start_epoch = 1;
  if (o.resume) {
    auto meta = load_checkpoint(latest_path, o.model, *model, o.reset_optimizer ? nullptr : optimizer.get());
    state = training_state_from_metadata(meta, latest_path);
    KILN_CHECK(state.normalization.empty() || state.normalization == o.normalization,
               "--resume: {} was trained with --normalization {}, this run asks for {}; pass --normalization {}",
               latest_path.string(), state.normalization, o.normalization, state.normalization);
    state.normalization = o.normalization;
    start_epoch = state.epoch + 1;
    summary.epochs = state.history;
    summary.best_val_accuracy = state.best_val_accuracy;
    summary.best_epoch = state.best_epoch;
    fmt::print("resumed from {} after epoch {}{}\n", latest_path.string(), state.epoch,
               o.reset_optimizer ? fmt::format(" (optimizer state reset: {} starts afresh)", optimizer->name()) : "");
    if (state.epoch >= o.epochs)
      fmt::print("the checkpoint already holds {} epochs; nothing to train (pass --epochs above {} to go on)\n",
                 state.epoch, state.epoch);
    // latest is saved before best: a run stopped between the two leaves best one improvement
    // behind, and latest, holding that very epoch's weights, puts it right.
    const std::optional<int> best_holds = checkpoint_epoch(best_path);
    if (best_holds != state.best_epoch) {
      const std::string held = best_holds ? fmt::format("epoch {}", *best_holds) : "nothing readable";
      if (state.best_epoch == state.epoch) {
        save_checkpoint(best_path, *model, nullptr, meta);
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
  std::filesystem::create_directories(checkpoints);
  io::JsonlWriter log(o.out_dir / "log.jsonl",
                      o.resume ? io::JsonlWriter::Mode::Append : io::JsonlWriter::Mode::Truncate);
  io::TfEventsWriter events(o.out_dir / "tensorboard");

  vision::AugmentParams augment = cifar10_normalization(o.normalization);
  if (o.augment) {
    augment.pad = 4;
    augment.flip = true;
  }
  augment.seed = o.seed;
  const ProgressStyle progress = progress_style(o);
  // Finds the first step whose loss or gradients are not finite, on the device; checked where the
  // host synchronises anyway (progress, end of epoch). Step k of the guard is global step
  // (start_epoch - 1) * steps_per_epoch + k.
  NonFiniteGuard guard(device);
  const std::vector<Tensor> params = model->parameters();
  auto stop_if_diverged = [&] {
    auto bad = guard.first_bad_step();
    if (!bad) return;
    const std::int64_t step = static_cast<std::int64_t>(start_epoch - 1) * steps_per_epoch + *bad;
    const std::int64_t epoch = (step - 1) / steps_per_epoch + 1, batch = (step - 1) % steps_per_epoch + 1;
    if (progress == ProgressStyle::Bar) fmt::print(stderr, "\n");
    KILN_FAIL(
        "training diverged at step {} (epoch {}, batch {} of {}): the loss or the gradients are not finite (NaN or "
        "inf). Nothing of epoch {} was saved; {}. Try a lower --lr",
        step, epoch, batch, steps_per_epoch, epoch,
        epoch > 1 ? fmt::format("{} holds epoch {} (continue from it with --resume)", latest_path.string(), epoch - 1)
                  : "no checkpoint was written");
  };
  auto run_start = Clock::now();
  const std::int64_t samples_per_epoch = steps_per_epoch * o.batch_size;

  // The epoch's loss and correct-prediction sums stay on the device (no sync per step); one pair
  // for the whole run, zeroed per epoch, because a captured step adds into these very tensors.
  Tensor loss_sum = Tensor::zeros({}, DType::F32, device);
  Tensor correct = Tensor::zeros({}, DType::I64, device);
  // One training step on a batch; eager, or recorded once into the graph.
  auto train_step = [&](const Tensor& x, const Tensor& y) {
    Tensor logits;
    {
      AutocastGuard autocast(DType::BF16, o.amp_bf16);
      logits = model->forward(o.channels_last ? to_channels_last(x) : x);
    }
    logits = logits.to(DType::F32);
    Tensor loss = cross_entropy(logits, y);
    optimizer->zero_grad();
    loss.backward();
    guard.record(loss, params);
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

  for (int epoch = start_epoch; epoch <= o.epochs; ++epoch) {
    model->train();
    backend_for(device).reset_peak_memory(device.index);
    auto epoch_start = Clock::now();
    // The epoch's order: a seeded shuffle, uploaded once; labels gathered in that order once.
    auto order = vision::shuffled_indices(n_train, o.seed, epoch);
    Tensor perm = Tensor::from_vector(order, {n_train}, device);
    Tensor labels = index_select(train_set.labels, 0, perm);
    loss_sum.zero_();
    correct.zero_();
    auto last_draw = Clock::now();
    for (std::int64_t s = 0; s < steps_per_epoch; ++s) {
      const std::int64_t global_step = static_cast<std::int64_t>(epoch - 1) * steps_per_epoch + s;
      optimizer->set_lr(schedule->get_lr(global_step));  // capturable: a device write, before replay
      Tensor idx = perm.slice(0, s * o.batch_size, (s + 1) * o.batch_size);
      augment.offset = static_cast<std::uint64_t>(global_step) * static_cast<std::uint64_t>(o.batch_size);
      Tensor y = labels.slice(0, s * o.batch_size, (s + 1) * o.batch_size);
      if (!o.cuda_graph) {
        train_step(vision::augment_images(train_set.images, idx, augment), y);
      } else {
#if KILN_WITH_CUDA
        vision::augment_images_into(x_static, train_set.images, idx, augment);
        ops::copy_into(y_static, y);
        if (graph.captured()) {
          graph.replay();
        } else if (eager_steps < kGraphWarmupSteps) {
          train_step(x_static, y_static);
          ++eager_steps;
        } else {
          graph.capture_begin(device);
          train_step(x_static, y_static);  // recorded, not run
          graph.capture_end();
          graph.replay();
        }
#endif
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
    EpochReport r;
    r.epoch = epoch;
    r.seconds = seconds_since(epoch_start);
    r.images_per_second = static_cast<double>(samples_per_epoch) / r.seconds;
    r.train_loss = loss_sum.item() / static_cast<double>(steps_per_epoch);
    r.train_accuracy = correct.item() / static_cast<double>(samples_per_epoch);
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
    const CheckpointMetadata meta = training_metadata(o.model, state);
    if (o.cuda_graph) nn::sync_random_offsets_from_device(*model);  // replays advanced them on the device
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
