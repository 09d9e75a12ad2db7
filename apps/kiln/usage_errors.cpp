#include "usage_errors.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cctype>
#include <optional>
#include <vector>

#include "closest_match.h"

namespace kiln::cli {

namespace {

// "kiln", "kiln hpl", "kiln data cifar10".
std::string command_path(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent())
    if (a->get_parent() != nullptr) names.insert(names.begin(), a->get_name());
  names.insert(names.begin(), "kiln");
  return fmt::format("{}", fmt::join(names, " "));
}

std::vector<CLI::App*> subcommands_of(CLI::App* app) {
  return app->get_subcommands([](CLI::App* s) { return !s->get_name().empty() && !s->get_disabled(); });
}

CLI::App* find_subcommand(CLI::App* app, const std::string& word) {
  for (CLI::App* s : subcommands_of(app))
    if (s->check_name(word)) return s;
  return nullptr;
}

// Options given to a subcommand may belong to it or to a command above it (the main command's
// --verbose and --version: main.cpp turns on CLI11's fallthrough).
const CLI::Option* find_option(const CLI::App* app, const std::string& name) {
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent())
    for (const CLI::Option* o : a->get_options())
      if (o->nonpositional() && o->check_name(name)) return o;
  return nullptr;
}

std::vector<std::string> option_names(const CLI::App* app) {
  std::vector<std::string> names;
  for (const CLI::App* a = app; a != nullptr; a = a->get_parent())
    for (const CLI::Option* o : a->get_options()) {
      for (const auto& l : o->get_lnames()) names.push_back("--" + l);
      for (const auto& s : o->get_snames()) names.push_back("-" + s);
    }
  return names;
}

// CLI11 takes "-1" and "-.5" as values, not as short options.
bool looks_like_option(const std::string& word) {
  if (word.size() < 2 || word[0] != '-') return false;
  return !(std::isdigit(static_cast<unsigned char>(word[1])) || word[1] == '.');
}

std::string did_you_mean(const std::string& word, const std::vector<std::string>& known) {
  auto guess = closest_match(word, known);
  return guess ? fmt::format("; did you mean '{}'?", *guess) : "";
}

std::vector<std::string> command_names(CLI::App* app) {
  std::vector<std::string> names;
  for (CLI::App* s : subcommands_of(app)) names.push_back(s->get_name());
  return names;
}

std::string unknown_command(CLI::App* app, const std::string& word) {
  auto names = command_names(app);
  return fmt::format("{}: error: unknown command '{}'{}\nthe commands are: {} ({} --help describes them)",
                     command_path(app), word, did_you_mean(word, names), fmt::join(names, ", "), command_path(app));
}

// The message for an unknown or missing word, or nothing when the command line has none.
std::optional<std::string> explain_unknown_arguments(CLI::App& app, int argc, const char* const* argv) {
  CLI::App* current = &app;
  std::size_t positional_values = 0;
  for (int i = 1; i < argc; ++i) {
    const std::string word = argv[i];
    if (word == "--") break;  // the rest are positional values, as CLI11 reads them
    if (looks_like_option(word)) {
      const std::string name = word.substr(0, word.find('='));
      const CLI::Option* option = find_option(current, name);
      if (option == nullptr)
        return fmt::format("{}: error: unknown option '{}'{} ({} --help lists the options)", command_path(current),
                           name, did_you_mean(name, option_names(current)), command_path(current));
      if (name.size() == word.size()) {
        // The option's values follow it, up to its maximum, until the next option or subcommand.
        for (int taken = 0; taken < option->get_expected_max() && i + 1 < argc; ++taken) {
          const std::string next = argv[i + 1];
          if (next == "--" || looks_like_option(next) || find_subcommand(current, next)) break;
          ++i;
        }
      }
      continue;
    }
    if (CLI::App* sub = find_subcommand(current, word)) {
      current = sub;
      positional_values = 0;
      continue;
    }
    std::size_t capacity = 0;
    for (const CLI::Option* o : current->get_options())
      if (!o->nonpositional()) capacity += static_cast<std::size_t>(std::max(o->get_expected_max(), 0));
    if (positional_values < capacity) {
      ++positional_values;
      continue;
    }
    if (!subcommands_of(current).empty()) return unknown_command(current, word);
    return fmt::format("{}: error: unexpected argument '{}' ({} --help lists the options)", command_path(current), word,
                       command_path(current));
  }
  if (current->get_require_subcommand_min() > 0)
    return fmt::format("{}: error: a command is required, one of: {} ({} --help describes them)", command_path(current),
                       fmt::join(command_names(current), ", "), command_path(current));
  return std::nullopt;
}

}  // namespace

std::string usage_error_message(CLI::App& app, const CLI::ParseError& error, int argc, const char* const* argv) {
  if (auto why = explain_unknown_arguments(app, argc, argv)) return *why;
  // The command the error is about: the last one CLI11 had reached.
  CLI::App* command = &app;
  while (!command->get_subcommands().empty()) command = command->get_subcommands().back();
  return fmt::format("{}: error: {} ({} --help lists the options)", command_path(command), error.what(),
                     command_path(command));
}

}  // namespace kiln::cli
