#include "kiln/train/tensor_parallel_state.h"


#include "kiln/runtime/error.h"
#include "kiln/train/optimizer_state_key.h"

namespace kiln::train {

TensorParallelState::TensorParallelState(const nn::Module& model, models::TensorParallelLayout layout,
                                         dist::Communicator tp)
    : layout_(std::move(layout)), tp_(std::move(tp)) {
  for (const auto& [name, p] : model.named_parameters()) names_[p.impl()] = name;
}

std::string TensorParallelState::name_of(const Tensor& param) const {
  const auto it = names_.find(param.impl());
  return it == names_.end() ? std::string() : it->second;
}

TensorDict TensorParallelState::gather(const TensorDict& local) const {
  TensorDict out;
  // Every rank holds the same names in the same order (the same model): the gathers match up.
  for (const auto& [name, t] : local) out.insert(name, models::gather_whole(t, models::split_of(layout_, name), tp_));
  return out;
}

TensorDict TensorParallelState::shard(const TensorDict& whole) const {
  TensorDict out;
  for (const auto& [name, t] : whole) {
    const models::TensorParallelSplit split = models::split_of(layout_, name);
    const bool splits = !split.replicated() && t.dim() > split.dim &&
                        t.size(split.dim) % (static_cast<std::int64_t>(split.blocks) * tp_.size()) == 0;
    out.insert(name, splits ? models::shard_of(t, split, tp_.rank(), tp_.size(), name) : t);
  }
  return out;
}

ModelStateLayout TensorParallelState::model_state_layout() const {
  return {.whole = [this](const TensorDict& local) { return gather(local); },
          .local = [this](const TensorDict& whole) { return shard(whole); }};
}

TensorParallelOptimizerState::TensorParallelOptimizerState(optim::Optimizer& inner, const TensorParallelState& state)
    : optim::Optimizer(inner.name(), inner.param_groups(), inner.lr(), 0.0), inner_(inner), state_(state) {
  for (const auto& g : inner.param_groups())
    for (const Tensor& p : g.params) param_names_.push_back(state.name_of(p));
}

models::TensorParallelSplit TensorParallelOptimizerState::split_of_key(const std::string& key) const {
  const auto parsed = parse_optimizer_state_key(key);
  if (!parsed || parsed->first >= param_names_.size() || key.ends_with(".step") || key.ends_with(".shard")) return {};
  return models::split_of(state_.layout(), param_names_[parsed->first]);
}

TensorDict TensorParallelOptimizerState::state_dict() const {
  const TensorDict local = inner_.state_dict();
  TensorDict out;
  for (const auto& [key, t] : local) {
    KILN_CHECK(!key.ends_with(".shard"),
               "tensor-parallel checkpoint: the optimizer state {} is a data-parallel shard (gather it first)", key);
    out.insert(key, models::gather_whole(t, split_of_key(key), state_.group()));
  }
  return out;
}

void TensorParallelOptimizerState::load_state_dict(const TensorDict& state) {
  TensorDict mine;
  const dist::Communicator& tp = state_.group();
  for (const auto& [key, t] : state) {
    const models::TensorParallelSplit split = split_of_key(key);
    const bool splits = !split.replicated() && t.dim() > split.dim &&
                        t.size(split.dim) % (static_cast<std::int64_t>(split.blocks) * tp.size()) == 0;
    mine.insert(key, splits ? models::shard_of(t, split, tp.rank(), tp.size(), key) : t);
  }
  inner_.load_state_dict(mine);
}

}  // namespace kiln::train
