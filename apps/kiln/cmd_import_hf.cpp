// `kiln import-hf`: a Hugging Face LlamaForCausalLM / GPT2LMHeadModel / MixtralForCausalLM /
// DeepseekV3ForCausalLM directory (config.json,
// model.safetensors or shards, tokenizer files) as a pretrain-gpt checkpoint at iteration 0, with
// its tokenizer copied in, so generate, export-hf and training can start from published weights.
#include <fmt/format.h>
#include <unistd.h>

#include "commands.h"
#include "gpt_checkpoint_model.h"
#include "kiln/io/atomic_file.h"
#include "kiln/models/gpt_model.h"
#include "kiln/models/hf_checkpoint.h"
#include "kiln/optim/optimizer.h"
#include "kiln/runtime/error.h"
#include "kiln/train/gpt_checkpoint.h"
#include "number_checks.h"

namespace kiln::cli {

namespace fs = std::filesystem;

namespace {

void copy_into(const fs::path& from, const fs::path& to) {
  fs::create_directories(to.parent_path());
  fs::path temp = to;
  temp += fmt::format(".tmp.{}", ::getpid());
  fs::copy_file(from, temp, fs::copy_options::overwrite_existing);
  fs::rename(temp, to);
}

// The tokenizer's files under <save>/tokenizer, named by paths relative to <save>.
data::TokenizerSpec copy_tokenizer(const data::TokenizerSpec& spec, const fs::path& save) {
  const fs::path dir = save / "tokenizer";
  data::TokenizerSpec out{spec.type, {}, {}, {}};
  if (spec.type == "HuggingFaceTokenizer") {
    copy_into(spec.model, dir / "tokenizer.json");
    const fs::path config = spec.model.parent_path() / "tokenizer_config.json";
    if (fs::exists(config)) copy_into(config, dir / "tokenizer_config.json");
    out.model = "tokenizer/tokenizer.json";
  } else {
    copy_into(spec.vocab_file, dir / "vocab.json");
    copy_into(spec.merge_file, dir / "merges.txt");
    out.vocab_file = "tokenizer/vocab.json";
    out.merge_file = "tokenizer/merges.txt";
  }
  return out;
}

}  // namespace

void add_import_hf(CLI::App& app) {
  auto hf = std::make_shared<std::string>();
  auto save = std::make_shared<std::string>();
  auto seq_length = std::make_shared<std::int64_t>(0);
  auto* cmd = app.add_subcommand("import-hf",
                                 "Read a Hugging Face LlamaForCausalLM / GPT2LMHeadModel / MixtralForCausalLM / "
                                 "DeepseekV3ForCausalLM directory into a Kiln checkpoint");
  cmd->add_option("--hf", *hf, "the Hugging Face model directory (config.json, model.safetensors, tokenizer)")
      ->required();
  cmd->add_option("--save", *save, "the checkpoint directory to write (must not hold a checkpoint yet)")->required();
  cmd->add_option("--seq-length", *seq_length, "the --seq-length recorded for training (0: the model's positions)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->callback([hf, save, seq_length] {
    KILN_CHECK(!fs::exists(fs::path(*save) / "latest_checkpointed_iteration.txt"),
               "import-hf: --save {} already holds a checkpoint; choose another directory", *save);
    auto imported = models::read_hf_directory(*hf, *seq_length);
    models::GptModel model(imported.config, 0);
    model.load_state_dict(imported.megatron);

    const auto tokenizer = copy_tokenizer(imported.tokenizer, *save);
    train::GptCheckpointState state;
    state.iteration = 0;
    state.shape_flags = checkpoint_shape_flags(imported.config, false);
    // The run's flags as pretrain-gpt would record them, so generate and export-hf rebuild the model.
    // --vocab-size: config.json's, which may exceed the tokenizer's (rows no token maps to).
    state.all_flags = {
        {"--seq-length", std::to_string(imported.config.seq_length)},
        {"--vocab-size", std::to_string(imported.config.vocab_size)},
        {"--rope-scaling-factor", fmt::format("{}", imported.config.rope_scaling_factor)},
        {"--make-vocab-size-divisible-by", std::to_string(imported.config.make_vocab_size_divisible_by)}};
    for (auto& flag : tokenizer_flags(tokenizer)) state.all_flags.push_back(flag);
    state.all_flags.emplace_back("--imported-from", fs::absolute(*hf).string());
    train::capture_rng_state(model, state);
    // Weights only: an optimizer without state (training from here starts its moments afresh).
    optim::SGD no_state(model.parameters());
    const auto folder = train::save_gpt_checkpoint(*save, model, no_state, state);
    fmt::print("import-hf: {} ({}, {} layers, hidden {}, vocabulary {}) -> {}\n", *hf,
               models::hf_architecture_name(models::hf_architecture_for(imported.config)), imported.config.num_layers,
               imported.config.hidden_size, imported.config.vocab_size, folder.string());
  });
}

}  // namespace kiln::cli
