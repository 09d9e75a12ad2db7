#pragma once
// The optimizer's state dict names each per-parameter tensor "state.<i>.<name>" (optim/); the data-
// and tensor-parallel checkpoint code both read the parameter index back from those keys.
#include <charconv>
#include <cstddef>
#include <optional>
#include <string>
#include <utility>

namespace kiln::train {

// "state.<i>.<name>" -> (i, name); anything else -> nullopt.
inline std::optional<std::pair<std::size_t, std::string>> parse_optimizer_state_key(const std::string& key) {
  if (!key.starts_with("state.")) return std::nullopt;
  const std::size_t dot = key.find('.', 6);
  if (dot == std::string::npos) return std::nullopt;
  std::size_t i = 0;
  const auto [end, ec] = std::from_chars(key.data() + 6, key.data() + dot, i);
  if (ec != std::errc() || end != key.data() + dot) return std::nullopt;
  return std::make_pair(i, key.substr(dot + 1));
}

}  // namespace kiln::train
