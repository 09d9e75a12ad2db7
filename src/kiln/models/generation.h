#pragma once
// Text generation with a GptModel: one forward pass over the prompt fills the KV cache (prefill),
// then each new token is one forward pass over that token alone (decode), sampled from the last
// position's logits (sampling.h). Batch size 1.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <vector>

#include "kiln/models/gpt_model.h"
#include "kiln/models/sampling.h"

namespace kiln::models {

struct GenerationOptions {
  SamplingOptions sampling;  // vocab_limit 0 is replaced by the model's vocab_size
  std::int64_t max_new_tokens = 100;
  std::uint64_t seed = 1234;
  std::optional<std::int64_t> stop_token;  // generation ends after emitting it (the end-of-document token)
};

struct GenerationResult {
  std::vector<std::int64_t> tokens;  // the new tokens only
  std::int64_t prompt_tokens = 0;
  double prefill_seconds = 0;  // the prompt's forward pass and the first token's choice
  double decode_seconds = 0;   // the following tokens
  bool stopped = false;        // ended on stop_token
};

// The number of new tokens that fit after a prompt of `prompt_tokens` in the model's positions.
// Throws kiln::Error when the prompt leaves no room (naming the prompt's and the context's length).
std::int64_t new_tokens_that_fit(const GptConfig& config, std::int64_t prompt_tokens, std::int64_t wanted);

// Generates up to min(max_new_tokens, what fits) tokens after `prompt` (token ids, not empty),
// calling on_token for each as soon as it is chosen (for streaming). The model runs in inference
// mode (no dropout, no gradients) on its parameters' device.
GenerationResult generate(GptModel& model, std::span<const std::int64_t> prompt, const GenerationOptions& options,
                          const std::function<void(std::int64_t)>& on_token = {});

}  // namespace kiln::models
