// `kiln generate`: text from a pretrain-gpt (or import-hf) checkpoint. The prompt is encoded with the
// checkpoint's tokenizer, one forward pass fills the KV cache, then each new token is sampled and
// printed as soon as it completes a UTF-8 character; the speed goes to the last line.
#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <string>

#include "commands.h"
#include "gpt_checkpoint_model.h"
#include "kiln/io/safetensors.h"
#include "kiln/models/generation.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"
#include "number_checks.h"

namespace kiln::cli {

namespace {

struct GenerateOptions {
  std::string load;
  std::string prompt;
  std::int64_t max_new_tokens = 100;
  double temperature = 1.0;
  std::int64_t top_k = 0;
  double top_p = 1.0;
  bool greedy = false;
  std::uint64_t seed = 1234;
  std::string device;
  bool ignore_eos = false;
  std::string dump_logits;
};

// The length of the longest prefix of `bytes` that ends on a UTF-8 character boundary (byte-level
// BPE tokens may end in the middle of a character; print it once the rest arrives).
std::size_t complete_utf8_prefix(const std::string& bytes) {
  std::size_t i = bytes.size();
  std::size_t back = 0;
  while (i > 0 && back < 4 && (static_cast<unsigned char>(bytes[i - 1]) & 0xC0) == 0x80) {
    --i;
    ++back;
  }
  if (i == 0) return bytes.size();
  const auto lead = static_cast<unsigned char>(bytes[i - 1]);
  const std::size_t need = lead >= 0xF0 ? 4 : lead >= 0xE0 ? 3 : lead >= 0xC0 ? 2 : 1;
  return back + 1 >= need ? bytes.size() : i - 1;
}

void run_generate(const GenerateOptions& o) {
  auto checkpoint = read_checkpoint_model(o.load);
  KILN_CHECK(!checkpoint.tokenizer.type.empty(),
             "--load: the checkpoint was trained with --vocab-size and no tokenizer, so there is no tokenizer to use");
  const auto tokenizer = data::make_tokenizer(checkpoint.tokenizer);
  const Device device = o.device.empty() ? (device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu())
                                         : Device::parse(o.device);

  std::vector<std::int64_t> prompt;
  for (auto id : tokenizer->encode(o.prompt)) prompt.push_back(id);
  if (prompt.empty()) {
    KILN_CHECK(tokenizer->eod().has_value(),
               "--prompt is empty and the tokenizer has no end-of-document token to start from: give some text");
    prompt.push_back(*tokenizer->eod());  // as GPT-2 samples unconditionally: after a document's end
  }
  const std::int64_t budget =
      models::new_tokens_that_fit(checkpoint.config, static_cast<std::int64_t>(prompt.size()), o.max_new_tokens);
  if (budget < o.max_new_tokens) {
    std::fprintf(stderr, "kiln: note: the context holds %lld new tokens after the prompt, not %lld\n",
                 static_cast<long long>(budget), static_cast<long long>(o.max_new_tokens));
  }

  models::GptModel model(checkpoint.config, 0);
  model.load_state_dict(checkpoint.weights);
  if (checkpoint.bf16 && device.kind == DeviceKind::CUDA) model.to(DType::BF16);
  model.to(device);

  if (!o.dump_logits.empty()) {
    // The prompt's logits from one full forward pass, for tests/parity/check_hf_export.py.
    NoGradGuard no_grad;
    model.eval();
    const Tensor ids = Tensor::from_vector(prompt, {1, static_cast<std::int64_t>(prompt.size())});
    TensorDict dump;
    dump.insert("tokens", ids);
    dump.insert("prompt_ids", ids.view({static_cast<std::int64_t>(prompt.size())}));
    dump.insert("logits", model.forward(ids.to(device)).to(Device::cpu(), DType::F32));
    io::save_safetensors(o.dump_logits, dump);
  }

  models::GenerationOptions g;
  g.sampling.temperature = o.greedy ? 0 : o.temperature;
  g.sampling.top_k = o.top_k;
  g.sampling.top_p = o.top_p;
  // Rows the tokenizer has no token for (an imported model's extra rows, Megatron's padding) are never chosen.
  g.sampling.vocab_limit = std::min<std::int64_t>(checkpoint.config.vocab_size, tokenizer->vocab_size());
  g.max_new_tokens = budget;
  g.seed = o.seed;
  if (!o.ignore_eos && tokenizer->eod()) g.stop_token = *tokenizer->eod();

  std::fputs(o.prompt.c_str(), stdout);
  std::fflush(stdout);
  std::string pending;
  const auto result = models::generate(model, prompt, g, [&](std::int64_t token) {
    if (g.stop_token && token == *g.stop_token) return;
    pending += tokenizer->id_to_bytes(static_cast<std::int32_t>(token));
    const std::size_t ready = complete_utf8_prefix(pending);
    std::fwrite(pending.data(), 1, ready, stdout);
    std::fflush(stdout);
    pending.erase(0, ready);
  });
  std::fwrite(pending.data(), 1, pending.size(), stdout);
  const auto decoded = static_cast<double>(result.tokens.size() > 0 ? result.tokens.size() - 1 : 0);
  fmt::print(
      "\n\n[generate] {} prompt tokens in {:.1f} ms; {} new tokens{}, {:.1f} tokens/s after the first "
      "({}, iteration {})\n",
      result.prompt_tokens, result.prefill_seconds * 1e3, result.tokens.size(),
      result.stopped ? " (ended at the end-of-document token)" : "",
      result.decode_seconds > 0 ? decoded / result.decode_seconds : 0.0, device.str(), checkpoint.iteration);
}

}  // namespace

void add_generate(CLI::App& app) {
  auto o = std::make_shared<GenerateOptions>();
  auto* cmd = app.add_subcommand(
      "generate", "Generate text from a pretrain-gpt or import-hf checkpoint (greedy, temperature, top-k, top-p)");
  cmd->add_option("--load", o->load, "the checkpoint directory (pretrain-gpt --save, or import-hf --save)")->required();
  cmd->add_option("--prompt", o->prompt, "the text to continue (empty: start after an end-of-document token)")
      ->required();
  cmd->add_option("--max-new-tokens", o->max_new_tokens, "tokens to generate at most")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--temperature", o->temperature, "divides the logits; 0 is greedy")
      ->check(finite_number_above(0, true))
      ->capture_default_str();
  cmd->add_option("--top-k", o->top_k, "sample among the k most likely tokens (0: all)")
      ->check(whole_number_at_least(0))
      ->capture_default_str();
  cmd->add_option("--top-p", o->top_p, "sample among the most likely tokens whose probabilities add up to p (1: all)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            try {
              std::size_t used = 0;
              const double p = std::stod(s, &used);
              if (used == s.size() && p > 0 && p <= 1) return "";
            } catch (const std::exception&) {
            }
            return fmt::format("must be a number in (0, 1], got '{}'", s);
          },
          "(0,1]"))
      ->capture_default_str();
  cmd->add_flag("--greedy", o->greedy, "always the most likely token (same as --temperature 0)");
  cmd->add_option("--seed", o->seed, "seed of the sampler: the same seed gives the same text")->capture_default_str();
  cmd->add_option("--device", o->device, "cpu, cuda or cuda:N (default: cuda when there is one)");
  cmd->add_flag("--ignore-eos", o->ignore_eos, "go on past the end-of-document token");
  cmd->add_option("--dump-logits", o->dump_logits,
                  "also write the prompt's ids and logits (one forward pass) to this safetensors file, for "
                  "tests/parity/check_hf_export.py");
  cmd->callback([o] { run_generate(*o); });
}

}  // namespace kiln::cli
