#pragma once
// pretrain-gpt checkpoints, in Megatron-LM's layout of folders:
//
//   <save>/latest_checkpointed_iteration.txt   "1000": the newest complete checkpoint
//   <save>/iter_0001000/model.safetensors      the model's state_dict (Megatron-core names)
//   <save>/iter_0001000/optimizer.safetensors  fp32 masters, Adam moments, step (FlatOptimizer)
//   <save>/iter_0001000/checkpoint.json        the index: iteration, consumed samples, the RNG
//                                              states, the skip list of --rewind, the model's
//                                              flags, the run's flags, and per file the tensors it
//                                              holds with dtype and shape
//   <save>/iter_0001000/manifest.json          size and CRC-32C of each file (CheckpointStore)
//
// The folders are a CheckpointStore (checkpoint_store.h): written into `.iter_XXXXXXX.tmp.<pid>`,
// each file fsynced, renamed into place, then the tracker replaced atomically; a killed save leaves
// the previous checkpoint intact (the next run removes the temporary folder). Loading takes the
// newest folder whose files match their manifest and reports each newer one it passed over.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/nn/module.h"
#include "kiln/optim/optimizer.h"
#include "kiln/train/checkpoint_store.h"

namespace kiln::train {

// Everything besides tensors that a resumed run needs to continue bit-identically.
struct GptCheckpointState {
  std::int64_t iteration = 0;
  std::int64_t consumed_train_samples = 0;
  // The default generator's (seed, offset) and every dropout module's (seed, offset), by module path.
  std::uint64_t generator_seed = 0, generator_offset = 0;
  std::map<std::string, std::pair<std::uint64_t, std::uint64_t>> dropout_rng;
  // The log window in progress (iterations since the last log line and their loss and time sums),
  // so that the first log line after a resume is the one the uninterrupted run prints.
  std::int64_t window_iterations = 0;
  double window_loss_sum = 0;
  // "--flag" -> value of the model's shape, and of the whole run (for the record).
  std::vector<std::pair<std::string, std::string>> shape_flags, all_flags;
  // The steps (global batches, 1-based) that --rewind rolled back and skips: skip_list_text form.
  std::string skipped_batches;
  // Filled by load_gpt_checkpoint: the folder loaded, and the newer ones passed over with the reason.
  std::filesystem::path folder;
  std::vector<std::string> passed_over;
};

// The folder of iteration `iteration` under `save`: iter_0001000 (seven digits, as Megatron).
std::filesystem::path checkpoint_folder(const std::filesystem::path& save, std::int64_t iteration);

// What a checkpoint holds, copied off the training tensors onto the host: training may go on while
// write_gpt_checkpoint writes it (from another thread, for an asynchronous save).
struct GptCheckpointSnapshot {
  GptCheckpointState state;
  TensorDict model, optimizer;  // host tensors that own their storage
  std::string optimizer_name;
};
GptCheckpointSnapshot snapshot_gpt_checkpoint(const nn::Module& model, const optim::Optimizer& optimizer,
                                              GptCheckpointState state);

// Writes the checkpoint of `snapshot.state.iteration` (replacing one of the same iteration) and
// makes it the latest; with keep_last > 0, older folders beyond that many go. Returns its folder.
std::filesystem::path write_gpt_checkpoint(const std::filesystem::path& save, const GptCheckpointSnapshot& snapshot,
                                           int keep_last = 0);

// How a model split over ranks (tensor parallelism) turns its state_dict of shards into the whole
// tensors a checkpoint holds (whole: collective over the ranks holding the shards) and back (local).
// Null where a function takes one: the state_dict is the checkpoint's as it is.
struct ModelStateLayout {
  std::function<TensorDict(const TensorDict& local)> whole;
  std::function<TensorDict(const TensorDict& whole)> local;
};

// What a CheckpointStore (or an AsyncCheckpointSaver, which copies it to the host) writes: the live
// state dicts of the model and the optimizer (no copy; whole tensors through `layout`, which is
// collective) and the checkpoint.json index.
CheckpointContent gpt_checkpoint_content(const nn::Module& model, const optim::Optimizer& optimizer,
                                         const GptCheckpointState& state, const ModelStateLayout* layout = nullptr);

// Writes the live state synchronously (import-hf, tests).
std::filesystem::path save_gpt_checkpoint(const std::filesystem::path& save, const nn::Module& model,
                                          const optim::Optimizer& optimizer, const GptCheckpointState& state,
                                          int keep_last = 0);

// The iteration latest_checkpointed_iteration.txt names, nullopt when `load` has none (a fresh
// run). Throws naming the file when it is malformed or names a folder that is missing.
std::optional<std::int64_t> latest_checkpoint_iteration(const std::filesystem::path& load);

// Loads the newest intact checkpoint under `load` (state.passed_over: the newer ones refused, and why) into the model
// and (when given) the optimizer, and returns its state. Before any tensor: the checkpoint's shape flags must equal
// `shape_flags` (else an error naming each flag with both values); then every tensor's shape and dtype (an error names
// the tensor and, where one explains it, the flag).
// With a layout, the checkpoint's whole tensors are sliced to this rank's shards first.
GptCheckpointState load_gpt_checkpoint(const std::filesystem::path& load, nn::Module& model,
                                       optim::Optimizer* optimizer,
                                       const std::vector<std::pair<std::string, std::string>>& shape_flags,
                                       const ModelStateLayout* layout = nullptr);

// The shape flags of the checkpoint under `load` (for tools that build the model from them:
// generate, export-hf) and the model's tensors.
struct GptCheckpointWeights {
  std::int64_t iteration = 0;
  std::vector<std::pair<std::string, std::string>> shape_flags, all_flags;
  TensorDict model;
  std::filesystem::path folder;          // the folder read: the newest intact one
  std::vector<std::string> passed_over;  // newer folders refused, with the reason
};
GptCheckpointWeights read_gpt_checkpoint_weights(const std::filesystem::path& load);

// Reads and writes the RNG state of the default generator and every nn::Dropout of `model`.
void capture_rng_state(const nn::Module& model, GptCheckpointState& state);
void restore_rng_state(nn::Module& model, const GptCheckpointState& state);

}  // namespace kiln::train
