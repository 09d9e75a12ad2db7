#include "kiln/train/rewind_policy.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <nlohmann/json.hpp>

#include "kiln/runtime/error.h"

namespace kiln::train {

void check_rewind_options(const RewindOptions& o) {
  check_anomaly_thresholds(o.thresholds);
  KILN_CHECK(o.snapshot_interval >= 0, "--rewind-snapshot-interval must be >= 0 (0: the last checkpoint), got {}",
             o.snapshot_interval);
  KILN_CHECK(o.max_rewinds >= 1, "--rewind-max must be >= 1, got {}", o.max_rewinds);
  KILN_CHECK(o.max_rewinds_window >= 1, "--rewind-max-window must be >= 1 step, got {}", o.max_rewinds_window);
  KILN_CHECK(std::isfinite(o.lr_factor) && o.lr_factor > 0 && o.lr_factor <= 1,
             "--rewind-lr-factor must be a number in (0, 1], got {}", o.lr_factor);
  KILN_CHECK(o.lr_steps >= 0, "--rewind-lr-steps must be >= 0, got {}", o.lr_steps);
}

RewindPolicy::RewindPolicy(RewindOptions options) : options_(options) { check_rewind_options(options_); }

bool RewindPolicy::snapshot_due(std::int64_t steps_done) const {
  return options_.snapshot_interval > 0 && steps_done % options_.snapshot_interval == 0;
}

void RewindPolicy::record(const RewindEvent& event) {
  events_.push_back(event);
  if (options_.lr_steps > 0 && options_.lr_factor < 1) {
    lowered_from_ = event.restored_to + 1;
    lowered_until_ = event.restored_to + options_.lr_steps;
  }
  int recent = 0;
  for (const auto& e : events_)
    if (e.step > event.step - options_.max_rewinds_window) ++recent;
  KILN_CHECK(recent <= options_.max_rewinds,
             "giving up: {} rewinds within {} steps (--rewind-max {} in --rewind-max-window {}); the state itself "
             "keeps going wrong, not a batch. Rewinds so far:\n{}Lower --lr, or resume from an earlier checkpoint",
             recent, options_.max_rewinds_window, options_.max_rewinds, options_.max_rewinds_window, report());
}

double RewindPolicy::lr_scale(std::int64_t step) const {
  return step >= lowered_from_ && step <= lowered_until_ ? options_.lr_factor : 1.0;
}

std::string RewindPolicy::report() const {
  std::string out;
  for (const auto& e : events_)
    out += fmt::format("  step {} ({}: {}) -> rolled back to step {} ({}), batch {} skipped\n", e.step, e.anomaly.kind,
                       e.anomaly.detail, e.restored_to, e.source, e.step);
  return out;
}

nlohmann::json rewind_event_json(const RewindEvent& e) {
  nlohmann::json j{{"event", "rewind"},
                   {"step", e.step},
                   {"kind", e.anomaly.kind},
                   {"detail", e.anomaly.detail},
                   {"restored_to", e.restored_to},
                   {"source", e.source},
                   {"skipped_batch", e.step}};
  // JSON has no NaN or inf: null says "not a number" (nlohmann would write null on dump anyway).
  auto number = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(nullptr); };
  j["loss"] = number(e.loss);
  j["grad_norm"] = number(e.grad_norm);
  return j;
}

std::string skip_list_text(const std::set<std::int64_t>& steps) {
  std::string out;
  for (std::int64_t s : steps) out += fmt::format("{}{}", out.empty() ? "" : ",", s);
  return out;
}

std::set<std::int64_t> parse_skip_list(const std::string& text, const std::string& what) {
  std::set<std::int64_t> out;
  std::size_t pos = 0;
  while (pos <= text.size()) {
    std::size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    item.erase(0, item.find_first_not_of(' '));
    item.erase(item.find_last_not_of(' ') + 1);
    if (!item.empty()) {
      std::int64_t v = 0;
      auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
      KILN_CHECK(ec == std::errc() && end == item.data() + item.size() && v >= 1,
                 "{}: '{}' is not a step number >= 1 (expected e.g. 5,17,230)", what, item);
      out.insert(v);
    }
    pos = comma + 1;
  }
  return out;
}

}  // namespace kiln::train
