#include "kiln/train/pipeline_parallel_state.h"

#include <fmt/format.h>

#include "kiln/runtime/error.h"
#include "kiln/train/optimizer_state_key.h"

namespace kiln::train {

namespace {

constexpr const char* kWordEmbeddings = "embedding.word_embeddings.weight";

bool decays(const std::string& name, std::int64_t dim) { return !(dim == 1 || name.ends_with(".bias")); }

}  // namespace

TensorDict gather_tensor_dicts(const dist::Communicator& group, const TensorDict& local) {
  TensorDict out;
  if (group.rank() != 0) {
    // Header: count, then per tensor name length, dtype, rank, sizes; the names; each tensor's bytes.
    std::vector<std::int64_t> header{static_cast<std::int64_t>(local.size())};
    std::string names;
    std::vector<Tensor> host;
    for (const auto& [name, t] : local) {
      header.push_back(static_cast<std::int64_t>(name.size()));
      header.push_back(static_cast<std::int64_t>(t.dtype()));
      header.push_back(t.dim());
      for (std::int64_t d = 0; d < t.dim(); ++d) header.push_back(t.size(d));
      names += name;
      host.push_back(t.to(Device::cpu()).contiguous());
    }
    const std::int64_t header_size = static_cast<std::int64_t>(header.size());
    group.send(std::span<const std::int64_t>(&header_size, 1), 0);
    group.send(std::span<const std::int64_t>(header), 0);
    group.send(std::span<const char>(names.data(), names.size()), 0);
    for (const Tensor& t : host)
      group.send(std::span<const std::uint8_t>(static_cast<const std::uint8_t*>(t.data_ptr()), t.nbytes()), 0);
    return out;
  }
  for (const auto& [name, t] : local) out.insert(name, t);
  for (int source = 1; source < group.size(); ++source) {
    std::int64_t header_size = 0;
    group.recv(std::span<std::int64_t>(&header_size, 1), source);
    std::vector<std::int64_t> header(static_cast<std::size_t>(header_size));
    group.recv(std::span<std::int64_t>(header), source);
    std::size_t at = 1, name_bytes = 0;
    struct Entry {
      std::size_t name_length;
      DType dtype;
      Shape shape;
    };
    std::vector<Entry> entries;
    for (std::int64_t i = 0; i < header[0]; ++i) {
      Entry e{static_cast<std::size_t>(header[at]), static_cast<DType>(header[at + 1]), {}};
      const auto dims = header[at + 2];
      at += 3;
      for (std::int64_t d = 0; d < dims; ++d) e.shape.push_back(header[at++]);
      name_bytes += e.name_length;
      entries.push_back(std::move(e));
    }
    std::string names(name_bytes, '\0');
    group.recv(std::span<char>(names.data(), names.size()), source);
    std::size_t offset = 0;
    for (const Entry& e : entries) {
      Tensor t = Tensor::empty(e.shape, e.dtype, Device::cpu());
      group.recv(std::span<std::uint8_t>(static_cast<std::uint8_t*>(t.data_ptr()), t.nbytes()), source);
      const std::string name = names.substr(offset, e.name_length);
      offset += e.name_length;
      KILN_CHECK(!out.contains(name), "pipeline checkpoint: the tensor {} is held by two stages", name);
      out.insert(name, t);
    }
  }
  return out;
}

PipelineParallelState::PipelineParallelState(const nn::Module& model, const PipelineStageHandle& stage,
                                             dist::Communicator pp)
    : pp_(std::move(pp)),
      tied_copy_name_(stage.tied_copy.defined() ? stage.tied_copy_name : std::string()),
      whole_dropout_names_(stage.whole_dropout_names),
      mirror_names_(stage.mirror_state_names.begin(), stage.mirror_state_names.end()),
      mirror_dropout_names_(stage.mirror_dropout_names.begin(), stage.mirror_dropout_names.end()),
      model_(model) {
  for (const auto& [name, p] : model.named_parameters()) names_[p.impl()] = name;
  for (const auto& [name, t] : model.state_dict()) local_keys_.push_back(name);
  // The one-process optimizer's order (weight_decay_groups): the decayed parameters, then the others.
  std::size_t decayed = 0, other = 0;
  for (const auto& [name, dim] : stage.whole_parameters) decays(name, dim) ? ++decayed : ++other;
  std::size_t next_decayed = 0, next_other = decayed;
  for (const auto& [name, dim] : stage.whole_parameters)
    whole_index_[name] = static_cast<int>(decays(name, dim) ? next_decayed++ : next_other++);
  if (decayed > 0) whole_group_sizes_.push_back(decayed);
  if (other > 0) whole_group_sizes_.push_back(other);
}

std::string PipelineParallelState::name_of(const Tensor& param) const {
  const auto it = names_.find(param.impl());
  return it == names_.end() ? std::string() : it->second;
}

int PipelineParallelState::whole_index_for_load(const std::string& name) const {
  const auto it = whole_index_.find(name == tied_copy_name_ && !name.empty() ? kWordEmbeddings : name);
  KILN_CHECK(it != whole_index_.end(), "pipeline checkpoint: the parameter {} is not the whole model's", name);
  return it->second;
}

int PipelineParallelState::whole_index_for_save(const std::string& name) const {
  // DualPipe's copy of another rank's stage: its state is the original's (saved there).
  if (mirror_names_.contains(name)) return -1;
  return !tied_copy_name_.empty() && name == tied_copy_name_ ? -1 : whole_index_for_load(name);
}

TensorDict PipelineParallelState::gather(const TensorDict& local) const {
  TensorDict mine;
  for (const auto& [name, t] : local)
    if ((tied_copy_name_.empty() || name != tied_copy_name_) && !mirror_names_.contains(name)) mine.insert(name, t);
  return gather_tensor_dicts(pp_, mine);
}

TensorDict PipelineParallelState::local(const TensorDict& whole) const {
  TensorDict out;
  for (const std::string& key : local_keys_) {
    const std::string source = !tied_copy_name_.empty() && key == tied_copy_name_ ? kWordEmbeddings : key;
    // A tensor the checkpoint lacks is left out: load_state_dict names it as missing.
    if (const Tensor* t = whole.find(source)) out.insert(key, *t);
  }
  return out;
}

ModelStateLayout PipelineParallelState::model_state_layout() const {
  return {.whole = [this](const TensorDict& local_dict) { return gather(local_dict); },
          .local = [this](const TensorDict& whole) { return local(whole); }};
}

void PipelineParallelState::complete_rng_state(GptCheckpointState& state) const {
  // Each module belongs to one stage: the others contribute zeros, and a sum gathers them.
  std::vector<std::int64_t> streams(2 * whole_dropout_names_.size(), 0);
  // (DualPipe's copies hold the names of their originals' modules: only the originals add theirs.)
  for (std::size_t i = 0; i < whole_dropout_names_.size(); ++i)
    if (auto it = state.dropout_rng.find(whole_dropout_names_[i]);
        it != state.dropout_rng.end() && !mirror_dropout_names_.contains(whole_dropout_names_[i])) {
      streams[2 * i] = static_cast<std::int64_t>(it->second.first);
      streams[2 * i + 1] = static_cast<std::int64_t>(it->second.second);
    }
  pp_.all_reduce(std::span<std::int64_t>(streams), dist::ReduceOp::Sum);
  for (std::size_t i = 0; i < whole_dropout_names_.size(); ++i)
    state.dropout_rng[whole_dropout_names_[i]] = {static_cast<std::uint64_t>(streams[2 * i]),
                                                  static_cast<std::uint64_t>(streams[2 * i + 1])};
}

PipelineOptimizerState::PipelineOptimizerState(optim::Optimizer& inner, const PipelineParallelState& state)
    : optim::Optimizer(inner.name(), inner.param_groups(), inner.lr(), 0.0), inner_(inner), state_(state) {
  for (const auto& g : inner.param_groups())
    for (const Tensor& p : g.params) param_names_.push_back(state.name_of(p));
}

TensorDict PipelineOptimizerState::state_dict() const {
  const TensorDict local = inner_.state_dict();
  TensorDict mine;
  for (const auto& [key, t] : local) {
    const auto parsed = parse_optimizer_state_key(key);
    if (!parsed) continue;  // param_groups.*: written below, for the whole model
    KILN_CHECK(parsed->first < param_names_.size(), "pipeline checkpoint: the optimizer state {} has no parameter",
               key);
    const int whole = state_.whole_index_for_save(param_names_[parsed->first]);
    if (whole < 0) continue;  // the tied copy: its state is the word embeddings'
    mine.insert(fmt::format("state.{}.{}", whole, parsed->second), t);
  }
  TensorDict out = gather_tensor_dicts(state_.group(), mine);
  if (state_.group().rank() != 0) return out;
  // The one-process optimizer's groups: this stage's learning rate and weight decay (the same on
  // every stage), the whole model's sizes.
  TensorDict groups;
  const auto& sizes = state_.whole_group_sizes();
  KILN_CHECK(sizes.size() == inner_.param_groups().size(),
             "pipeline checkpoint: the stage has {} parameter groups, the whole model {}", inner_.param_groups().size(),
             sizes.size());
  for (std::size_t gi = 0; gi < sizes.size(); ++gi) {
    for (const char* what : {"lr", "weight_decay"}) {
      const std::string key = fmt::format("param_groups.{}.{}", gi, what);
      const Tensor* t = local.find(key);
      KILN_CHECK(t != nullptr, "pipeline checkpoint: the optimizer state has no {}", key);
      groups.insert(key, *t);
    }
    groups.insert(fmt::format("param_groups.{}.num_params", gi),
                  Tensor::scalar(static_cast<double>(sizes[gi]), DType::I64));
  }
  for (const auto& [key, t] : out) groups.insert(key, t);
  return groups;
}

void PipelineOptimizerState::load_state_dict(const TensorDict& state) {
  TensorDict mine;
  const auto& groups = inner_.param_groups();
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    for (const char* what : {"lr", "weight_decay"}) {
      const std::string key = fmt::format("param_groups.{}.{}", gi, what);
      if (const Tensor* t = state.find(key)) mine.insert(key, *t);
    }
    mine.insert(fmt::format("param_groups.{}.num_params", gi),
                Tensor::scalar(static_cast<double>(groups[gi].params.size()), DType::I64));
  }
  for (std::size_t i = 0; i < param_names_.size(); ++i) {
    const std::string prefix = fmt::format("state.{}.", state_.whole_index_for_load(param_names_[i]));
    for (const auto& [key, t] : state)
      if (key.starts_with(prefix)) mine.insert(fmt::format("state.{}.{}", i, key.substr(prefix.size())), t);
  }
  inner_.load_state_dict(mine);
}

}  // namespace kiln::train
