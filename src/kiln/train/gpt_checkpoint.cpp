#include "kiln/train/gpt_checkpoint.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kiln/io/safetensors.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/nn/layers.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/checkpoint_store.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

constexpr const char* kLatestFile = "latest_checkpointed_iteration.txt";
constexpr const char* kIndexFile = "checkpoint.json";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr int kFormatVersion = 1;

using FlagList = std::vector<std::pair<std::string, std::string>>;

std::string shape_text(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += fmt::format("{}{}", i ? ", " : "", shape[i]);
  return s + "]";
}

json tensor_list(const TensorDict& tensors) {
  json out = json::object();
  for (const auto& [name, t] : tensors)
    out[name] = {{"dtype", std::string(io::safetensors_dtype_name(t.dtype()))}, {"shape", t.shape()}};
  return out;
}

json flags_json(const FlagList& flags) {
  json out = json::array();
  for (const auto& [flag, value] : flags) out.push_back({flag, value});
  return out;
}

FlagList flags_from_json(const json& j, const fs::path& file, const char* field) {
  KILN_CHECK(j.is_array(), "{}: '{}' is not a list of [flag, value] pairs", file.string(), field);
  FlagList out;
  for (const auto& pair : j) {
    KILN_CHECK(pair.is_array() && pair.size() == 2 && pair[0].is_string() && pair[1].is_string(),
               "{}: '{}' holds an entry that is not a [flag, value] pair of strings", file.string(), field);
    out.emplace_back(pair[0].get<std::string>(), pair[1].get<std::string>());
  }
  return out;
}

json read_index(const fs::path& folder) {
  const fs::path file = folder / kIndexFile;
  std::ifstream in(file);
  KILN_CHECK(in.good(), "checkpoint {} has no {} (it is not a pretrain-gpt checkpoint, or was damaged)",
             folder.string(), kIndexFile);
  std::stringstream text;
  text << in.rdbuf();
  json j = json::parse(text.str(), nullptr, false);
  KILN_CHECK(!j.is_discarded() && j.is_object(), "{} is not valid JSON", file.string());
  KILN_CHECK(j.value("format", "") == "kiln-pretrain-gpt", "{} is not a pretrain-gpt checkpoint index", file.string());
  KILN_CHECK(j.value("version", 0) == kFormatVersion, "{}: version {} is not the one this Kiln reads ({})",
             file.string(), j.value("version", 0), kFormatVersion);
  return j;
}

template <class T>
T field(const json& j, const char* name, const fs::path& file) {
  KILN_CHECK(j.contains(name), "{}: the field '{}' is missing", file.string(), name);
  try {
    return j.at(name).get<T>();
  } catch (const json::exception&) {
    KILN_FAIL("{}: the field '{}' has the wrong type", file.string(), name);
  }
}

// The flag that decides a tensor's shape, for the error when a checkpoint's tensor does not fit:
// the shape flags are compared first, so this explains what those do not cover.
std::string flag_for_tensor(const std::string& name) {
  if (name.find("word_embeddings") != std::string::npos || name.starts_with("output_layer"))
    return "--hidden-size, or the vocabulary (the tokenizer flags, --make-vocab-size-divisible-by)";
  if (name.find("position_embeddings") != std::string::npos)
    return "--max-position-embeddings / --position-embedding-type";
  if (models::is_fp8_scaling_state(name)) return "--fp8-amax-history-len";
  if (name.find("linear_qkv") != std::string::npos)
    return "--num-attention-heads, --num-query-groups, --kv-channels or --hidden-size";
  if (name.find("linear_proj") != std::string::npos) return "--num-attention-heads, --kv-channels or --hidden-size";
  if (name.find("linear_fc1") != std::string::npos) return "--ffn-hidden-size, --swiglu or --hidden-size";
  if (name.find("linear_fc2") != std::string::npos) return "--ffn-hidden-size or --hidden-size";
  if (name.find("layernorm") != std::string::npos) return "--hidden-size or --normalization";
  return "the model flags";
}

