// `kiln compare-runs RUN...`: training runs side by side from their log.jsonl files (train/run_comparison.h):
// a table of where each ended against the first (or --reference) run, and with --plot one figure
// of all their curves.
#include <fmt/format.h>

#include "commands.h"
#include "kiln/runtime/error.h"
#include "kiln/train/run_comparison.h"

namespace kiln::cli {

void add_compare_runs(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "compare-runs", "Compare training runs' losses from their log.jsonl files: a table against a reference, a plot");
  struct Flags {
    std::vector<std::string> runs, labels;
    std::size_t reference = 1;
    std::size_t window = 5;
    std::string plot, title = "loss curves";
  };
  auto flags = std::make_shared<Flags>();
  cmd->add_option("runs", flags->runs, "run directories (pretrain-gpt's --log-dir or --save) or log.jsonl files")
      ->required();
  cmd->add_option("--labels", flags->labels, "a name per run, in order (default: each run's directory name)")
      ->delimiter(',');
  cmd->add_option("--reference", flags->reference, "the run the others are compared with, counted from 1")
      ->capture_default_str();
  cmd->add_option("--window", flags->window, "training losses averaged over this many logged iterations")
      ->capture_default_str();
  cmd->add_option("--plot", flags->plot, "write the curves to this PNG");
  cmd->add_option("--title", flags->title, "the figure's title")->capture_default_str();
  cmd->footer(
      "Example (an FP8 recipe against bf16 from the same start):\n"
      "  kiln compare-runs runs/bf16 runs/fp8-delayed runs/fp8-blockwise --plot curves.png\n"
      "Columns: the last logged iteration; the training loss (mean of the last --window logged values) and\n"
      "its difference from the reference; the last validation loss and its difference; the largest gap\n"
      "between the windowed training curves at any iteration both logged.");
  cmd->callback([flags] {
    KILN_CHECK(flags->labels.empty() || flags->labels.size() == flags->runs.size(),
               "compare-runs: --labels names {} runs but {} were given", flags->labels.size(), flags->runs.size());
    KILN_CHECK(flags->reference >= 1 && flags->reference <= flags->runs.size(),
               "compare-runs: --reference {} is not one of the {} runs (count from 1)", flags->reference,
               flags->runs.size());
    KILN_CHECK(flags->window >= 1, "compare-runs: --window must be at least 1");
    std::vector<train::RunLog> runs;
    for (std::size_t i = 0; i < flags->runs.size(); ++i) {
      const std::filesystem::path p(flags->runs[i]);
      std::string label = !flags->labels.empty() ? flags->labels[i]
                          : std::filesystem::is_directory(p)
                              ? std::filesystem::absolute(p).filename().string()
                              : std::filesystem::absolute(p).parent_path().filename().string();
      if (label.empty()) label = p.string();
      runs.push_back(train::read_run_log(p, label));
    }
    const std::size_t ref = flags->reference - 1;
    fmt::print("{}", train::format_run_summaries(train::summarize_runs(runs, ref, flags->window), ref));
    if (!flags->plot.empty()) {
      train::write_runs_figure(flags->plot, runs, flags->title, flags->window);
      fmt::print("wrote {}\n", flags->plot);
    }
  });
}

}  // namespace kiln::cli
