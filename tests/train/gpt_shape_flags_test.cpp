// The flags a pretrain-gpt checkpoint records as its model's shape and a --load compares: the
// Llama-3.1 RoPE scaling factor is among them when the scaling is on (it changes every rotary
// frequency, so a checkpoint loaded with another factor is another model), and absent otherwise.
#include <gtest/gtest.h>

#include <optional>

#include "kiln/train/gpt_pretrain.h"

namespace kiln::train {
namespace gpt_shape_flags_test {

std::optional<std::string> flag(const std::vector<std::pair<std::string, std::string>>& flags,
                                const std::string& name) {
  for (const auto& [f, v] : flags)
    if (f == name) return v;
  return std::nullopt;
}

TEST(GptShapeFlags, RopeScalingFactorIsRecordedWhenTheScalingIsOn) {
  auto config = models::GptConfig::llama3_2_1b(128256);
  EXPECT_EQ(flag(gpt_shape_flags(config), "--use-rope-scaling"), "true");
  EXPECT_EQ(flag(gpt_shape_flags(config), "--rope-scaling-factor"), "32");
  auto other = config;
  other.rope_scaling_factor = 8;
  EXPECT_NE(gpt_shape_flags(other), gpt_shape_flags(config)) << "another factor is another model";
  other.rope_llama3_scaling = false;
  EXPECT_EQ(flag(gpt_shape_flags(other), "--rope-scaling-factor"), std::nullopt) << "meaningless without the scaling";
  EXPECT_EQ(flag(gpt_shape_flags(models::GptConfig::gpt2_124m(50257)), "--rope-scaling-factor"), std::nullopt);
}

}  // namespace gpt_shape_flags_test
}  // namespace kiln::train
