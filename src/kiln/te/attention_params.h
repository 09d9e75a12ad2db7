#pragma once
// The sizes and options an attention kernel runs with (te/attention.h), resolved by the wrapper:
// the kernels take [B, T, Hq, D] / [B, S, Hkv, D] tensors (contiguous, except cuDNN's path, which
// reads the strides here) and read the sizes here.
#include <cstdint>

#include "kiln/te/attention_dropout.h"

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
  // Element strides (batch, token, head) of q and of its gradient, and of k and v (which share them)
  // and their gradients; 0: the contiguous [B, T, H, D] layout. Only cuDNN's path takes others (q,
  // k and v as views of one packed qkv projection, no copies); Kiln's kernels get dense tensors.
  std::int64_t q_stride[3] = {0, 0, 0}, kv_stride[3] = {0, 0, 0};
  // Attention dropout (attention_dropout.h): each softmax probability is zeroed with probability
  // `dropout`, the kept ones scaled by 1 / (1 - dropout), after the row's max and sum (the lse is
  // that of the undropped softmax). The mask's Philox stream starts at dropout_offset, plus, when
  // dropout_offset_device is set, the int64 it points to on the tensors' device, read when the
  // kernel runs (graph-safe dropout: a captured CUDA graph draws a fresh mask at each replay).
  double dropout = 0;
  std::uint64_t dropout_seed = 0, dropout_offset = 0;
  const std::int64_t* dropout_offset_device = nullptr;

  bool has_dropout() const { return dropout > 0; }
  std::uint32_t dropout_threshold() const { return attention_dropout_threshold(dropout); }
  // The factor of a kept probability (0 when nothing is kept, p = 1).
  double dropout_scale() const { return dropout < 1 ? 1.0 / (1.0 - dropout) : 0.0; }

  bool strided() const { return q_stride[0] != 0 || kv_stride[0] != 0; }
  // The strides in effect, the contiguous ones where none are set.
  std::int64_t q_batch_stride() const { return q_stride[0] != 0 ? q_stride[0] : q_len * q_heads * head_dim; }
  std::int64_t q_token_stride() const { return q_stride[0] != 0 ? q_stride[1] : q_heads * head_dim; }
  std::int64_t q_head_stride() const { return q_stride[0] != 0 ? q_stride[2] : head_dim; }
  std::int64_t kv_batch_stride() const { return kv_stride[0] != 0 ? kv_stride[0] : kv_len * kv_heads * head_dim; }
  std::int64_t kv_token_stride() const { return kv_stride[0] != 0 ? kv_stride[1] : kv_heads * head_dim; }
  std::int64_t kv_head_stride() const { return kv_stride[0] != 0 ? kv_stride[2] : head_dim; }
  AttentionParams dense() const {
    AttentionParams d = *this;
    for (int i = 0; i < 3; ++i) d.q_stride[i] = d.kv_stride[i] = 0;
    return d;
  }

  std::int64_t group() const { return q_heads / kv_heads; }  // query heads per key/value head
  std::int64_t value_dim() const { return v_head_dim > 0 ? v_head_dim : head_dim; }
  // Causal: the last key query row i sees (bottom-right alignment); -1 or less: none.
  std::int64_t last_key(std::int64_t i) const { return causal ? i + kv_len - q_len : kv_len - 1; }
};

}  // namespace kiln::te
