#include "kiln/train/data_parallel.h"

#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "kiln/autograd/functions.h"
#include "kiln/ops/elementwise.h"
#include "kiln/optim/clip_grad.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/train/optimizer_state_key.h"

namespace kiln::train {

namespace {

// Side streams on a GPU, so NCCL runs beside the compute stream (backward, the next forward); the
// CPU's one stream otherwise.
Stream communication_stream(Device device) {
  return device.is_cuda() ? Stream::from_pool(device, StreamPriority::High) : Stream::current(device);
}

}  // namespace

DataParallel::DataParallel(optim::GradBuffers& buffers, dist::Communicator group, DataParallelOptions options,
                           std::optional<TensorParallelGrads> tensor_parallel,
                           std::optional<ExpertParallelGrads> expert_parallel,
                           std::optional<PipelineParallelGrads> pipeline_parallel)
    : buffers_(buffers),
      group_(std::move(group)),
      options_(options),
      tp_(std::move(tensor_parallel)),
      ep_(std::move(expert_parallel)),
      pp_(std::move(pipeline_parallel)) {
  if (pp_) {
    for (const Tensor& p : pp_->not_counted) not_counted_.insert(p.impl());
    for (const Tensor& p : pp_->completed_after_backward) {
      completed_after_backward_.insert(p.impl());
      // Its gradient may arrive in parts (a split backward's B and W): complete at finish_backward.
      buffers_.complete_at_finish(p);
    }
  }
  if (tp_ && tp_->group.size() == 1) tp_.reset();
  if (tp_)
    for (const Tensor& p : tp_->replicated) replicated_.insert(p.impl());
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    const optim::ParamAndGradBuffer& buffer = buffers_.buffer(b);
    const dist::Communicator& g = group_of(b);
    KILN_CHECK(!options_.distributed_optimizer || buffer.options().shard_count == g.size(),
               "DataParallel: the gradient buffers split their buckets over {} ranks, the {}data-parallel group has {} "
               "(build them with shard_count = the group's size for --use-distributed-optimizer)",
               buffer.options().shard_count, expert_buffer(b) ? "expert-" : "", g.size());
    started_.emplace_back(buffer.buckets().size(), false);
    if (expert_buffer(b))
      for (const Tensor& p : buffer.params()) expert_params_.insert(p.impl());
    // Rank 0's weights everywhere (Megatron's DDP broadcasts them too): a model whose initialisation
    // differs across ranks would otherwise train a different model on each. (Expert buffers: over the
    // ranks holding the same experts.)
    if (g.size() > 1) dist::broadcast(g, buffer.param_data(), 0).wait();
  }
  if (options_.overlap_grad_reduce && group_.size() > 1)
    buffers_.set_bucket_ready_callback([this](optim::ParamAndGradBuffer& buffer, const optim::GradBucket& bucket) {
      on_bucket_ready(buffer, bucket);
    });
}

void DataParallel::on_bucket_ready(optim::ParamAndGradBuffer& buffer, const optim::GradBucket& bucket) {
  // A reduction in flight would race with the later change (and average the gradient before it):
  // such a bucket waits for finish_grad_sync, which starts every bucket not started yet.
  for (const std::size_t i : bucket.params)
    if (completed_after_backward_.contains(buffer.params()[i].impl())) return;
  start_bucket(buffer, bucket);
}

DataParallel::~DataParallel() {
  if (options_.overlap_grad_reduce && group_.size() > 1) buffers_.set_bucket_ready_callback(nullptr);
}

const dist::Communicator& DataParallel::group_of(std::size_t b) const {
  return expert_buffer(b) ? ep_->expert_data_parallel : group_;
}

std::vector<optim::ElementRange> DataParallel::shard_of(std::size_t b) const {
  const dist::Communicator& g = group_of(b);
  return buffers_.buffer(b).shard_ranges(g.rank(), g.size());
}

optim::FlatOptimizer::Shard DataParallel::optimizer_shard() const {
  if (!options_.distributed_optimizer) return {};
  optim::FlatOptimizer::Shard shard;
  for (std::size_t b = 0; b < buffers_.size(); ++b) shard.push_back(shard_of(b));
  return shard;
}

