#include "kiln/train/training_state.h"

#include <fmt/format.h>

#include <charconv>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

namespace kiln::train {

namespace {

// JSON has no NaN or inf: nlohmann writes them as null, and null reads back as NaN.
double number_or_nan(const nlohmann::json& v) {
  return v.is_null() ? std::numeric_limits<double>::quiet_NaN() : v.get<double>();
}

class MetadataReader {
 public:
  MetadataReader(const CheckpointMetadata& metadata, const std::filesystem::path& file)
      : metadata_(metadata), file_(file.string()) {}

  const std::string* find(const std::string& key) const {
    auto it = metadata_.find(key);
    return it == metadata_.end() ? nullptr : &it->second;
  }
  const std::string& require(const std::string& key) const {
    const std::string* v = find(key);
    KILN_CHECK(v, "checkpoint {}: its metadata has no '{}' (not written by this trainer, or damaged)", file_, key);
    return *v;
  }
  int whole_number(const std::string& key, int lo, int hi) const {
    const std::string& text = require(key);
    int value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    KILN_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= lo && value <= hi,
               "checkpoint {}: metadata '{}' is '{}'; expected a whole number from {} to {}", file_, key, text, lo, hi);
    return value;
  }
  double fraction(const std::string& key) const {
    const std::string& text = require(key);
    double value = 0;
    auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
    KILN_CHECK(ec == std::errc() && end == text.data() + text.size() && value >= 0 && value <= 1,
               "checkpoint {}: metadata '{}' is '{}'; expected a number from 0 to 1", file_, key, text);
    return value;
  }
  const std::string& file() const { return file_; }

 private:
  const CheckpointMetadata& metadata_;
  std::string file_;
};

std::vector<EpochReport> parse_history(const MetadataReader& m, int epochs) {
  const std::string& text = m.require("history");
  nlohmann::json h;
  try {
    h = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    KILN_FAIL("checkpoint {}: metadata 'history' is not valid JSON: {}", m.file(), e.what());
  }
  KILN_CHECK(h.is_array(), "checkpoint {}: metadata 'history' is not a JSON array", m.file());
  KILN_CHECK(h.size() == static_cast<std::size_t>(epochs),
             "checkpoint {}: metadata 'history' has {} entries but 'epoch' says {} epochs were completed", m.file(),
             h.size(), epochs);
  std::vector<EpochReport> out;
  for (std::size_t i = 0; i < h.size(); ++i) {
    const nlohmann::json& e = h[i];
    KILN_CHECK(e.is_object(), "checkpoint {}: metadata 'history' entry {} is not a JSON object", m.file(), i + 1);
    auto field = [&](const char* key, bool may_be_null) -> const nlohmann::json& {
      KILN_CHECK(e.contains(key), "checkpoint {}: metadata 'history' entry {} has no '{}'", m.file(), i + 1, key);
      const nlohmann::json& v = e[key];
      KILN_CHECK(v.is_number() || (may_be_null && v.is_null()),
                 "checkpoint {}: metadata 'history' entry {}: '{}' is {}; expected a number", m.file(), i + 1, key,
                 v.dump());
      return v;
    };
    EpochReport r;
    const nlohmann::json& ep = field("epoch", false);
    KILN_CHECK(ep.is_number_integer() && ep.get<std::int64_t>() == static_cast<std::int64_t>(i + 1),
               "checkpoint {}: metadata 'history' entry {} is for epoch {}; expected epoch {}", m.file(), i + 1,
               ep.dump(), i + 1);
    r.epoch = static_cast<int>(i + 1);
    r.train_loss = number_or_nan(field("train_loss", true));
    r.val_loss = number_or_nan(field("val_loss", true));
    r.train_accuracy = field("train_accuracy", false).get<double>();
    r.val_accuracy = field("val_accuracy", false).get<double>();
    for (auto [key, v] : {std::pair{"train_accuracy", r.train_accuracy}, std::pair{"val_accuracy", r.val_accuracy}})
      KILN_CHECK(v >= 0 && v <= 1, "checkpoint {}: metadata 'history' entry {}: '{}' is {}; expected 0 to 1", m.file(),
                 i + 1, key, v);
    r.seconds = number_or_nan(field("seconds", true));
    r.images_per_second = number_or_nan(field("images_per_second", true));
    r.lr = number_or_nan(field("lr", true));
    out.push_back(r);
  }
  return out;
}

}  // namespace

CheckpointMetadata training_metadata(const std::string& model, const TrainingState& state) {
  nlohmann::json h = nlohmann::json::array();
  for (const auto& e : state.history)
    h.push_back({{"epoch", e.epoch},
                 {"train_loss", e.train_loss},
                 {"train_accuracy", e.train_accuracy},
                 {"val_loss", e.val_loss},
                 {"val_accuracy", e.val_accuracy},
                 {"seconds", e.seconds},
                 {"images_per_second", e.images_per_second},
                 {"lr", e.lr}});
  CheckpointMetadata meta{{"model", model},
                          {"epoch", std::to_string(state.epoch)},
                          {"history", h.dump()},
                          {"normalization", state.normalization},
                          {"best_epoch", std::to_string(state.best_epoch)},
                          {"best_val_accuracy", fmt::format("{}", state.best_val_accuracy)}};
  if (!state.history.empty()) meta["val_accuracy"] = fmt::format("{}", state.history.back().val_accuracy);
  return meta;
}

TrainingState training_state_from_metadata(const CheckpointMetadata& metadata, const std::filesystem::path& file,
                                           int min_epoch) {
  MetadataReader m(metadata, file);
  TrainingState s;
  s.epoch = m.whole_number("epoch", min_epoch, kMaxEpochs);
  s.history = parse_history(m, s.epoch);
  if (s.epoch == 0) {
    // Nothing evaluated yet: no best.
  } else if (m.find("best_epoch")) {
    s.best_epoch = m.whole_number("best_epoch", 1, s.epoch);
    s.best_val_accuracy = m.fraction("best_val_accuracy");
  } else {  // written before the best was recorded: the first epoch of the highest accuracy
    for (const auto& e : s.history)
      if (s.best_epoch == 0 || e.val_accuracy > s.best_val_accuracy)
        s.best_val_accuracy = e.val_accuracy, s.best_epoch = e.epoch;
  }
  if (const std::string* n = m.find("normalization")) {
    KILN_CHECK(*n == "half" || *n == "cifar", "checkpoint {}: metadata 'normalization' is '{}'; expected half or cifar",
               m.file(), *n);
    s.normalization = *n;
  }
  return s;
}

}  // namespace kiln::train
