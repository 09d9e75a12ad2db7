#include "kiln/models/generation.h"

#include <chrono>

#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

std::int64_t new_tokens_that_fit(const GptConfig& config, std::int64_t prompt_tokens, std::int64_t wanted) {
  const std::int64_t context = config.max_positions();
  KILN_CHECK(prompt_tokens > 0, "generate: the prompt has no tokens");
  KILN_CHECK(prompt_tokens < context,
             "generate: the prompt is {} tokens, but the model's context is {} positions "
             "(--max-position-embeddings): shorten the prompt to at most {} tokens",
             prompt_tokens, context, context - 1);
  KILN_CHECK(wanted >= 0, "generate: --max-new-tokens must be >= 0, got {}", wanted);
  return std::min(wanted, context - prompt_tokens);
}

GenerationResult generate(GptModel& model, std::span<const std::int64_t> prompt, const GenerationOptions& options,
                          const std::function<void(std::int64_t)>& on_token) {
  using Clock = std::chrono::steady_clock;
  const GptConfig& config = model.config();
  GenerationResult result;
  result.prompt_tokens = static_cast<std::int64_t>(prompt.size());
  const std::int64_t budget = new_tokens_that_fit(config, result.prompt_tokens, options.max_new_tokens);
  SamplingOptions sampling = options.sampling;
  if (sampling.vocab_limit == 0) sampling.vocab_limit = config.vocab_size;
  TokenSampler sampler(sampling, options.seed);
  if (budget == 0) return result;

  NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  const Device device = model.output_weight().device();
  KvCache cache = model.make_kv_cache(1, result.prompt_tokens + budget);

  const auto start = Clock::now();
  std::vector<std::int64_t> ids(prompt.begin(), prompt.end());
  Tensor input = Tensor::from_vector<std::int64_t>(ids, {1, result.prompt_tokens}).to(device);
  auto after_prefill = start;
  for (std::int64_t step = 0; step < budget; ++step) {
    const Tensor logits = model.forward(input, cache);
    const std::int64_t token = sampler.sample(logits).front();  // copies to the host: the step is done
    if (step == 0) after_prefill = Clock::now();
    result.tokens.push_back(token);
    if (on_token) on_token(token);
    if (options.stop_token && token == *options.stop_token) {
      result.stopped = true;
      break;
    }
    input = Tensor::from_vector<std::int64_t>({token}, {1, 1}).to(device);
  }
  const auto end = Clock::now();
  result.prefill_seconds = std::chrono::duration<double>(after_prefill - start).count();
  result.decode_seconds = std::chrono::duration<double>(end - after_prefill).count();
  if (was_training) model.train();
  return result;
}

}  // namespace kiln::models
