#pragma once
// "Did you mean": the known word closest to a mistyped one, for the CLI's unknown-argument messages.
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::cli {

// Edits (insert, delete, substitute, swap two neighbours) that turn a into b: the optimal string
// alignment distance, so "trian" is one edit from "train", as a typist would count it.
int edit_distance(std::string_view a, std::string_view b);

// The candidate a user most likely meant by `word`: the nearest by edit distance when it is close
// (at most a third of the word's length, and at least 2 edits allowed), else the only candidate that
// starts with `word` ("train" -> "train-cifar10"). Nothing when no candidate is plausible.
std::optional<std::string> closest_match(std::string_view word, const std::vector<std::string>& candidates);

}  // namespace kiln::cli
