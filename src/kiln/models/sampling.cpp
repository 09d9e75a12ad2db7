#include "kiln/models/sampling.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "kiln/runtime/error.h"

namespace kiln::models {

void SamplingOptions::validate() const {
  KILN_CHECK(std::isfinite(temperature) && temperature >= 0, "--temperature: must be a finite number >= 0, got {}",
             temperature);
  KILN_CHECK(top_k >= 0, "--top-k: must be a whole number >= 0 (0 keeps every token), got {}", top_k);
  KILN_CHECK(std::isfinite(top_p) && top_p > 0 && top_p <= 1, "--top-p: must be a number in (0, 1], got {}", top_p);
  KILN_CHECK(vocab_limit >= 0, "sampling: the vocabulary limit must be >= 0, got {}", vocab_limit);
}

namespace {

// Most likely first; equal logits put the lower id first, so every choice below is deterministic
// (a strict total order: std::sort and std::partial_sort give one answer).
struct ByLogit {
  std::span<const float> logits;
  bool operator()(std::int64_t a, std::int64_t b) const {
    return logits[a] != logits[b] ? logits[a] > logits[b] : a < b;
  }
};

}  // namespace

std::vector<double> sampling_distribution(std::span<const float> logits, const SamplingOptions& options) {
  options.validate();
  const auto row = static_cast<std::int64_t>(logits.size());
  KILN_CHECK(row > 0, "sampling: the row of logits is empty");
  const std::int64_t count = options.vocab_limit > 0 ? std::min(options.vocab_limit, row) : row;
  for (std::int64_t i = 0; i < count; ++i) {
    KILN_CHECK(!std::isnan(logits[i]) && logits[i] != INFINITY,
               "sampling: logit {} of token {} is not a number the model should produce (NaN or +inf); the "
               "weights or the activations have overflowed",
               logits[i], i);
  }
  std::vector<double> probs(logits.size(), 0.0);
  const ByLogit by_logit{logits};
  std::int64_t best = 0;
  for (std::int64_t i = 1; i < count; ++i) {
    if (by_logit(i, best)) best = i;
  }
  KILN_CHECK(logits[best] != -INFINITY, "sampling: every logit is -inf, so no token can be chosen");
  if (options.temperature == 0) {
    probs[best] = 1.0;
    return probs;
  }
  // The candidates: every id, or the top-k by descending logit. Nothing is sorted beyond what a
  // filter needs: a full sort of a 128k vocabulary for every token would bound the decode speed.
  std::vector<std::int64_t> order(static_cast<std::size_t>(count));
  std::iota(order.begin(), order.end(), std::int64_t{0});
  std::size_t kept = order.size();
  if (options.top_k > 0 && options.top_k < count) {
    kept = static_cast<std::size_t>(options.top_k);
    std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(kept), order.end(), by_logit);
  }
  // Softmax over the kept tokens in double, shifted by the maximum so nothing overflows.
  const double top = static_cast<double>(logits[best]) / options.temperature;
  double sum = 0;
  for (std::size_t r = 0; r < kept; ++r) {
    const auto id = order[r];
    probs[id] = std::exp(static_cast<double>(logits[id]) / options.temperature - top);
    sum += probs[id];
  }
  for (std::size_t r = 0; r < kept; ++r) probs[order[r]] /= sum;
  if (options.top_p < 1) {
    // The nucleus is usually a few tokens: sort a window of the most likely ones and widen it
    // until its mass reaches top_p (the same tokens a full sort would give).
    const auto begin = order.begin();
    std::size_t sorted = options.top_k > 0 && options.top_k < count ? kept : 0;
    std::size_t window = std::min<std::size_t>(kept, 256);
    double mass = 0;
    std::size_t nucleus = 0;
    while (true) {
      if (sorted < window) {
        std::partial_sort(begin, begin + static_cast<std::ptrdiff_t>(window), begin + static_cast<std::ptrdiff_t>(kept),
                          by_logit);
        sorted = window;
      }
      mass = 0;
      nucleus = 0;
      while (nucleus < window) {
        mass += probs[order[nucleus++]];
        if (mass >= options.top_p) break;
      }
      if (mass >= options.top_p || window == kept) break;
      window = std::min(kept, window * 8);
    }
    for (std::size_t r = nucleus; r < kept; ++r) probs[order[r]] = 0;
    for (std::size_t r = 0; r < nucleus; ++r) probs[order[r]] /= mass;
  }
  return probs;
}

TokenSampler::TokenSampler(SamplingOptions options, std::uint64_t seed) : options_(options), engine_(seed) {
  options_.validate();
}

double TokenSampler::uniform() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

std::int64_t TokenSampler::sample_row(std::span<const float> logits) {
  const auto probs = sampling_distribution(logits, options_);
  if (options_.temperature == 0) {
    return std::max_element(probs.begin(), probs.end()) - probs.begin();
  }
  // Inverse-CDF draw; the last token with non-zero probability catches rounding at the top.
  const double u = uniform();
  double cumulative = 0;
  std::int64_t last = -1;
  for (std::size_t id = 0; id < probs.size(); ++id) {
    if (probs[id] == 0) continue;
    cumulative += probs[id];
    last = static_cast<std::int64_t>(id);
    if (u < cumulative) return last;
  }
  return last;
}

std::vector<std::int64_t> TokenSampler::sample(const Tensor& logits) {
  KILN_CHECK(logits.defined() && logits.dim() >= 1 && logits.dim() <= 3,
             "sampling: logits must be [V], [B, V] or [B, T, V], got {}",
             logits.defined() ? logits.describe() : std::string("an undefined tensor"));
  Tensor rows = logits;
  if (rows.dim() == 1) rows = rows.unsqueeze(0);
  if (rows.dim() == 3) rows = rows.select(1, rows.size(1) - 1);
  const auto values = rows.detach().contiguous().to_vector<float>();
  const auto batch = rows.size(0);
  const auto vocab = static_cast<std::size_t>(rows.size(1));
  std::vector<std::int64_t> tokens;
  tokens.reserve(static_cast<std::size_t>(batch));
  for (std::int64_t b = 0; b < batch; ++b) {
    tokens.push_back(sample_row(std::span<const float>(values).subspan(static_cast<std::size_t>(b) * vocab, vocab)));
  }
  return tokens;
}

}  // namespace kiln::models
