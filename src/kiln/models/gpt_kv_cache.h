#pragma once
// KvCache: the keys and values a GPT model has computed so far, per layer, for generation. Each
// layer's K and V are [B, max_tokens, Hkv, D] in the model's dtype and on its device (keys after
// RoPE). GptModel::forward(tokens, cache) writes the new tokens' K and V at positions
// length() .. length() + T, attends over the first length() + T, then advances length() by T.
#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::models {

class KvCache {
 public:
  KvCache(std::int64_t num_layers, std::int64_t batch, std::int64_t max_tokens, std::int64_t kv_heads,
          std::int64_t head_dim, DType dtype, Device device);
  // MLA: the two per-token tensors a layer caches may differ in shape. MLA caches its compressed
  // latent c_kv [B, T, 1, kv_lora_rank] as the "keys" and its shared RoPE key k_pe [B, T, 1,
  // qk_pos_emb_head_dim] as the "values" (transformer_mla.h), not the per-head K and V.
  KvCache(std::int64_t num_layers, std::int64_t batch, std::int64_t max_tokens, std::int64_t key_heads,
          std::int64_t key_dim, std::int64_t value_heads, std::int64_t value_dim, DType dtype, Device device);

  std::int64_t length() const { return length_; }
  std::int64_t max_tokens() const { return max_tokens_; }
  std::int64_t batch() const { return batch_; }
  std::int64_t num_layers() const { return static_cast<std::int64_t>(keys_.size()); }
  // Forgets every token (the memory is kept).
  void reset() { length_ = 0; }

  // Stores layer `layer`'s k, v [B, T, Hkv, D] at positions length() .. length() + T and returns views
  // of that layer's first length() + T positions (what the new queries attend to). Does not advance.
  std::pair<Tensor, Tensor> update(std::int64_t layer, const Tensor& k, const Tensor& v);
  // After every layer stored its T new tokens.
  void advance(std::int64_t tokens);

  const Tensor& keys(std::int64_t layer) const;
  const Tensor& values(std::int64_t layer) const;

 private:
  std::int64_t batch_, max_tokens_, length_ = 0;
  std::vector<Tensor> keys_, values_;
};

}  // namespace kiln::models
