#include "kiln/models/gpt_kv_cache.h"

#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

KvCache::KvCache(std::int64_t num_layers, std::int64_t batch, std::int64_t max_tokens, std::int64_t kv_heads,
                 std::int64_t head_dim, DType dtype, Device device)
    : KvCache(num_layers, batch, max_tokens, kv_heads, head_dim, kv_heads, head_dim, dtype, device) {}

KvCache::KvCache(std::int64_t num_layers, std::int64_t batch, std::int64_t max_tokens, std::int64_t key_heads,
                 std::int64_t key_dim, std::int64_t value_heads, std::int64_t value_dim, DType dtype, Device device)
    : batch_(batch), max_tokens_(max_tokens) {
  KILN_CHECK(
      num_layers > 0 && batch > 0 && max_tokens > 0 && key_heads > 0 && key_dim > 0 && value_heads > 0 && value_dim > 0,
      "KvCache: sizes must be positive (layers {}, batch {}, tokens {}, key heads {} of size {}, value heads {} "
      "of size {})",
      num_layers, batch, max_tokens, key_heads, key_dim, value_heads, value_dim);
  for (std::int64_t i = 0; i < num_layers; ++i) {
    keys_.push_back(Tensor::zeros({batch, max_tokens, key_heads, key_dim}, dtype, device));
    values_.push_back(Tensor::zeros({batch, max_tokens, value_heads, value_dim}, dtype, device));
  }
}

const Tensor& KvCache::keys(std::int64_t layer) const {
  KILN_CHECK(layer >= 0 && layer < num_layers(), "KvCache: layer {} of {}", layer, num_layers());
  return keys_[static_cast<std::size_t>(layer)];
}

const Tensor& KvCache::values(std::int64_t layer) const {
  KILN_CHECK(layer >= 0 && layer < num_layers(), "KvCache: layer {} of {}", layer, num_layers());
  return values_[static_cast<std::size_t>(layer)];
}

std::pair<Tensor, Tensor> KvCache::update(std::int64_t layer, const Tensor& k, const Tensor& v) {
  const Tensor& keys = this->keys(layer);
  const Tensor& values = this->values(layer);
  const Shape& s = keys.shape();
  const Shape& sv = values.shape();
  KILN_CHECK(k.dim() == 4 && v.dim() == 4 && k.size(0) == s[0] && k.size(2) == s[2] && k.size(3) == s[3] &&
                 v.size(0) == sv[0] && v.size(1) == k.size(1) && v.size(2) == sv[2] && v.size(3) == sv[3],
             "KvCache: expected k [{}, T, {}, {}] and v [{}, T, {}, {}], got {} and {}", s[0], s[2], s[3], sv[0], sv[2],
             sv[3], k.describe(), v.describe());
  const std::int64_t t = k.size(1);
  KILN_CHECK(length_ + t <= max_tokens_, "KvCache: {} more tokens do not fit ({} of {} used)", t, length_, max_tokens_);
  NoGradGuard no_grad;  // the cache holds values, not graph
  keys.narrow(1, length_, t).copy_(k.detach());
  values.narrow(1, length_, t).copy_(v.detach());
  return {keys.narrow(1, 0, length_ + t), values.narrow(1, 0, length_ + t)};
}

void KvCache::advance(std::int64_t tokens) {
  KILN_CHECK(tokens >= 0 && length_ + tokens <= max_tokens_, "KvCache: cannot advance by {} ({} of {} used)", tokens,
             length_, max_tokens_);
  length_ += tokens;
}

}  // namespace kiln::models
