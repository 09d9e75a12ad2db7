#pragma once
// What a training checkpoint's metadata records about the run, beside the weights: the epochs
// completed, the history of every epoch (the log and the curves are rebuilt from it), and which
// epoch was the best so far (so a run killed between writing latest.safetensors and
// best.safetensors can tell that best is stale, and repair it). Read back with every field
// checked: a damaged or hand-edited checkpoint gets an error naming the file and the field.
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/train/checkpoint.h"
#include "kiln/train/image_classifier_trainer.h"

namespace kiln::train {

inline constexpr int kMaxEpochs = 1'000'000;

struct TrainingState {
  int epoch = 0;                     // epochs completed (1..kMaxEpochs in a checkpoint)
  std::vector<EpochReport> history;  // epochs 1..epoch, in order
  int best_epoch = 0;                // the epoch of the best validation accuracy (1..epoch)
  double best_val_accuracy = 0;
  std::string normalization;  // the input normalisation the weights were trained with
};

// The metadata of a checkpoint written after `state.epoch` (model, epoch, history, best_epoch,
// best_val_accuracy, normalization, and the last epoch's val_accuracy).
CheckpointMetadata training_metadata(const std::string& model, const TrainingState& state);

// Reads and checks the metadata of `file`: epoch a whole number in 1..kMaxEpochs, history a JSON
// array of exactly `epoch` entries numbered 1..epoch with numeric fields (accuracies in [0, 1]),
// best_epoch in 1..epoch, normalization half or cifar. Checkpoints written before best_epoch was
// recorded get it from the history.
// A step checkpoint taken during the first epoch has epoch 0 (pass min_epoch 0 to accept it).
TrainingState training_state_from_metadata(const CheckpointMetadata& metadata, const std::filesystem::path& file,
                                           int min_epoch = 1);

}  // namespace kiln::train
