#include "kiln/train/run_comparison.h"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/io/line_plot.h"
#include "kiln/runtime/error.h"

namespace kiln::train {

namespace fs = std::filesystem;
using json = nlohmann::json;

RunLog read_run_log(const fs::path& path, std::string label) {
  RunLog log;
  log.label = std::move(label);
  log.path = fs::is_directory(path) ? path / "log.jsonl" : path;
  std::ifstream in(log.path);
  KILN_CHECK(
      in.good(), "compare-runs: cannot read {}{}", log.path.string(),
      fs::is_directory(path) ? " (the run directory holds no log.jsonl: pass pretrain-gpt's --log-dir or --save)" : "");
  std::string line;
  std::int64_t number = 0;
  while (std::getline(in, line)) {
    ++number;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const json j = json::parse(line, nullptr, false);
    KILN_CHECK(!j.is_discarded() && j.is_object(), "compare-runs: {} line {} is not a JSON object: {}",
               log.path.string(), number, line.substr(0, 80));
    if (!j.contains("iteration") || (!j.contains("lm_loss") && !j.contains("validation_loss"))) continue;
    KILN_CHECK(j["iteration"].is_number(), "compare-runs: {} line {}: \"iteration\" is not a number", log.path.string(),
               number);
    const double it = j["iteration"].get<double>();
    auto loss = [&](const char* key) {
      KILN_CHECK(j[key].is_number(), "compare-runs: {} line {}: \"{}\" is not a number", log.path.string(), number,
                 key);
      return j[key].get<double>();
    };
    if (j.contains("lm_loss")) {
      log.iterations.push_back(it);
      log.train_loss.push_back(loss("lm_loss"));
    }
    if (j.contains("validation_loss")) {
      log.val_iterations.push_back(it);
      log.val_loss.push_back(loss("validation_loss"));
    }
  }
  KILN_CHECK(!log.train_loss.empty(), "compare-runs: {} holds no training loss (\"lm_loss\" lines)", log.path.string());
  return log;
}

namespace {

// The mean of the last `window` values up to and including each index.
std::vector<double> trailing_mean(const std::vector<double>& v, std::size_t window) {
  std::vector<double> out(v.size());
  double sum = 0;
  for (std::size_t i = 0; i < v.size(); ++i) {
    sum += v[i];
    if (i >= window) sum -= v[i - window];
    out[i] = sum / static_cast<double>(std::min(i + 1, window));
  }
  return out;
}

}  // namespace

std::vector<RunSummary> summarize_runs(const std::vector<RunLog>& runs, std::size_t reference, std::size_t window) {
  KILN_CHECK(reference < runs.size(), "compare-runs: the reference run {} is not among the {} runs", reference + 1,
             runs.size());
  KILN_CHECK(window >= 1, "compare-runs: the window must be at least 1 logged iteration");
  const RunLog& ref = runs[reference];
  const std::vector<double> ref_smooth = trailing_mean(ref.train_loss, window);
  std::map<double, double> ref_at;  // iteration -> windowed reference loss
  for (std::size_t i = window - 1; i < ref_smooth.size(); ++i) ref_at[ref.iterations[i]] = ref_smooth[i];
  std::vector<RunSummary> out;
  for (const RunLog& r : runs) {
    RunSummary s;
    s.label = r.label;
    s.last_iteration = r.iterations.back();
    const std::vector<double> smooth = trailing_mean(r.train_loss, window);
    s.final_train_loss = smooth.back();
    if (!r.val_loss.empty()) s.final_val_loss = r.val_loss.back();
    out.push_back(s);
    for (std::size_t i = window - 1; i < smooth.size(); ++i)
      if (const auto it = ref_at.find(r.iterations[i]); it != ref_at.end())
        out.back().max_train_gap =
            std::max(out.back().max_train_gap, std::fabs(smooth[i] - it->second) / std::fabs(it->second));
  }
  const RunSummary& base = out[reference];
  for (RunSummary& s : out) {
    s.train_vs_reference = (s.final_train_loss - base.final_train_loss) / std::fabs(base.final_train_loss);
    if (s.final_val_loss && base.final_val_loss)
      s.val_vs_reference = (*s.final_val_loss - *base.final_val_loss) / std::fabs(*base.final_val_loss);
  }
  return out;
}

std::string format_run_summaries(const std::vector<RunSummary>& summaries, std::size_t reference) {
  std::size_t width = 3;
  for (const auto& s : summaries) width = std::max(width, s.label.size());
  std::string t = fmt::format("{:<{}}  {:>9}  {:>10}  {:>8}  {:>9}  {:>8}  {:>8}\n", "run", width, "iteration",
                              "train loss", "vs ref", "val loss", "vs ref", "max gap");
  for (std::size_t i = 0; i < summaries.size(); ++i) {
    const RunSummary& s = summaries[i];
    const std::string val = s.final_val_loss ? fmt::format("{:.4f}", *s.final_val_loss) : "-";
    const std::string val_rel = i == reference       ? "(ref)"
                                : s.val_vs_reference ? fmt::format("{:+.2f}%", 100 * *s.val_vs_reference)
                                                     : "-";
    t += fmt::format("{:<{}}  {:>9.0f}  {:>10.4f}  {:>8}  {:>9}  {:>8}  {:>7.2f}%\n", s.label, width, s.last_iteration,
                     s.final_train_loss, i == reference ? "(ref)" : fmt::format("{:+.2f}%", 100 * s.train_vs_reference),
                     val, val_rel, 100 * s.max_train_gap);
  }
  return t;
}

void write_runs_figure(const fs::path& png, const std::vector<RunLog>& runs, const std::string& title,
                       std::size_t window) {
  // Tableau's ten colours, in order.
  static constexpr std::array<std::array<double, 3>, 10> kColours = {{{0.12, 0.47, 0.71},
                                                                      {1.00, 0.50, 0.05},
                                                                      {0.17, 0.63, 0.17},
                                                                      {0.84, 0.15, 0.16},
                                                                      {0.58, 0.40, 0.74},
                                                                      {0.55, 0.34, 0.29},
                                                                      {0.89, 0.47, 0.76},
                                                                      {0.50, 0.50, 0.50},
                                                                      {0.74, 0.74, 0.13},
                                                                      {0.09, 0.75, 0.81}}};
  io::PlotPanel train, val;
  train.title = window > 1 ? fmt::format("training loss (mean of {} logged iterations)", window) : "training loss";
  val.title = "validation loss";
  train.x_label = val.x_label = "iteration";
  train.y_label = val.y_label = "cross-entropy (nats)";
  for (std::size_t i = 0; i < runs.size(); ++i) {
    const auto& c = kColours[i % kColours.size()];
    io::LineSeries s;
    s.label = runs[i].label;
    s.red = c[0], s.green = c[1], s.blue = c[2];
    s.dashed = i >= kColours.size();
    s.markers = false;
    s.x = runs[i].iterations;
    s.y = trailing_mean(runs[i].train_loss, window);
    train.series.push_back(s);
    if (!runs[i].val_loss.empty()) {
      s.x = runs[i].val_iterations;
      s.y = runs[i].val_loss;
      s.markers = true;
      val.series.push_back(std::move(s));
    }
  }
  io::LineFigure figure;
  figure.title = title;
  figure.panels.push_back(std::move(train));
  if (!val.series.empty()) figure.panels.push_back(std::move(val));
  io::write_line_figure(png, figure);
}

}  // namespace kiln::train