void DataParallel::start_bucket(optim::ParamAndGradBuffer& buffer, const optim::GradBucket& bucket) {
  std::size_t b = 0;
  while (&buffers_.buffer(b) != &buffer) ++b;
  if (started_[b][bucket.index]) return;
  started_[b][bucket.index] = true;
  const dist::Communicator& g = group_of(b);
  if (g.size() == 1) return;  // an expert buffer whose experts no other rank holds
  const Stream stream = communication_stream(buffer.device());
  if (!options_.distributed_optimizer) {
    grad_work_.push_back({dist::all_reduce(g, bucket.grad_data, dist::ReduceOp::Avg, stream), {}, {}});
    return;
  }
  // The reduce-scatter's output may not alias its input: it lands in a scratch shard, copied into
  // the buffer's shard once complete.
  const optim::ElementRange mine = bucket.shard(g.rank(), g.size());
  Pending p;
  p.scratch = Tensor::empty({mine.numel()}, buffer.grad_dtype(), buffer.device());
  p.destination = optim::ParamAndGradBuffer::narrow(buffer.grad_data(), mine);
  p.work = dist::reduce_scatter(g, bucket.grad_data, p.scratch, dist::ReduceOp::Avg, stream);
  grad_work_.push_back(std::move(p));
}

void DataParallel::finish_grad_sync() {
  if (size() > 1) finish_data_parallel_grad_sync();
  scale_expert_grads();
  reduce_sequence_parallel_grads();
}

void DataParallel::reduce_sequence_parallel_grads() {
  if (!tp_ || tp_->sequence_parallel.empty()) return;
  // Megatron's allreduce of sequence-parallel gradients (finalize_model_grads): each rank's norm
  // weights and row biases saw its slice of the sequence; the sum is the whole sequence's. With the
  // distributed optimizer only this rank's shard of them is meaningful, and the ranks of the group
  // hold the same shard (the same buffer layout and data-parallel rank): summing all of it is right
  // there and harmless elsewhere.
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  for (const Tensor& p : tp_->sequence_parallel) grads.push_back(p.grad().reshape({p.numel()}));
  Tensor flat = cat(grads, 0).contiguous();
  dist::all_reduce(tp_->group, flat, dist::ReduceOp::Sum).wait();
  std::int64_t at = 0;
  for (const Tensor& p : tp_->sequence_parallel) {
    Tensor(p.grad()).copy_(flat.narrow(0, at, p.numel()).reshape(p.shape()));
    at += p.numel();
  }
}

void DataParallel::finish_data_parallel_grad_sync() {
  // In layout order, as GradBuffers::finish_backward notifies: every rank starts the same buckets
  // in the same order.
  for (std::size_t b = 0; b < buffers_.size(); ++b)
    for (const optim::GradBucket& bucket : buffers_.buffer(b).buckets()) start_bucket(buffers_.buffer(b), bucket);
  NoGradGuard no_grad;
  for (Pending& p : grad_work_) {
    p.work.wait();
    if (p.destination.defined()) p.destination.copy_(p.scratch);
  }
  grad_work_.clear();
  for (auto& buffer : started_) std::fill(buffer.begin(), buffer.end(), false);
  for (std::size_t b = 0; b < buffers_.size(); ++b) buffers_.buffer(b).grad_data().storage()->bump_version();
}

