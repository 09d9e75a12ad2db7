#include "kiln/train/image_classifier_trainer.h"

#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kiln/autograd/functions.h"
#include "kiln/io/jsonl_writer.h"
#include "kiln/io/tfevents_writer.h"
#include "kiln/io/training_curves.h"
#include "kiln/models/cifar_models.h"
#include "kiln/nn/graph_safe_random.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/image_batch.h"
#include "kiln/optim/lr_scheduler.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/backend.h"
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

// One line, redrawn in place: [=====>    ] 312/781 loss 1.234 acc 55.1% 12345 img/s
void draw_progress(std::int64_t step, std::int64_t steps, double loss, double acc, double ips) {
  constexpr int width = 30;
  int filled = static_cast<int>(width * step / std::max<std::int64_t>(steps, 1));
  std::string bar(static_cast<std::size_t>(filled), '=');
  if (filled < width) bar += '>';
  bar.resize(width, ' ');
  fmt::print(stderr, "\r  [{}] {}/{} loss {:.4f} acc {:.2f}% {:.0f} img/s ", bar, step, steps, loss, acc * 100, ips);
}

nlohmann::json history_json(const std::vector<EpochReport>& epochs) {
  nlohmann::json h = nlohmann::json::array();
  for (const auto& e : epochs)
    h.push_back({{"epoch", e.epoch},
                 {"train_loss", e.train_loss},
                 {"train_accuracy", e.train_accuracy},
                 {"val_loss", e.val_loss},
                 {"val_accuracy", e.val_accuracy},
                 {"seconds", e.seconds},
                 {"images_per_second", e.images_per_second},
                 {"lr", e.lr}});
  return h;
}

std::vector<EpochReport> history_from_json(const nlohmann::json& h) {
  std::vector<EpochReport> out;
  for (const auto& e : h) {
    EpochReport r;
    r.epoch = e.at("epoch");
    r.train_loss = e.at("train_loss");
    r.train_accuracy = e.at("train_accuracy");
    r.val_loss = e.at("val_loss");
    r.val_accuracy = e.at("val_accuracy");
    r.seconds = e.at("seconds");
    r.images_per_second = e.at("images_per_second");
    r.lr = e.at("lr");
    out.push_back(r);
  }
  return out;
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
  KILN_CHECK(o.epochs > 0, "--epochs must be positive, got {}", o.epochs);
  KILN_CHECK(o.batch_size > 0, "--batch-size must be positive, got {}", o.batch_size);
  KILN_CHECK(o.lr > 0, "--lr must be positive, got {}", o.lr);
  const Device device = o.device;
  backend_for(device);  // fails early, naming the device, if it does not exist
  KILN_CHECK(!o.cuda_graph || device.is_cuda(), "--cuda-graph on needs a CUDA device, got {}", device.str());
#if !KILN_WITH_CUDA
  KILN_CHECK(!o.cuda_graph, "--cuda-graph on: this build has no CUDA");
#endif

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

  std::filesystem::create_directories(o.out_dir / "checkpoints");
  const auto latest_path = o.out_dir / "checkpoints" / "latest.safetensors";
  const auto best_path = o.out_dir / "checkpoints" / "best.safetensors";

  TrainingSummary summary;
  int start_epoch = 1;
  if (o.resume && std::filesystem::exists(latest_path)) {
    auto meta = load_checkpoint(latest_path, o.model, *model, optimizer.get());
    start_epoch = std::stoi(meta.at("epoch")) + 1;
    summary.epochs = history_from_json(nlohmann::json::parse(meta.at("history")));
    for (const auto& e : summary.epochs)
      if (e.val_accuracy > summary.best_val_accuracy)
        summary.best_val_accuracy = e.val_accuracy, summary.best_epoch = e.epoch;
    fmt::print("resumed from {} after epoch {}\n", latest_path.string(), start_epoch - 1);
  }
  io::JsonlWriter log(o.out_dir / "log.jsonl",
                      o.resume ? io::JsonlWriter::Mode::Append : io::JsonlWriter::Mode::Truncate);
  io::TfEventsWriter events(o.out_dir / "tensorboard");

  ops::AugmentParams augment = cifar10_normalization(o.normalization);
  if (o.augment) {
    augment.pad = 4;
    augment.flip = true;
  }
  augment.seed = o.seed;
  const bool tty = o.progress && isatty(STDERR_FILENO);
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
        train_step(ops::augment_images(train_set.images, idx, augment), y);
      } else {
#if KILN_WITH_CUDA
        ops::augment_images_into(x_static, train_set.images, idx, augment);
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
      if (tty && (seconds_since(last_draw) > 0.5 || s + 1 == steps_per_epoch)) {
        last_draw = Clock::now();
        double done = static_cast<double>((s + 1) * o.batch_size);
        draw_progress(s + 1, steps_per_epoch, loss_sum.item() / static_cast<double>(s + 1), correct.item() / done,
                      done / seconds_since(epoch_start));
      }
    }
    synchronize(device);
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
    if (tty) fmt::print(stderr, "\r{:100}\r", "");

    ClassifierEval val =
        evaluate_classifier(*model, test_set.images, test_set.labels, augment, o.eval_batch_size, false, o.amp_bf16);
    r.val_loss = val.loss;
    r.val_accuracy = val.accuracy;
    summary.epochs.push_back(r);

    nlohmann::json hist = history_json(summary.epochs);
    CheckpointMetadata meta{{"model", o.model},
                            {"epoch", std::to_string(epoch)},
                            {"history", hist.dump()},
                            {"normalization", o.normalization},
                            {"val_accuracy", fmt::format("{}", r.val_accuracy)}};
    if (o.cuda_graph) nn::sync_random_offsets_from_device(*model);  // replays advanced them on the device
    save_checkpoint(latest_path, *model, optimizer.get(), meta);
    if (r.val_accuracy > summary.best_val_accuracy || summary.best_epoch == 0) {
      summary.best_val_accuracy = r.val_accuracy;
      summary.best_epoch = epoch;
      save_checkpoint(best_path, *model, nullptr, meta);
    }
    log.write({{"epoch", epoch},
               {"train_loss", r.train_loss},
               {"train_accuracy", r.train_accuracy},
               {"val_loss", r.val_loss},
               {"val_accuracy", r.val_accuracy},
               {"epoch_seconds", r.seconds},
               {"images_per_second", r.images_per_second},
               {"peak_memory_bytes", r.peak_memory_bytes},
               {"lr", r.lr},
               {"model", o.model},
               {"device", device.str()}});
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
