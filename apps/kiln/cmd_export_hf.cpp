// `kiln export-hf`: a pretrain-gpt checkpoint as a Hugging Face directory (LlamaForCausalLM,
// GPT2LMHeadModel, MixtralForCausalLM or DeepseekV3ForCausalLM: config.json, model.safetensors,
// tokenizer files) that `transformers` loads.
#include <fmt/format.h>

#include "commands.h"
#include "gpt_checkpoint_model.h"
#include "kiln/models/hf_checkpoint.h"
#include "kiln/runtime/error.h"

namespace kiln::cli {

void add_export_hf(CLI::App& app) {
  auto load = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto* cmd = app.add_subcommand(
      "export-hf",
      "Write a checkpoint as a Hugging Face LlamaForCausalLM / GPT2LMHeadModel / MixtralForCausalLM / "
      "DeepseekV3ForCausalLM directory");
  cmd->add_option("--load", *load, "the checkpoint directory (pretrain-gpt --save)")->required();
  cmd->add_option("--out", *out, "the Hugging Face directory to write (replaced when it is an earlier export)")
      ->required();
  cmd->callback([load, out] {
    const auto checkpoint = read_checkpoint_model(*load);
    KILN_CHECK(
        !checkpoint.tokenizer.type.empty(),
        "--load: the checkpoint was trained with --vocab-size and no tokenizer, so there is no tokenizer to use");
    const auto arch = models::hf_architecture_for(checkpoint.config);
    models::write_hf_directory(*out, checkpoint.config, checkpoint.weights, checkpoint.tokenizer);
    fmt::print("export-hf: iteration {} of {} -> {} ({}, vocabulary {})\n", checkpoint.iteration, *load, *out,
               models::hf_architecture_name(arch), checkpoint.config.vocab_size);
  });
}

}  // namespace kiln::cli