void DataParallel::scale_expert_grads() {
  // Expert buffers: averaged over the expert-data-parallel ranks, i.e. summed over them and divided
  // by their count; the data-parallel mean divides by all data-parallel ranks, expert-parallel
  // size times more (each rank's experts saw the tokens of its whole expert-parallel group). With
  // tensor parallelism (no sequence parallelism) the ranks of a tensor-parallel group hold the same
  // tokens and each sends its copy to the experts: an expert's gradient is then the tensor-parallel
  // size times its tokens', and the expert-data-parallel group is that many times smaller, so the
  // same division gives the mean. Also with a data-parallel group of one rank (tp 2 x ep 2 on 2 ranks).
  // With sequence parallelism the ranks of a tensor-parallel group send their own slices of the
  // tokens, no copies: the sum is the tensor-parallel size times smaller, and so is the division
  // (Megatron's scaling: the sum over the expert-data-parallel ranks divided by the data-parallel
  // size, which is EP x EDP / TP).
  if (!ep_ || ep_->expert_parallel.size() == 1) return;
  NoGradGuard no_grad;
  const double scale =
      static_cast<double>(ep_->sequence_parallel_size) / static_cast<double>(ep_->expert_parallel.size());
  if (scale == 1.0) return;
  for (std::size_t b = 0; b < buffers_.size(); ++b)
    if (expert_buffer(b)) {
      Tensor(buffers_.buffer(b).grad_data()).mul_(scale);
      buffers_.buffer(b).grad_data().storage()->bump_version();
    }
}

std::vector<Tensor> DataParallel::shard_grads() const {
  std::vector<Tensor> grads;
  for (std::size_t b = 0; b < buffers_.size(); ++b)
    for (const optim::ElementRange& r : shard_of(b))
      grads.push_back(optim::ParamAndGradBuffer::narrow(buffers_.buffer(b).grad_data(), r));
  return grads;
}

std::vector<Tensor> DataParallel::counted_grads(const std::vector<Tensor>& params, bool experts) const {
  const bool sharded = options_.distributed_optimizer && size() > 1;
  const bool skip_replicated = tp_ && tp_->group.rank() != 0;
  auto skipped = [&](const Tensor& p) {
    return (skip_replicated && replicated_.contains(p.impl())) || not_counted_.contains(p.impl());
  };
  std::vector<Tensor> grads;
  if (!sharded) {
    for (const Tensor& p : params)
      if (p.grad().defined() && !skipped(p) && expert_params_.contains(p.impl()) == experts) grads.push_back(p.grad());
    return grads;
  }
  // This rank's shard of each counted parameter: its buffer range cut by the shard's ranges.
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    if (expert_buffer(b) != experts) continue;
    const optim::ParamAndGradBuffer& buffer = buffers_.buffer(b);
    const std::vector<optim::ElementRange> shard = shard_of(b);
    for (std::size_t i = 0; i < buffer.params().size(); ++i) {
      if (skipped(buffer.params()[i])) continue;
      const optim::ElementRange r = buffer.range_of(i);
      for (const optim::ElementRange& s : shard) {
        const std::int64_t begin = std::max(r.begin, s.begin), end = std::min(r.end, s.end);
        if (begin < end) grads.push_back(optim::ParamAndGradBuffer::narrow(buffer.grad_data(), {begin, end}));
      }
    }
  }
  return grads;
}

Tensor DataParallel::clip_grad_norm(const std::vector<Tensor>& params, double max_norm) {
  const bool sharded = options_.distributed_optimizer && size() > 1;
  if (!sharded && !tp_ && !ep_ && !pp_)
    // The gradients are the same on every rank: the local norm is the global one.
    return max_norm > 0 ? optim::clip_grad_norm_(params, max_norm) : optim::grad_norm(params);
  NoGradGuard no_grad;
  // With the distributed optimizer each rank holds the reduced gradients of its shard only (padding
  // is zeros): the squares add up over the data-parallel group. Under tensor parallelism the
  // shards' squares add up over the tensor-parallel group, each replicated parameter counted on its
  // rank 0 only (Megatron's param_is_not_tensor_parallel_duplicate).
  const Device device = buffers_.buffer(0).device();
  Tensor squares = optim::sum_of_squares(counted_grads(params, /*experts=*/false));
  if (squares.device() != device) squares = squares.to(device);
  if (sharded) dist::all_reduce(group_, squares, dist::ReduceOp::Sum).wait();
  if (tp_) dist::all_reduce(tp_->group, squares, dist::ReduceOp::Sum).wait();
  if (ep_) {
    // The experts' squares: over the expert-data-parallel shards, then over the expert-parallel
    // ranks, which hold different experts.
    Tensor expert_squares = optim::sum_of_squares(counted_grads(params, /*experts=*/true));
    if (expert_squares.device() != device) expert_squares = expert_squares.to(device);
    if (sharded) dist::all_reduce(ep_->expert_data_parallel, expert_squares, dist::ReduceOp::Sum).wait();
    dist::all_reduce(ep_->expert_parallel, expert_squares, dist::ReduceOp::Sum).wait();
    squares = add(squares, expert_squares);
  }
  if (pp_) dist::all_reduce(pp_->group, squares, dist::ReduceOp::Sum).wait();
  Tensor norm = ops::unary(ops::UnaryOp::Sqrt, squares);
  if (max_norm > 0) {
    std::vector<Tensor> all;
    if (sharded) {
      all = shard_grads();
    } else {
      for (const Tensor& p : params)
        if (p.grad().defined()) all.push_back(p.grad());
    }
    optim::clip_to_norm_(all, norm, max_norm);
  }
  return norm;
}

