#include "kiln/train/checkpoint.h"

#include "kiln/io/safetensors.h"

namespace kiln::train {

void save_checkpoint(const std::filesystem::path& path, const nn::Module& model, const optim::Optimizer* optimizer,
                     const CheckpointMetadata& metadata) {
  KILN_CHECK(metadata.count("model"), "save_checkpoint: metadata must name the model");
  TensorDict all;
  for (const auto& [name, t] : model.state_dict()) all.insert("model." + name, t);
  if (optimizer)
    for (const auto& [name, t] : optimizer->state_dict()) all.insert("optimizer." + name, t);
  std::filesystem::create_directories(path.parent_path());
  io::save_safetensors(path.string(), all, io::Metadata(metadata.begin(), metadata.end()));
}

CheckpointMetadata load_checkpoint(const std::filesystem::path& path, const std::string& expected_model,
                                   nn::Module& model, optim::Optimizer* optimizer) {
  KILN_CHECK(std::filesystem::exists(path), "checkpoint {} does not exist", path.string());
  io::SafetensorsFile file = io::load_safetensors(path.string());
  auto it = file.metadata.find("model");
  KILN_CHECK(it != file.metadata.end(), "{} is not a Kiln training checkpoint (no 'model' in its metadata)",
             path.string());
  KILN_CHECK(it->second == expected_model, "checkpoint {} holds model '{}', not '{}'", path.string(), it->second,
             expected_model);
  TensorDict model_state, optim_state;
  for (const auto& [name, t] : file.tensors) {
    if (name.rfind("model.", 0) == 0) model_state.insert(name.substr(6), t);
    else if (name.rfind("optimizer.", 0) == 0) optim_state.insert(name.substr(10), t);
  }
  model.load_state_dict(model_state, /*strict=*/true);
  if (optimizer && !optim_state.empty()) optimizer->load_state_dict(optim_state);
  return CheckpointMetadata(file.metadata.begin(), file.metadata.end());
}

}  // namespace kiln::train
