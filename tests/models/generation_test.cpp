// Generation with the KV cache against recomputing the whole sequence at every step.
#include "kiln/models/generation.h"

#include <gtest/gtest.h>

#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace generation_test {

GptConfig tiny(bool llama) {
  GptConfig c;
  c.num_layers = 2;
  c.hidden_size = 32;
  c.num_attention_heads = 4;
  c.seq_length = 24;
  c.vocab_size = 50;
  c.make_vocab_size_divisible_by = 16;  // 64 rows: 14 padded ones the sampler must never pick
  if (llama) {
    c.num_query_groups = 2;
    c.position_embedding_type = PositionEmbedding::Rope;
    c.normalization = Normalization::RMSNorm;
    c.swiglu = true;
    c.add_bias_linear = false;
  }
  return c;
}

// Greedy decoding by running the full sequence each step, the reference for the cached path.
std::vector<std::int64_t> greedy_without_cache(GptModel& model, std::vector<std::int64_t> ids, std::int64_t steps) {
  NoGradGuard no_grad;
  std::vector<std::int64_t> out;
  TokenSampler greedy({.temperature = 0, .vocab_limit = model.config().vocab_size}, 0);
  for (std::int64_t i = 0; i < steps; ++i) {
    const Tensor logits = model.forward(Tensor::from_vector(ids, {1, static_cast<std::int64_t>(ids.size())}));
    out.push_back(greedy.sample(logits).front());
    ids.push_back(out.back());
  }
  return out;
}

TEST(Generation, CachedGreedyEqualsRecomputation) {
  for (bool llama : {false, true}) {
    GptModel model(tiny(llama), 5);
    model.eval();
    const std::vector<std::int64_t> prompt{3, 14, 15, 9, 2};
    GenerationOptions options;
    options.sampling.temperature = 0;
    options.max_new_tokens = 12;
    const auto result = generate(model, prompt, options);
    EXPECT_EQ(result.tokens, greedy_without_cache(model, prompt, 12)) << (llama ? "llama" : "gpt2");
    EXPECT_EQ(result.prompt_tokens, 5);
    for (auto t : result.tokens) EXPECT_LT(t, 50);
  }
}

TEST(Generation, SeedFixesSampledTextAndStopTokenEnds) {
  GptModel model(tiny(false), 6);
  const std::vector<std::int64_t> prompt{1, 2, 3};
  GenerationOptions options;
  options.max_new_tokens = 15;
  options.seed = 42;
  const auto a = generate(model, prompt, options);
  const auto b = generate(model, prompt, options);
  EXPECT_EQ(a.tokens, b.tokens);
  std::vector<std::int64_t> streamed;
  options.stop_token = a.tokens.at(4);
  const auto stopped = generate(model, prompt, options, [&](std::int64_t t) { streamed.push_back(t); });
  EXPECT_TRUE(stopped.stopped);
  EXPECT_EQ(stopped.tokens.back(), *options.stop_token);
  EXPECT_LE(stopped.tokens.size(), 5u);
  EXPECT_EQ(streamed, stopped.tokens);
}

TEST(Generation, TheContextBoundsTheNewTokens) {
  const GptConfig c = tiny(false);  // 24 positions
  EXPECT_EQ(new_tokens_that_fit(c, 20, 100), 4);
  EXPECT_EQ(new_tokens_that_fit(c, 3, 5), 5);
  try {
    new_tokens_that_fit(c, 24, 1);
    FAIL() << "a prompt filling the context was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the prompt is 24 tokens, but the model's context is 24 positions"),
              std::string::npos)
        << e.what();
  }
  GptModel model(c, 1);
  GenerationOptions options;
  options.max_new_tokens = 100;
  const auto result = generate(model, std::vector<std::int64_t>(20, 1), options);
  EXPECT_EQ(result.tokens.size(), 4u);
}

}  // namespace generation_test
}  // namespace kiln::models
