#include "kiln/optim/grad_buffers.h"

#include <algorithm>
#include <map>

namespace kiln::optim {

GradBuffers::GradBuffers(const std::vector<Tensor>& params, GradBufferOptions options) : params_(params) {
  KILN_CHECK(!params.empty(), "GradBuffers: no parameters");
  std::vector<DType> order;
  std::map<DType, std::vector<Tensor>> by_dtype;
  for (std::size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    KILN_CHECK(p.defined(), "GradBuffers: parameter {} is undefined", i);
    for (std::size_t j = 0; j < i; ++j)
      KILN_CHECK(!params[j].is_same(p), "GradBuffers: parameter {} ({}) is listed twice (also as parameter {})", i,
                 p.describe(), j);
    auto [it, inserted] = by_dtype.try_emplace(p.dtype());
    if (inserted) order.push_back(p.dtype());
    it->second.push_back(p);
  }
  for (DType t : order) buffers_.push_back(std::make_unique<ParamAndGradBuffer>(by_dtype[t], options));
  ready_count_.resize(buffers_.size());
  notified_.resize(buffers_.size());
  param_ready_.resize(buffers_.size());
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const ParamAndGradBuffer& buf = *buffers_[b];
    ready_count_[b].assign(buf.buckets().size(), 0);
    notified_[b].assign(buf.buckets().size(), false);
    param_ready_[b].assign(buf.params().size(), false);
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

void GradBuffers::on_grad_ready(std::size_t b, std::size_t i) {
  if (!sync_enabled_) return;
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
