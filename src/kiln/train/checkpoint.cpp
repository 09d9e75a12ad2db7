#include "kiln/train/checkpoint.h"

#include <fmt/format.h>

#include <set>
#include <vector>

#include "kiln/io/safetensors.h"

namespace kiln::train {

namespace {

// Every model tensor must have the model's own dtype: a same-sized tensor of another dtype (i32
// for f32, f16 for bf16) would otherwise be converted value by value into garbage weights.
void check_model_dtypes(const std::filesystem::path& path, const TensorDict& state, const nn::Module& model) {
  const TensorDict targets = model.state_dict();
  for (const auto& [name, t] : state) {
    const Tensor* target = targets.find(name);
    if (!target) continue;  // load_state_dict names the unexpected keys
    KILN_CHECK(t.dtype() == target->dtype(),
               "checkpoint {}: tensor 'model.{}' is {} but the model's '{}' is {}; a checkpoint is loaded without "
               "conversion (is it another model's, or was it written by another tool?)",
               path.string(), name, dtype_name(t.dtype()), name, dtype_name(target->dtype()));
  }
}

// The optimizer's state must be there for every parameter, with the same buffers for each (Adam:
// exp_avg and exp_avg_sq; SGD with momentum: momentum_buffer).
void check_optimizer_state(const std::filesystem::path& path, const TensorDict& state,
                           const optim::Optimizer& optimizer) {
  std::size_t params = 0;
  for (const auto& g : optimizer.param_groups()) params += g.params.size();
  KILN_CHECK(!state.empty(),
             "checkpoint {} holds no optimizer state (no 'optimizer.*' tensors): resuming would restart {} from "
             "zero, which is not the run it continues. To do that anyway, ask for it explicitly (train-cifar10: "
             "--reset-optimizer)",
             path.string(), optimizer.name());
  std::set<std::string> kinds;
  if (optimizer.name().starts_with("Adam")) kinds = {"exp_avg", "exp_avg_sq"};
  for (const auto& [name, t] : state) {
    // "state.<i>.<kind>"
    if (!name.starts_with("state.")) continue;
    const auto dot = name.find('.', 6);
    if (dot != std::string::npos && name.substr(dot + 1) != "step") kinds.insert(name.substr(dot + 1));
  }
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < params; ++i) {
    if (!state.contains(fmt::format("state.{}.step", i))) missing.push_back(fmt::format("state.{}.step", i));
    for (const std::string& kind : kinds)
      if (!state.contains(fmt::format("state.{}.{}", i, kind))) missing.push_back(fmt::format("state.{}.{}", i, kind));
  }
  if (missing.empty()) return;
  std::string listed;
  for (std::size_t i = 0; i < missing.size() && i < 8; ++i) listed += (i ? ", " : "") + ("optimizer." + missing[i]);
  if (missing.size() > 8) listed += fmt::format(" and {} more", missing.size() - 8);
  KILN_FAIL(
      "checkpoint {}: the {} state is incomplete ({} of {} parameters' entries missing: {}); resuming would restart "
      "those from zero. To start the optimizer afresh anyway, ask for it explicitly (train-cifar10: "
      "--reset-optimizer)",
      path.string(), optimizer.name(), missing.size(), params, listed);
}

}  // namespace

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
  const CheckpointMetadata metadata(file.metadata.begin(), file.metadata.end());
  restore_checkpoint(path, file.tensors, metadata, expected_model, model, optimizer);
  return metadata;
}

void restore_checkpoint(const std::filesystem::path& path, const TensorDict& tensors,
                        const CheckpointMetadata& metadata, const std::string& expected_model, nn::Module& model,
                        optim::Optimizer* optimizer) {
  auto it = metadata.find("model");
  KILN_CHECK(it != metadata.end(), "{} is not a Kiln training checkpoint (no 'model' in its metadata)", path.string());
  KILN_CHECK(it->second == expected_model, "checkpoint {} holds model '{}', not '{}'", path.string(), it->second,
             expected_model);
  TensorDict model_state, optim_state;
  for (const auto& [name, t] : tensors) {
    if (name.rfind("model.", 0) == 0)
      model_state.insert(name.substr(6), t);
    else if (name.rfind("optimizer.", 0) == 0)
      optim_state.insert(name.substr(10), t);
  }
  check_model_dtypes(path, model_state, model);
  if (optimizer) check_optimizer_state(path, optim_state, *optimizer);
  try {
    model.load_state_dict(model_state, /*strict=*/true);
    if (optimizer) optimizer->load_state_dict(optim_state);
  } catch (const Error& e) {
    KILN_FAIL("checkpoint {}: {}", path.string(), e.what());
  }
}

}  // namespace kiln::train