std::string compare_flags(const FlagList& saved, const FlagList& wanted) {
  std::string diffs;
  for (const auto& [flag, value] : wanted) {
    std::optional<std::string> had;
    for (const auto& [f, v] : saved)
      if (f == flag) had = v;
    if (!had)
      diffs += fmt::format("\n  {}: not recorded in the checkpoint, {} in this run", flag, value);
    else if (*had != value)
      diffs += fmt::format("\n  {}: {} in the checkpoint, {} in this run", flag, *had, value);
  }
  for (const auto& [flag, value] : saved) {
    bool known = false;
    for (const auto& [f, v] : wanted) known = known || f == flag;
    if (!known) diffs += fmt::format("\n  {}: {} in the checkpoint, not set in this run", flag, value);
  }
  return diffs;
}

void check_model_tensors(const fs::path& file, const TensorDict& saved, const nn::Module& model) {
  const TensorDict targets = model.state_dict();
  // FP8 delayed-scaling state may be absent (a bf16 checkpoint loading into an FP8 run starts it
  // fresh) or extra (an FP8 checkpoint loading into a bf16 run drops it); load_model_tensors skips it.
  for (const auto& [name, target] : targets) {
    const Tensor* t = saved.find(name);
    if (!t && models::is_fp8_scaling_state(name)) continue;
    KILN_CHECK(t, "checkpoint {} lacks the tensor '{}' this model has (set by {}): it is another model's",
               file.string(), name, flag_for_tensor(name));
    KILN_CHECK(t->shape() == target.shape(),
               "checkpoint {}: tensor '{}' is {} there but {} in this model; its shape follows {}: pass the values "
               "the checkpoint was trained with",
               file.string(), name, shape_text(t->shape()), shape_text(target.shape()), flag_for_tensor(name));
    KILN_CHECK(t->dtype() == target.dtype(), "checkpoint {}: tensor '{}' is {} there but {} in this model (--bf16)",
               file.string(), name, dtype_name(t->dtype()), dtype_name(target.dtype()));
  }
  for (const auto& [name, t] : saved)
    KILN_CHECK(targets.contains(name) || models::is_fp8_scaling_state(name),
               "checkpoint {} holds the tensor '{}' {} that this model lacks (set by {}): it is another model's",
               file.string(), name, shape_text(t.shape()), flag_for_tensor(name));
}

// The newest checkpoint under `load` whose files all match its manifest; the newer ones passed over
// are in its passed_over, each with the reason. Throws when none is intact, giving every reason.
LoadedCheckpoint newest_intact(const fs::path& load) {
  KILN_CHECK(fs::is_directory(load), "--load {}: the folder does not exist", load.string());
  CheckpointStore store(load);
  auto c = store.load_newest_intact();
  if (!c) {
    std::string reasons;
    for (const auto& r : store.passed_over()) reasons += fmt::format("\n  {}", r);
    KILN_FAIL("--load {}: no intact checkpoint there{}", load.string(),
              reasons.empty() ? fmt::format(" (no iter_* folder)") : fmt::format(", each was refused:{}", reasons));
  }
  return *std::move(c);
}

}  // namespace

fs::path checkpoint_folder(const fs::path& save, std::int64_t iteration) {
  return save / fmt::format("iter_{:07d}", iteration);
}

void capture_rng_state(const nn::Module& model, GptCheckpointState& state) {
  state.generator_seed = default_generator().seed();
  state.generator_offset = default_generator().offset();
  state.dropout_rng.clear();
  for (const auto& [name, m] : model.named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) {
      d->sync_offset_from_device();
      state.dropout_rng[name] = {d->seed, d->offset};
    }
}

void restore_rng_state(nn::Module& model, const GptCheckpointState& state) {
  default_generator().manual_seed(state.generator_seed);
  default_generator().set_offset(state.generator_offset);
  for (const auto& [name, m] : model.named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) {
      auto it = state.dropout_rng.find(name);
      KILN_CHECK(it != state.dropout_rng.end(),
                 "the checkpoint has no random state for the dropout '{}' (is it another model's?)", name);
      d->seed = it->second.first;
      d->offset = it->second.second;
    }
}

