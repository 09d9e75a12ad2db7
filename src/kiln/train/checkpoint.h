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

// Loads weights (and optimizer state when `optimizer` is given) into the objects. Refuses a
// checkpoint of another model with an error naming both. Returns the metadata.
CheckpointMetadata load_checkpoint(const std::filesystem::path& path, const std::string& expected_model,
                                   nn::Module& model, optim::Optimizer* optimizer);

}  // namespace kiln::train
