#pragma once
// Training checkpoints: one safetensors file holding the model's state ("model.<name>"), the
// optimizer's ("optimizer.<name>") and metadata (which model, which epoch, the history so far).
// Written atomically (io::save_safetensors), so an interrupted save never leaves a half file.
#include <filesystem>
#include <map>
#include <string>

#include "kiln/nn/module.h"
#include "kiln/optim/optimizer.h"

namespace kiln::train {

using CheckpointMetadata = std::map<std::string, std::string>;

// metadata must contain "model" (the registry name the weights belong to).
void save_checkpoint(const std::filesystem::path& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointMetadata& metadata);

// Loads weights (and, when `optimizer` is given, its state) into the objects and returns the
// metadata. Nothing is converted: every error names the file and the tensor. It refuses a
// checkpoint of another model (naming both), a tensor whose dtype differs from the model's (both
// dtypes named, even when the byte counts agree), and, when `optimizer` is given, a checkpoint
// without the optimizer's full state (which parameters lack what): resuming with fresh moments
// is a different run, so a caller that wants it passes no optimizer (train-cifar10's
// --reset-optimizer).
CheckpointMetadata load_checkpoint(const std::filesystem::path& path, const std::string& expected_model,
                                   nn::Module& model, optim::Optimizer* optimizer);

// The same checks and loading for tensors already read (a CheckpointStore folder's files merged):
// `tensors` holds "model.*" and "optimizer.*" entries (others are ignored), `source` names the
// checkpoint in errors.
void restore_checkpoint(const std::filesystem::path& source, const TensorDict& tensors,
                        const CheckpointMetadata& metadata, const std::string& expected_model, nn::Module& model,
                        optim::Optimizer* optimizer);

}  // namespace kiln::train
