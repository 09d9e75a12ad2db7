#pragma once
// The sizes and options an attention kernel runs with (te/attention.h), resolved by the wrapper:
// the kernels take contiguous [B, T, Hq, D] / [B, S, Hkv, D] tensors and read the sizes here.
#include <cstdint>

namespace kiln::te {

// Which kernels run an attention call on CUDA: Kiln's own (te/cuda/attention_*.cu) or cuDNN's fused
// flash attention (te/cuda/attention_cudnn.h). Auto: cuDNN where it builds a plan for the call,
// Kiln's otherwise; KILN_ATTENTION_IMPL=kiln|cudnn replaces Auto. The CPU always runs Kiln's.
enum class AttentionImpl : std::uint8_t { Auto, Kiln, Cudnn };

struct AttentionParams {
  std::int64_t batch = 0, q_len = 0, kv_len = 0, q_heads = 0, kv_heads = 0, head_dim = 0;
  // The value (and output) head size when it differs from q's and k's head_dim (MLA: 128 against
  // 192); 0: head_dim. Only cuDNN's kernels take a different one; te::attention pads for Kiln's.
  std::int64_t v_head_dim = 0;
  bool causal = true;
  double scale = 0;  // resolved: never 0
  // Resolved by the wrapper (never Auto when a kernel runs); forced: the caller or the environment
  // asked for it, so a refusal is an error rather than a fallback.
  AttentionImpl impl = AttentionImpl::Kiln;
  bool impl_forced = false;

  std::int64_t group() const { return q_heads / kv_heads; }  // query heads per key/value head
  std::int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  // Causal: the last key query row i sees (bottom-right alignment); -1 or less: none.
  std::int64_t last_key(std::int64_t i) const { return causal ? i + kv_len - q_len : kv_len - 1; }
};

}  // namespace kiln::te
