#include "kiln/train/training_log.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "kiln/io/atomic_file.h"

namespace kiln::train {

nlohmann::json epoch_log_record(const EpochReport& r, const std::string& model, const std::string& device) {
  nlohmann::json j = {{"epoch", r.epoch},
                      {"train_loss", r.train_loss},
                      {"train_accuracy", r.train_accuracy},
                      {"val_loss", r.val_loss},
                      {"val_accuracy", r.val_accuracy},
                      {"epoch_seconds", r.seconds},
                      {"images_per_second", r.images_per_second}};
  if (r.peak_memory_bytes) j["peak_memory_bytes"] = r.peak_memory_bytes;
  j["lr"] = r.lr;
  j["model"] = model;
  if (!device.empty()) j["device"] = device;
  return j;
}

std::string reconcile_training_log(const std::filesystem::path& path, const std::vector<EpochReport>& history,
                                   const std::string& model) {
  const std::int64_t epochs = static_cast<std::int64_t>(history.size());
  std::string old_text;
  if (std::ifstream in(path, std::ios::binary); in) old_text.assign(std::istreambuf_iterator<char>(in), {});

  std::map<std::int64_t, std::string> kept;  // epoch -> its line as logged (the last one wins)
  std::size_t dropped = 0;
  std::size_t pos = 0;
  while (pos < old_text.size()) {
    std::size_t end = old_text.find('\n', pos);
    const bool torn = end == std::string::npos;  // killed mid-line: no newline at the end
    std::string line = old_text.substr(pos, torn ? std::string::npos : end - pos);
    pos = torn ? old_text.size() : end + 1;
    if (line.empty()) continue;
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    const bool ok = !torn && j.is_object() && j.contains("epoch") && j["epoch"].is_number_integer() &&
                    j["epoch"].get<std::int64_t>() >= 1 && j["epoch"].get<std::int64_t>() <= epochs;
    if (!ok) {
      ++dropped;
      continue;
    }
    const std::int64_t e = j["epoch"].get<std::int64_t>();
    if (kept.count(e)) ++dropped;
    kept[e] = line;
  }
  std::vector<int> restored;
  std::string new_text;
  for (const EpochReport& r : history) {
    auto it = kept.find(r.epoch);
    if (it != kept.end()) {
      new_text += it->second + "\n";
    } else {
      new_text += epoch_log_record(r, model, "").dump() + "\n";
      restored.push_back(r.epoch);
    }
  }
  if (new_text == old_text) return "";
  io::AtomicFile out(path);
  out.write(new_text);
  out.commit();
  std::string what;
  if (!restored.empty())
    what += fmt::format("restored epoch{} {} from the checkpoint", restored.size() > 1 ? "s" : "",
                        fmt::join(restored, ", "));
  if (dropped)
    what += fmt::format("{}dropped {} line{} not matching the checkpoint's epochs 1..{}", what.empty() ? "" : "; ",
                        dropped, dropped > 1 ? "s" : "", epochs);
  if (what.empty()) what = "rewrote it to match the checkpoint";
  return fmt::format("{}: {}", path.string(), what);
}

}  // namespace kiln::train
