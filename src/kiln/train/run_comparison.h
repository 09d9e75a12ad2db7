#pragma once
// Training runs side by side, from the log.jsonl files `kiln pretrain-gpt` writes (--log-dir, else
// --save): each run's training and validation losses by iteration, a summary of where each ended
// against a reference run, and one figure of all their curves. `kiln compare-runs` prints and draws
// them: an FP8 recipe against the bf16 run from the same start (docs/llm.md), two learning rates,
// a resumed run against the straight one.
#include <cstddef>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

namespace kiln::train {

struct RunLog {
  std::string label;
  std::filesystem::path path;                    // the log.jsonl read
  std::vector<double> iterations, train_loss;    // "lm_loss" at each logged iteration
  std::vector<double> val_iterations, val_loss;  // "validation_loss"
};

// Reads `path`: a log.jsonl, or a directory holding one. Every line must be a JSON object; lines
// without the losses (other records) are skipped. Errors name the file and the line. A log
// without a training loss is refused.
RunLog read_run_log(const std::filesystem::path& path, std::string label);

struct RunSummary {
  std::string label;
  double last_iteration = 0;
  // The mean training loss of the last `window` logged iterations (a single logged value is noisy).
  double final_train_loss = 0;
  std::optional<double> final_val_loss;  // the last validation loss, if the run evaluated
  // Relative to the reference run: (this - reference) / reference. 0 for the reference itself;
  // the validation one only when both evaluated.
  double train_vs_reference = 0;
  std::optional<double> val_vs_reference;
  // The largest |relative difference| of the windowed training loss over the iterations both
  // logged, from the first `window` on (how far apart the curves ever were, not just at the end).
  double max_train_gap = 0;
};

// One summary per run, in order. `reference` indexes runs; window >= 1.
std::vector<RunSummary> summarize_runs(const std::vector<RunLog>& runs, std::size_t reference, std::size_t window);

// The summaries as an aligned text table (one row per run, the reference marked).
std::string format_run_summaries(const std::vector<RunSummary>& summaries, std::size_t reference);

// Training loss (windowed) and validation loss of every run in two panels, one colour per run.
void write_runs_figure(const std::filesystem::path& png, const std::vector<RunLog>& runs, const std::string& title,
                       std::size_t window);

}  // namespace kiln::train
