#pragma once
// CheckpointStore: a folder of training checkpoints that a kill, a full disk or a flipped bit
// never makes lose the run. Layout (Megatron-LM's, plus checksums):
//
//   <root>/iter_0000120/{model.safetensors, optimizer.safetensors, ..., manifest.json}
//   <root>/iter_0000240/...
//   <root>/latest_checkpointed_iteration.txt      "240"
//
// A checkpoint is a folder of safetensors files (any names and number: the caller's), optional
// small text files, and a manifest.json holding, per file, its size and CRC-32C, plus the caller's metadata (string
// map). save(): the files and the manifest are written into `.iter_N.tmp.<pid>/`, each fsynced; the folder is renamed
// to iter_N (the commit point) and the root fsynced; then the tracker file is replaced atomically. A process killed at
// any moment leaves the previous checkpoints as they were plus, at worst, a temporary folder that the next open()
// removes. load_newest_intact(): the newest iter_* whose manifest parses and whose files all have the recorded size and
// checksum; every newer one passed over is reported with the reason (missing file, wrong size, checksum mismatch, no
// manifest). The newest complete folder is the truth; the tracker is kept for tools that read Megatron's layout.
// keep_last K: after a save, folders beyond the K newest are deleted, but only once the newest has
// been read back and verified, so the only intact checkpoint is never the one deleted.
//
// API the trainers use (train-cifar10 now, pretrain-gpt at merge):
//   CheckpointStore store(dir, {.keep_last = 3});
//   store.save({.iteration = it, .files = {{"model.safetensors", model_tensors}, ...}, .metadata = meta});
//   if (auto c = store.load_newest_intact()) { c->file("model.safetensors"); c->metadata; c->passed_over; }
// Saves are synchronous here; AsyncCheckpointSaver (async_checkpoint_saver.h) runs them on a thread.
// Fault hooks (fault_injection.h): kill_in_save, disk_full_in_save, corrupt_checkpoint.
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/tensor/ordered_dict.h"
#include "kiln/train/checkpoint.h"

namespace kiln::train {

struct CheckpointContent {
  std::int64_t iteration = 0;                             // >= 0; names the folder
  std::vector<std::pair<std::string, TensorDict>> files;  // file name (no '/') -> tensors
  CheckpointMetadata metadata;                            // kept in manifest.json
  // Small files that are not tensors (a trainer's own index, e.g. pretrain-gpt's checkpoint.json):
  // name -> bytes, written, fsynced and checksummed like the tensor files; read back by path.
  std::vector<std::pair<std::string, std::string>> text_files;
};

struct LoadedCheckpoint : CheckpointContent {
  std::filesystem::path dir;
  // Newer checkpoints that were not usable, newest first: "iter_0000240: model.safetensors: ...".
  std::vector<std::string> passed_over;
  const TensorDict& file(const std::string& name) const;  // throws naming the checkpoint if absent
};

struct CheckpointStoreOptions {
  int keep_last = 0;  // 0: keep every checkpoint
};

class CheckpointStore {
 public:
  // Creates `root` if needed and removes temporaries of killed saves (saying so on stdout).
  explicit CheckpointStore(std::filesystem::path root, CheckpointStoreOptions options = {});

  // Writes a checkpoint (replacing one of the same iteration); returns its folder. On an error
  // (a full disk: the message says "No space left on device") the temporary folder is removed and
  // the store is as before; the error names the file and says which checkpoint is still the latest.
  std::filesystem::path save(const CheckpointContent& content);

  // The newest intact checkpoint, or nullopt when there is none (passed_over() then says why each
  // folder was refused).
  std::optional<LoadedCheckpoint> load_newest_intact();

  // Why the checkpoint of `iteration` is not intact, or nullopt when it is (reads every file).
  std::optional<std::string> verify(std::int64_t iteration) const;

  // The iterations of the iter_* folders present, oldest first.
  std::vector<std::int64_t> iterations() const;
  // What the tracker file says (nullopt: no tracker, or unreadable).
  std::optional<std::int64_t> tracked_iteration() const;
  // The reasons of the last load_newest_intact() for the folders it refused.
  const std::vector<std::string>& passed_over() const { return passed_over_; }

  std::filesystem::path dir_of(std::int64_t iteration) const;
  const std::filesystem::path& root() const { return root_; }
  static constexpr const char* kManifest = "manifest.json";
  static constexpr const char* kTracker = "latest_checkpointed_iteration.txt";

 private:
  void apply_retention(std::int64_t newest);
  std::filesystem::path root_;
  CheckpointStoreOptions options_;
  std::int64_t saves_ = 0;  // this process's saves, for the fault hooks
  std::vector<std::string> passed_over_;
};

// The "iter_0000123" of an iteration; parse_iteration_dir is its inverse (nullopt for other names).
std::string iteration_dir_name(std::int64_t iteration);
std::optional<std::int64_t> parse_iteration_dir(const std::string& name);

}  // namespace kiln::train