GptCheckpointSnapshot snapshot_gpt_checkpoint(const nn::Module& model, const optim::Optimizer& optimizer,
                                              GptCheckpointState state) {
  // Host copies that own their bytes: a CPU tensor is cloned (the next step overwrites it in place),
  // a device tensor copied over.
  auto host_copy = [](const TensorDict& tensors) {
    TensorDict out;
    for (const auto& [name, t] : tensors)
      out.insert(name, t.device().is_cpu() ? t.contiguous().clone() : t.to(Device::cpu()));
    return out;
  };
  GptCheckpointSnapshot snapshot;
  snapshot.state = std::move(state);
  snapshot.model = host_copy(model.state_dict());
  snapshot.optimizer = host_copy(optimizer.state_dict());
  snapshot.optimizer_name = optimizer.name();
  return snapshot;
}

fs::path save_gpt_checkpoint(const fs::path& save, const nn::Module& model, const optim::Optimizer& optimizer,
                             const GptCheckpointState& state, int keep_last) {
  CheckpointStore store(save, {.keep_last = keep_last});
  return store.save(gpt_checkpoint_content(model, optimizer, state));
}

std::string gpt_checkpoint_index(const GptCheckpointState& state, const TensorDict& model_state,
                                 const TensorDict& optimizer_state, const std::string& optimizer_name) {
  json rng = {{"generator_seed", state.generator_seed}, {"generator_offset", state.generator_offset}};
  json dropout = json::object();
  for (const auto& [name, so] : state.dropout_rng) dropout[name] = {so.first, so.second};
  rng["dropout"] = dropout;
  json index = {
      {"format", "kiln-pretrain-gpt"},
      {"version", kFormatVersion},
      {"iteration", state.iteration},
      {"consumed_train_samples", state.consumed_train_samples},
      {"rng", rng},
      {"log_window", {{"iterations", state.window_iterations}, {"loss_sum", state.window_loss_sum}}},
      {"skipped_batches", state.skipped_batches},
      {"shape_flags", flags_json(state.shape_flags)},
      {"args", flags_json(state.all_flags)},
      {"optimizer", optimizer_name},
      {"files", {{kModelFile, tensor_list(model_state)}, {kOptimizerFile, tensor_list(optimizer_state)}}},
  };
  return index.dump(1) + "\n";
}

CheckpointContent gpt_checkpoint_content(const nn::Module& model, const optim::Optimizer& optimizer,
                                         const GptCheckpointState& state, const ModelStateLayout* layout) {
  CheckpointContent c;
  c.iteration = state.iteration;
  // The model first, then the optimizer: every rank makes its (collective) gathers in this order.
  TensorDict model_state = layout ? layout->whole(model.state_dict()) : model.state_dict();
  TensorDict optimizer_state = optimizer.state_dict();
  c.text_files.emplace_back(kIndexFile, gpt_checkpoint_index(state, model_state, optimizer_state, optimizer.name()));
  c.files.emplace_back(kModelFile, std::move(model_state));
  c.files.emplace_back(kOptimizerFile, std::move(optimizer_state));
  return c;
}

fs::path write_gpt_checkpoint(const fs::path& save, const GptCheckpointSnapshot& snapshot, int keep_last) {
  CheckpointContent c;
  c.iteration = snapshot.state.iteration;
  c.text_files.emplace_back(
      kIndexFile, gpt_checkpoint_index(snapshot.state, snapshot.model, snapshot.optimizer, snapshot.optimizer_name));
  c.files.emplace_back(kModelFile, snapshot.model);
  c.files.emplace_back(kOptimizerFile, snapshot.optimizer);
  CheckpointStore store(save, {.keep_last = keep_last});
  return store.save(c);
}

