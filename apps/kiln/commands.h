#pragma once
// One function per `kiln` subcommand, each in its own cmd_<name>.cpp. main.cpp lists them.
#include <CLI/CLI.hpp>

namespace kiln::cli {

// `kiln data <what>`: the data fetchers share one parent command; each adds its own child.
inline CLI::App* data_command(CLI::App& app) {
  for (auto* sub : app.get_subcommands([](CLI::App* s) { return s->get_name() == "data"; })) return sub;
  auto* data = app.add_subcommand("data", "Fetch and convert datasets and tokenizers");
  data->require_subcommand(1);
  return data;
}

void add_check_device(CLI::App& app);
void add_train_cifar10(CLI::App& app);
void add_inference(CLI::App& app);
void add_data_cifar10(CLI::App& app);
void add_data_tokenizers(CLI::App& app);
void add_data_english_corpus(CLI::App& app);
void add_preprocess_data(CLI::App& app);
void add_inspect_data(CLI::App& app);
void add_pretrain_gpt(CLI::App& app);
void add_simulate(CLI::App& app);
void add_generate(CLI::App& app);
void add_export_hf(CLI::App& app);
void add_import_hf(CLI::App& app);
void add_hpl(CLI::App& app);
void add_hpcg(CLI::App& app);
void add_mdrun(CLI::App& app);
void add_launch(CLI::App& app);
void add_compare_runs(CLI::App& app);

}  // namespace kiln::cli
