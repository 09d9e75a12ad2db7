#pragma once
// The training log (log.jsonl): one JSON object per epoch. A resumed run continues it from the
// checkpoint it resumes: lines of epochs the checkpoint does not hold (a run killed after logging,
// or resumed from an older checkpoint) are dropped, a torn last line too, and epochs the log lacks
// (a run killed between saving the checkpoint and logging) are restored from the checkpoint's
// history, so the log reads 1, 2, 3, ... with no gap or repeat.
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "kiln/train/image_classifier_trainer.h"

namespace kiln::train {

// The line logged for epoch `r` (peak memory and the device only when known: restored epochs
// lack them).
nlohmann::json epoch_log_record(const EpochReport& r, const std::string& model, const std::string& device);

// Rewrites `path` (atomically, and only when something changes) to hold exactly one line per
// epoch of `history` (epochs 1..n), keeping the line already logged for an epoch where there is
// one. Returns what it changed, for the user ("" when nothing).
std::string reconcile_training_log(const std::filesystem::path& path, const std::vector<EpochReport>& history,
                                   const std::string& model);

}  // namespace kiln::train
