// `kiln train-cifar10`: the course project's training script, as one command.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "commands.h"
#include "kiln/models/cifar_models.h"
#include "kiln/runtime/backend.h"
#include "kiln/train/image_classifier_trainer.h"
#include "number_checks.h"

namespace kiln::cli {

namespace {

std::string time_text(double s) {
  int total = static_cast<int>(s + 0.5);
  return total >= 3600 ? fmt::format("{}h{:02}m{:02}s", total / 3600, total / 60 % 60, total % 60)
                       : fmt::format("{}m{:02}s", total / 60, total % 60);
}

Device default_device() { return device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu(); }

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
  cmd->add_option("--epochs", opts->epochs, "training epochs")->check(whole_number_at_least(1))->capture_default_str();
  cmd->add_option("--batch-size", opts->batch_size, "images per step")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--lr", opts->lr, "learning rate")->check(finite_number_above(0))->capture_default_str();
  cmd->add_option("--optimizer", opts->optimizer, "adam, adamw or sgd")->capture_default_str();
  cmd->add_option("--momentum", opts->momentum, "SGD momentum")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--weight-decay", opts->weight_decay, "weight decay")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
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
  cmd->add_flag("--resume", opts->resume,
                "continue from the newest intact <out-dir>/checkpoints/iter_* folder, else "
                "checkpoints/latest.safetensors (an error when there is none)");
  cmd->add_flag("--reset-optimizer", opts->reset_optimizer,
                "with --resume: start the optimizer's state (Adam's moments, SGD's momentum) afresh instead of "
                "loading it; without this flag a checkpoint lacking it is an error");
  cmd->add_flag("!--no-augment", opts->augment, "no random crop / flip");
  cmd->add_option("--normalization", opts->normalization, "half (the course's) or cifar (per-channel)")
      ->capture_default_str();
  cmd->add_option("--limit-train", opts->limit_train, "use only the first N training images (0: all)")
      ->check(whole_number_at_least(0));
  cmd->add_option("--limit-test", opts->limit_test, "use only the first N test images (0: all)")
      ->check(whole_number_at_least(0));
  cmd->add_flag("!--no-download", opts->download, "fail instead of fetching missing data");
  cmd->add_flag("!--no-progress", opts->progress, "no progress bar or progress lines");
  cmd->add_option("--progress-seconds", opts->progress_seconds,
                  "when the output is not a terminal (a pipe, a log file): a progress line every this many seconds "
                  "(0: every step)")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--cuda-graph", *cuda_graph,
                  "on: replay one captured training step per batch (CUDA only); auto: on on CUDA")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  // Never losing work (docs/checkpoints.md).
  auto skip_batches = std::make_shared<std::string>();
  cmd->add_option("--save-interval", opts->save_interval,
                  "a checkpoint every N steps (and at each epoch end) in <out-dir>/checkpoints/iter_<step>/, with "
                  "checksums; --resume then continues from the newest intact one, mid-epoch included (0: none)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_flag("--async-save", opts->async_save,
                "write those checkpoints on a background thread: the step waits only for a host copy (implies "
                "checkpoints at epoch ends in iter_* folders)");
  cmd->add_option("--keep-last", opts->keep_last, "keep only the K newest iter_* checkpoints (0: all)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_flag("--rewind", opts->rewind.enabled,
                "roll back steps whose loss or gradient norm is NaN/inf or spikes, skip their batch, carry on");
  cmd->add_option("--rewind-loss-zscore", opts->rewind.thresholds.loss_zscore,
                  "a loss this many standard deviations above the window's mean is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--rewind-loss-ratio", opts->rewind.thresholds.loss_ratio,
                  "a loss above this multiple of the window's median is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--rewind-grad-norm-ratio", opts->rewind.thresholds.grad_norm_ratio,
                  "a gradient norm above this multiple of the window's median is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--rewind-window", opts->rewind.thresholds.window, "good steps the spike statistics are over")
      ->check(whole_number_at_least(2))
      ->capture_default_str();
  cmd->add_option("--rewind-min-history", opts->rewind.thresholds.min_history,
                  "spikes are judged once this many good steps are in the window")
      ->check(whole_number_at_least(2))
      ->capture_default_str();
  cmd->add_option("--rewind-snapshot-interval", opts->rewind.snapshot_interval,
                  "steps between in-memory snapshots to roll back to (also at each epoch start; 0: the newest "
                  "checkpoint instead)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--rewind-max", opts->rewind.max_rewinds, "give up after this many rewinds ...")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--rewind-max-window", opts->rewind.max_rewinds_window, "... within this many steps")
      ->check(whole_number_at_least(1))
      ->capture_default_str();
  cmd->add_option("--rewind-lr-factor", opts->rewind.lr_factor,
                  "after a rewind, multiply the learning rate by this (0 < f <= 1) ...")
      ->check(finite_number_above(0))
      ->capture_default_str();
  cmd->add_option("--rewind-lr-steps", opts->rewind.lr_steps, "... for this many steps (0: not lowered)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--skip-batches", *skip_batches,
                  "steps (1-based, over the whole run) whose batches are never trained on, e.g. 12,40: to reproduce "
                  "a run that rewound");
  cmd->callback([opts, device, amp, cuda_graph, channels_last, skip_batches] {
    opts->device = device->empty() ? default_device() : Device::parse(*device);
    if (!amp->empty()) {
      if (*amp != "bf16") throw CLI::ValidationError("--amp", "only bf16 is supported, got '" + *amp + "'");
      opts->amp_bf16 = true;
    }
    // auto: off with --rewind (a rollback replaces the optimizer state a captured graph points at).
    opts->cuda_graph =
        *cuda_graph == "on" || (*cuda_graph == "auto" && opts->device.is_cuda() && !opts->rewind.enabled);
    if (opts->cuda_graph && opts->rewind.enabled)
      throw CLI::ValidationError("--rewind", "needs --cuda-graph off (or auto)");
    opts->skip_batches = train::parse_skip_list(*skip_batches, "--skip-batches");
    if (opts->keep_last > 0 && opts->save_interval == 0 && !opts->async_save)
      throw CLI::ValidationError("--keep-last", "applies to the iter_* checkpoints: pass --save-interval N too");
    opts->channels_last =
        *channels_last == "on" || (*channels_last == "auto" && opts->device.is_cuda() && opts->model != "simple_cnn");
    if (opts->reset_optimizer && !opts->resume)
      throw CLI::ValidationError("--reset-optimizer", "only means something with --resume");
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
    const train::CheckpointStats& c = summary.checkpoints;
    if (c.saves > 0)
      fmt::print(
          "Checkpoints: {} saves ({}), the steps waited {:.3f} s in all (at most {:.2f} ms once); writing took "
          "{:.3f} s\n",
          c.saves, opts->async_save ? "asynchronous" : "synchronous", c.stall_seconds, c.max_stall_seconds * 1e3,
          c.write_seconds);
    if (!summary.rewinds.empty() || !summary.skipped_batches.empty())
      fmt::print("Rewinds: {} in this run; skipped batches (steps): {} (rerun with --skip-batches {} to reproduce)\n",
                 summary.rewinds.size(), train::skip_list_text(summary.skipped_batches),
                 train::skip_list_text(summary.skipped_batches));
    const bool stored = opts->save_interval > 0 || opts->async_save;
    fmt::print("Wrote {}/checkpoints/{}, training_curves.png, log.jsonl, tensorboard/\n", opts->out_dir.string(),
               stored ? "{iter_*/,best.safetensors}" : "{latest,best}.safetensors");
  });
}

}  // namespace kiln::cli