void DataParallel::start_param_gather() {
  if (!options_.distributed_optimizer || size() == 1) return;
  for (std::size_t b = 0; b < buffers_.size(); ++b) {
    optim::ParamAndGradBuffer& buffer = buffers_.buffer(b);
    const dist::Communicator& g = group_of(b);
    if (g.size() == 1) continue;
    for (const optim::GradBucket& bucket : buffer.buckets()) {
      // In place: this rank's shard is its block of the bucket.
      const Tensor mine = optim::ParamAndGradBuffer::narrow(buffer.param_data(), bucket.shard(g.rank(), g.size()));
      param_work_.push_back(
          {dist::all_gather(g, mine, bucket.param_data, communication_stream(buffer.device())), {}, {}});
    }
  }
  if (!options_.overlap_param_gather) finish_param_gather();
}

void DataParallel::finish_param_gather() {
  if (param_work_.empty()) return;
  for (Pending& p : param_work_) p.work.wait();
  param_work_.clear();
  for (std::size_t b = 0; b < buffers_.size(); ++b) buffers_.buffer(b).param_data().storage()->bump_version();
}

void DataParallel::average(Tensor& value) const {
  if (size() > 1) dist::all_reduce(group_, value, dist::ReduceOp::Avg).wait();
}

void DataParallel::sum(Tensor& value) const {
  if (size() > 1) dist::all_reduce(group_, value, dist::ReduceOp::Sum).wait();
}

// ---------------------------------------------------------------------------------------------

