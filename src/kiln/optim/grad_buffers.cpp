#include "kiln/optim/grad_buffers.h"

#include <algorithm>
#include <map>

namespace kiln::optim {

GradBuffers::GradBuffers(const std::vector<Tensor>& params, GradBufferOptions options)
    : GradBuffers(params, options, {}, options) {}

GradBuffers::GradBuffers(const std::vector<Tensor>& params, GradBufferOptions options,
                         const std::vector<Tensor>& expert_params, GradBufferOptions expert_options)
    : params_(params) {
  KILN_CHECK(!params.empty(), "GradBuffers: no parameters");
  auto is_expert = [&](const Tensor& p) {
    return std::any_of(expert_params.begin(), expert_params.end(), [&](const Tensor& e) { return e.is_same(p); });
  };
  // Buffers per (expert or not, dtype), in order of first appearance.
  using Key = std::pair<bool, DType>;
  std::vector<Key> order;
  std::map<Key, std::vector<Tensor>> by_key;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined(), "GradBuffers: parameter {} is undefined", i);
    for (std::size_t j = 0; j < i; ++j)
      KILN_CHECK(!params[j].is_same(p), "GradBuffers: parameter {} ({}) is listed twice (also as parameter {})", i,
                 p.describe(), j);
    const Key key{is_expert(p), p.dtype()};
    auto [it, inserted] = by_key.try_emplace(key);
    if (inserted) order.push_back(key);
    it->second.push_back(p);
  }
  for (const Key& k : order) {
    buffers_.push_back(std::make_unique<ParamAndGradBuffer>(by_key[k], k.first ? expert_options : options));
    expert_.push_back(k.first);
  }
  ready_count_.resize(buffers_.size());
  notified_.resize(buffers_.size());
  param_ready_.resize(buffers_.size());
  complete_at_finish_.resize(buffers_.size());
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const ParamAndGradBuffer& buf = *buffers_[b];
    ready_count_[b].assign(buf.buckets().size(), 0);
    notified_[b].assign(buf.buckets().size(), false);
    param_ready_[b].assign(buf.params().size(), false);
    complete_at_finish_[b].assign(buf.params().size(), false);
    for (std::size_t i = 0; i < buf.params().size(); ++i) {
      where_[buf.params()[i].impl()] = {b, i};
      hooks_.push_back(
          autograd::register_grad_ready_hook(buf.params()[i], [this, b, i](const Tensor&) { on_grad_ready(b, i); }));
    }
  }
}

std::optional<GradBuffers::Location> GradBuffers::locate(const Tensor& param) const {
  auto it = where_.find(param.impl());
  if (it == where_.end()) return std::nullopt;
  return it->second;
}

void GradBuffers::complete_at_finish(const Tensor& param) {
  if (const auto at = locate(param)) complete_at_finish_[at->buffer][at->index] = true;
}

void GradBuffers::on_grad_ready(std::size_t b, std::size_t i) {
  if (!sync_enabled_ || complete_at_finish_[b][i]) return;
  const ParamAndGradBuffer& buf = *buffers_[b];
  KILN_CHECK(!param_ready_[b][i],
             "GradBuffers: parameter {} ({}) got a second gradient in one round; call finish_backward() after "
             "each backward with grad sync on, and turn sync off for the micro-batches before the last",
             i, buf.params()[i].describe());
  param_ready_[b][i] = true;
  const std::size_t k = buf.bucket_of(i);
  if (++ready_count_[b][k] == buf.buckets()[k].params.size()) notify(b, k);
}

void GradBuffers::notify(std::size_t b, std::size_t k) {
  notified_[b][k] = true;
  if (callback_) callback_(*buffers_[b], buffers_[b]->buckets()[k]);
}

void GradBuffers::finish_backward() {
  if (sync_enabled_)
    for (std::size_t b = 0; b < buffers_.size(); ++b)
      for (std::size_t k = 0; k < notified_[b].size(); ++k)
        if (!notified_[b][k]) notify(b, k);
  reset_round();
}

void GradBuffers::reset_round() {
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    std::fill(ready_count_[b].begin(), ready_count_[b].end(), 0);
    std::fill(notified_[b].begin(), notified_[b].end(), false);
    std::fill(param_ready_[b].begin(), param_ready_[b].end(), false);
  }
}

std::size_t GradBuffers::buckets_notified() const {
  std::size_t n = 0;
  for (const auto& v : notified_)
    for (bool x : v) n += x ? 1 : 0;
  return n;
}

std::vector<Tensor> GradBuffers::flat_grads() const {
  std::vector<Tensor> grads;
  for (const auto& b : buffers_) grads.push_back(b->grad_data());
  return grads;
}

void GradBuffers::zero_grad() {
  for (auto& b : buffers_) b->zero_grad();
  reset_round();
}

std::vector<std::vector<ElementRange>> GradBuffers::shard(int rank, int count) const {
  std::vector<std::vector<ElementRange>> out;
  for (const auto& b : buffers_) out.push_back(b->shard_ranges(rank, count));
  return out;
}

void GradBuffers::check_views(const char* caller) const {
  for (const auto& b : buffers_) b->check_views(caller);
}

}  // namespace kiln::optim