std::optional<std::int64_t> latest_checkpoint_iteration(const fs::path& load) {
  const fs::path file = load / kLatestFile;
  if (!fs::exists(file)) return std::nullopt;
  std::ifstream in(file);
  std::string text;
  std::getline(in, text);
  std::int64_t iteration = -1;
  std::size_t used = 0;
  try {
    iteration = std::stoll(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  KILN_CHECK(used > 0 && used == text.size() && iteration >= 0,
             "{} should hold an iteration number, it holds '{}'; fix it or remove it (then the run starts afresh)",
             file.string(), text);
  const fs::path folder = checkpoint_folder(load, iteration);
  KILN_CHECK(fs::is_directory(folder), "{} names iteration {}, but {} does not exist", file.string(), iteration,
             folder.string());
  return iteration;
}

GptCheckpointState load_gpt_checkpoint(const fs::path& load, nn::Module& model, optim::Optimizer* optimizer,
                                       const FlagList& shape_flags, const ModelStateLayout* layout) {
  const LoadedCheckpoint checkpoint = newest_intact(load);
  const fs::path folder = checkpoint.dir;
  const json index = read_index(folder);
  const fs::path index_path = folder / kIndexFile;
  GptCheckpointState state;
  state.folder = folder;
  state.passed_over = checkpoint.passed_over;
  state.shape_flags = flags_from_json(field<json>(index, "shape_flags", index_path), index_path, "shape_flags");
  state.all_flags = flags_from_json(field<json>(index, "args", index_path), index_path, "args");
  const std::string diffs = compare_flags(state.shape_flags, shape_flags);
  KILN_CHECK(diffs.empty(),
             "--load {}: the checkpoint ({}) is of another model than these flags make:{}\npass the checkpoint's "
             "values, or --load a checkpoint of this model",
             load.string(), folder.filename().string(), diffs);
  state.iteration = field<std::int64_t>(index, "iteration", index_path);
  state.consumed_train_samples = field<std::int64_t>(index, "consumed_train_samples", index_path);
  const json rng = field<json>(index, "rng", index_path);
  state.generator_seed = field<std::uint64_t>(rng, "generator_seed", index_path);
  state.generator_offset = field<std::uint64_t>(rng, "generator_offset", index_path);
  const json dropout = field<json>(rng, "dropout", index_path);
  KILN_CHECK(dropout.is_object(), "{}: rng.dropout is not an object", index_path.string());
  for (const auto& [name, so] : dropout.items()) {
    KILN_CHECK(so.is_array() && so.size() == 2, "{}: rng.dropout.{} is not [seed, offset]", index_path.string(), name);
    state.dropout_rng[name] = {so[0].get<std::uint64_t>(), so[1].get<std::uint64_t>()};
  }
  const json window = field<json>(index, "log_window", index_path);
  state.window_iterations = field<std::int64_t>(window, "iterations", index_path);
  state.window_loss_sum = field<double>(window, "loss_sum", index_path);
  state.skipped_batches = index.value("skipped_batches", std::string());

  const fs::path model_file = folder / kModelFile;
  const TensorDict weights = layout ? layout->local(checkpoint.file(kModelFile)) : checkpoint.file(kModelFile);
  check_model_tensors(model_file, weights, model);
  // check_model_tensors has matched every tensor but FP8 scaling state; that is loaded where both have it.
  TensorDict loadable;
  const TensorDict targets = model.state_dict();
  for (const auto& [name, t] : weights)
    if (targets.contains(name)) loadable.insert(name, t);
  model.load_state_dict(loadable, /*strict=*/false);
  if (optimizer) {
    const fs::path optimizer_file = folder / kOptimizerFile;
    try {
      optimizer->load_state_dict(checkpoint.file(kOptimizerFile));
    } catch (const Error& e) {
      KILN_FAIL(
          "checkpoint {}: {}\nto train from its weights alone (an import-hf checkpoint, another optimizer), pass "
          "--finetune (iteration 0) or --no-load-optim (the iteration continues)",
          optimizer_file.string(), e.what());
    }
  }
  restore_rng_state(model, state);
  return state;
}

GptCheckpointWeights read_gpt_checkpoint_weights(const fs::path& load) {
  const LoadedCheckpoint checkpoint = newest_intact(load);
  const fs::path folder = checkpoint.dir;
  const json index = read_index(folder);
  const fs::path index_path = folder / kIndexFile;
  GptCheckpointWeights out;
  out.folder = folder;
  out.passed_over = checkpoint.passed_over;
  out.iteration = field<std::int64_t>(index, "iteration", index_path);
  out.shape_flags = flags_from_json(field<json>(index, "shape_flags", index_path), index_path, "shape_flags");
  out.all_flags = flags_from_json(field<json>(index, "args", index_path), index_path, "args");
  out.model = checkpoint.file(kModelFile);
  return out;
}

}  // namespace kiln::train
