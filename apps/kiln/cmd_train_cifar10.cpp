// `kiln train-cifar10`: the course project's training script, as one command.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "kiln/models/cifar_models.h"
#include "kiln/runtime/backend.h"
#include "kiln/train/image_classifier_trainer.h"

namespace kiln::cli {

namespace {

std::string time_text(double s) {
  int total = static_cast<int>(s + 0.5);
  return total >= 3600 ? fmt::format("{}h{:02}m{:02}s", total / 3600, total / 60 % 60, total % 60)
                       : fmt::format("{}m{:02}s", total / 60, total % 60);
}

Device default_device() { return device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu(); }

}  // namespace

namespace {
// --limit-*: 0 means all images, so a negative count would silently mean all too: refuse it.
const CLI::Validator kImageCount(
    [](std::string& value) {
      return value.starts_with("-") ? value + " is negative: give a number of images, or 0 for all" : std::string();
    },
    "N >= 0");
}  // namespace

void add_train_cifar10(CLI::App& app) {
  auto opts = std::make_shared<train::ImageClassifierOptions>();
  auto device = std::make_shared<std::string>();
  auto amp = std::make_shared<std::string>();
  auto cuda_graph = std::make_shared<std::string>("auto");
  auto channels_last = std::make_shared<std::string>("auto");
  auto* cmd = app.add_subcommand("train-cifar10", "Train a CIFAR-10 classifier (SimpleCNN, SimpleResNet, ResNet-18)");
  cmd->add_option("--model", opts->model, fmt::format("model: {}", fmt::join(models::cifar_model_names(), ", ")))
      ->capture_default_str();
  cmd->add_option("--epochs", opts->epochs, "training epochs")->capture_default_str();
  cmd->add_option("--batch-size", opts->batch_size, "images per step")->capture_default_str();
  cmd->add_option("--lr", opts->lr, "learning rate")->capture_default_str();
  cmd->add_option("--optimizer", opts->optimizer, "adam, adamw or sgd")->capture_default_str();
  cmd->add_option("--momentum", opts->momentum, "SGD momentum")->capture_default_str();
  cmd->add_option("--weight-decay", opts->weight_decay, "weight decay")->capture_default_str();
  cmd->add_option("--lr-schedule", opts->lr_schedule, "constant, cosine or step")->capture_default_str();
  cmd->add_option("--device", *device, "cpu, cuda or cuda:N (default: cuda:0 if there is a GPU, else cpu)");
  cmd->add_option("--amp", *amp, "mixed precision: bf16 (fp32 master weights)");
  cmd->add_option("--channels-last", *channels_last,
                  "on: activations stored channels-last (NHWC), faster convolutions on CUDA, same results; "
                  "auto: on for the ResNets on CUDA")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->add_option("--seed", opts->seed, "random seed (weights, shuffling, augmentation, dropout)")
      ->capture_default_str();
  cmd->add_option("--data-dir", opts->data_dir, "CIFAR-10 folder (fetched there when missing)")->capture_default_str();
  cmd->add_option("--out-dir", opts->out_dir, "checkpoints, logs and plots go here")->capture_default_str();
  cmd->add_flag("--resume", opts->resume, "continue from <out-dir>/checkpoints/latest.safetensors");
  cmd->add_flag("!--no-augment", opts->augment, "no random crop / flip");
  cmd->add_option("--normalization", opts->normalization, "half (the course's) or cifar (per-channel)")
      ->capture_default_str();
  cmd->add_option("--limit-train", opts->limit_train, "use only the first N training images (0: all)")
      ->check(kImageCount);
  cmd->add_option("--limit-test", opts->limit_test, "use only the first N test images (0: all)")->check(kImageCount);
  cmd->add_flag("!--no-download", opts->download, "fail instead of fetching missing data");
  cmd->add_flag("!--no-progress", opts->progress, "no progress bar");
  cmd->add_option("--cuda-graph", *cuda_graph,
                  "on: replay one captured training step per batch (CUDA only); auto: on on CUDA")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  cmd->callback([opts, device, amp, cuda_graph, channels_last] {
    opts->device = device->empty() ? default_device() : Device::parse(*device);
    if (!amp->empty()) {
      if (*amp != "bf16") throw CLI::ValidationError("--amp", "only bf16 is supported, got '" + *amp + "'");
      opts->amp_bf16 = true;
    }
    opts->cuda_graph = *cuda_graph == "on" || (*cuda_graph == "auto" && opts->device.is_cuda());
    opts->channels_last =
        *channels_last == "on" || (*channels_last == "auto" && opts->device.is_cuda() && opts->model != "simple_cnn");
    if (opts->cuda_graph && !opts->device.is_cuda())
      throw CLI::ValidationError("--cuda-graph", "on needs a CUDA device, got " + opts->device.str());
    models::make_cifar_model(opts->model);  // an unknown model fails here, listing the known ones
    fmt::print("Training {} on CIFAR-10 on {}: {} epochs, batch {}, {} lr {}{}{}{}\n", opts->model, opts->device.str(),
               opts->epochs, opts->batch_size, opts->optimizer, opts->lr, opts->amp_bf16 ? ", bf16 autocast" : "",
               opts->channels_last ? ", channels-last" : "", opts->cuda_graph ? ", CUDA graph" : "");
    auto summary = train::train_image_classifier(*opts, [&](const train::EpochReport& r) {
      std::string mem = fmt::format("{:.0f} MiB peak, {:.0f} MiB reserved", r.peak_memory_bytes / 1048576.0,
                                    r.reserved_memory_bytes / 1048576.0);
      std::string util = r.gpu_utilisation ? fmt::format(", GPU util {}%", *r.gpu_utilisation) : "";
      double left = r.seconds * (opts->epochs - r.epoch);
      fmt::print(
          "Epoch {}/{}: train loss {:.4f} acc {:.2f}% | val loss {:.4f} acc {:.2f}% | {:.1f} s, {:.0f} img/s | "
          "{}{} | {} left\n",
          r.epoch, opts->epochs, r.train_loss, r.train_accuracy * 100, r.val_loss, r.val_accuracy * 100, r.seconds,
          r.images_per_second, mem, util, time_text(left));
      std::fflush(stdout);
    });
    fmt::print(
        "Done in {}: final test accuracy {:.2f}%, best validation accuracy {:.2f}% (epoch {}), mean epoch {:.2f} s\n",
        time_text(summary.total_seconds), summary.final_test_accuracy * 100, summary.best_val_accuracy * 100,
        summary.best_epoch, summary.mean_epoch_seconds);
    fmt::print("Wrote {}/checkpoints/{{latest,best}}.safetensors, training_curves.png, log.jsonl, tensorboard/\n",
               opts->out_dir.string());
  });
}

}  // namespace kiln::cli