namespace {

// The optimizer's parameters in state-dict numbering (across groups, in order).
std::vector<Tensor> numbered_params(const optim::Optimizer& optimizer) {
  std::vector<Tensor> params;
  for (const auto& g : optimizer.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  return params;
}

constexpr const char* kStateCall = "the distributed optimizer's state";

bool has_master(const Tensor& param) { return param.dtype() != DType::F32 && param.dtype() != DType::F64; }

}  // namespace

GatheredOptimizerState::GatheredOptimizerState(optim::FlatOptimizer& inner, const dist::Communicator& group,
                                               std::vector<std::string> state_names,
                                               std::optional<dist::Communicator> expert_group)
    : optim::Optimizer(inner.name(), inner.param_groups(), inner.lr(), 0.0),
      inner_(inner),
      group_(group),
      state_names_(std::move(state_names)),
      expert_group_(std::move(expert_group)) {}

TensorDict GatheredOptimizerState::state_dict() const {
  const TensorDict local = inner_.state_dict();
  optim::GradBuffers& buffers = inner_.buffers();
  const std::vector<Tensor> params = numbered_params(inner_);
  TensorDict out;
  for (const auto& [key, value] : local)
    if (key.starts_with("param_groups.")) out.insert(key, value);
  // Per buffer and state name, one flat f32 tensor laid out as the buffer: each rank writes its
  // pieces, zeros elsewhere, and a sum over the group assembles them exactly (the shards are disjoint).
  std::vector<std::string> names = state_names_;
  names.insert(names.begin(), "master");
  std::int64_t step = 0;
  for (const auto& [key, value] : local)
    if (key.ends_with(".step")) step = std::max<std::int64_t>(step, static_cast<std::int64_t>(value.item()));
  NoGradGuard no_grad;
  for (const std::string& name : names) {
    std::vector<Tensor> flat;
    for (std::size_t b = 0; b < buffers.size(); ++b)
      flat.push_back(Tensor::zeros({buffers.buffer(b).numel()}, DType::F32, buffers.buffer(b).device()));
    bool any = false;
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (name == "master" && !has_master(params[i])) continue;
      any = true;
      const Tensor* mine = local.find(fmt::format("state.{}.{}", i, name));
      if (mine == nullptr) continue;  // another rank's shard holds this parameter
      const auto where = buffers.locate(params[i]);
      KILN_CHECK(where.has_value(), "{}: parameter {} is in no gradient buffer", kStateCall, i);
      const optim::ElementRange r = buffers.buffer(where->buffer).range_of(where->index);
      std::int64_t begin = 0, end = params[i].numel();
      if (const Tensor* sh = local.find(fmt::format("state.{}.shard", i))) {
        const auto v = sh->to_vector<std::int64_t>();
        begin = v[0], end = v[1];
      }
      optim::ParamAndGradBuffer::narrow(flat[where->buffer], {r.begin + begin, r.begin + end})
          .copy_(mine->reshape({end - begin}));
    }
    if (!any) continue;
    // Expert buffers are sharded over the expert-data-parallel group (the ranks holding the same experts).
    for (std::size_t b = 0; b < flat.size(); ++b)
      dist::all_reduce(expert_group_ && buffers.is_expert_buffer(b) ? *expert_group_ : group_, flat[b],
                       dist::ReduceOp::Sum)
          .wait();
    for (std::size_t i = 0; i < params.size(); ++i) {
      if (name == "master" && !has_master(params[i])) continue;
      const auto where = buffers.locate(params[i]);
      const optim::ElementRange r = buffers.buffer(where->buffer).range_of(where->index);
      out.insert(fmt::format("state.{}.{}", i, name),
                 optim::ParamAndGradBuffer::narrow(flat[where->buffer], r).reshape(params[i].shape()).clone());
    }
  }
  step = group_.all_reduce_value(step, dist::ReduceOp::Max);
  for (std::size_t i = 0; i < params.size(); ++i)
    out.insert(fmt::format("state.{}.step", i), Tensor::scalar(static_cast<double>(step), DType::I64));
  return out;
}

void GatheredOptimizerState::load_state_dict(const TensorDict& state) {
  // This rank's part of `state`, in the form the inner optimizer's own state_dict() has.
  const TensorDict local = inner_.state_dict();
  TensorDict mine;
  for (const auto& [key, value] : local) {
    if (key.starts_with("param_groups.")) {
      const Tensor* given = state.find(key);
      mine.insert(key, given ? *given : value);
      continue;
    }
    const auto parsed = parse_optimizer_state_key(key);
    if (!parsed || parsed->second == "shard") {
      mine.insert(key, value);
      continue;
    }
    const Tensor* whole = state.find(key);
    KILN_CHECK(whole != nullptr, "{}: the state has no {} (a checkpoint of another model or optimizer?)", kStateCall,
               key);
    if (parsed->second == "step") {
      mine.insert(key, *whole);
      continue;
    }
    if (const Tensor* sh = local.find(fmt::format("state.{}.shard", parsed->first))) {
      const auto v = sh->to_vector<std::int64_t>();
      KILN_CHECK(whole->numel() >= v[1], "{}: {} holds {} elements, this rank's shard needs [{}, {})", kStateCall, key,
                 whole->numel(), v[0], v[1]);
      mine.insert(key, whole->contiguous().reshape({whole->numel()}).narrow(0, v[0], v[1] - v[0]).contiguous());
    } else {
      mine.insert(key, *whole);
    }
  }
  inner_.load_state_dict(mine);
}

}  // namespace kiln::train
