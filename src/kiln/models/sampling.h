#pragma once
// Choosing the next token from a language model's logits, as Hugging Face's generate() does it:
// temperature scaling, then top-k, then top-p (nucleus) filtering, then one draw from what is
// left; temperature 0 is greedy (argmax). The draws come from a seeded generator of Kiln's own
// (not std::uniform_real_distribution, whose output differs between standard libraries), so a
// seed gives the same text on every machine.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::models {

struct SamplingOptions {
  double temperature = 1.0;  // > 0 scales the logits by 1/temperature; 0 means greedy
  std::int64_t top_k = 0;    // keep the k most likely tokens; 0 keeps all
  double top_p = 1.0;        // keep the smallest set of most likely tokens whose mass reaches top_p; 1 keeps all
  // Tokens at or above this id are never chosen: the padded rows of the embedding that no
  // tokenizer id maps to. 0: the whole row of logits.
  std::int64_t vocab_limit = 0;

  // Throws kiln::Error naming the option that is out of range.
  void validate() const;
};

// The probabilities the sampler draws from for one row of logits (one entry per logit; the tokens
// filtered out, and those at or beyond vocab_limit, get 0). Greedy gives 1 at the argmax (the lowest
// id among equal maxima). Ties at the top-k boundary are broken towards the lower id, so exactly k
// tokens stay; top-p keeps tokens in descending probability until their sum reaches top_p (at least
// one token). Throws on a logit that is NaN or +inf.
std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingOptions& options);

class TokenSampler {
 public:
  TokenSampler(SamplingOptions options, std::uint64_t seed);

  // One token per batch row from the last position of `logits` ([V], [B, V] or [B, T, V]; any
  // float dtype, any device: the row is copied to the host).
  std::vector<std::int64_t> sample(const Tensor& logits);
  // One token from one row of logits.
  std::int64_t sample_row(std::span<const float> logits);

  const SamplingOptions& options() const { return options_; }

 private:
  double uniform();  // in [0, 1), 53 random bits

  SamplingOptions options_;
  std::mt19937_64 engine_;
};

}  // namespace kiln::models
