#include "kiln/optim/optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <tuple>

#include "kiln/ops/copy.h"
#include "kiln/ops/elementwise.h"
#include "kiln/ops/kernels.h"
#include "kiln/runtime/graph_capture_state.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::optim {

namespace {

// Parameters updated by one kernel call share a device, a dtype and the per-call hyperparameters
// that vary per parameter (Adam's step count, SGD's first-step flag).
using BucketKey = std::tuple<int, int, int, std::int64_t>;
BucketKey bucket_key(const Tensor& p, std::int64_t extra) {
  return {static_cast<int>(p.device().kind), p.device().index, static_cast<int>(p.dtype()), extra};
}

std::vector<ParamGroup> single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = std::move(params);
  return groups;
}

struct Bucket {
  Device device;
  std::vector<Tensor> params, grads, a, b;
};

}  // namespace

Optimizer::Optimizer(std::string name, std::vector<ParamGroup> groups, double default_lr, double default_weight_decay,
                     bool capturable)
    : name_(std::move(name)),
      default_lr_(default_lr),
      default_weight_decay_(default_weight_decay),
      capturable_(capturable) {
  KILN_CHECK(!groups.empty(), "{}: no parameter groups", name_);
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::add_param_group(ParamGroup group) {
  if (!group.lr) group.lr = default_lr_ * group.lr_mult;
  if (!group.weight_decay) group.weight_decay = default_weight_decay_;
  KILN_CHECK(*group.lr >= 0, "{}: invalid learning rate {}", name_, *group.lr);
  KILN_CHECK(*group.weight_decay >= 0, "{}: invalid weight_decay {}", name_, *group.weight_decay);
  for (std::size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    KILN_CHECK(p.defined(), "{}: a parameter is undefined", name_);
    for (std::size_t j = 0; j < i; ++j)
      KILN_CHECK(!group.params[j].is_same(p), "{}: a parameter group lists the same parameter twice", name_);
    KILN_CHECK(p.is_leaf(), "{}: can't optimize a non-leaf tensor {}", name_, p.describe());
    for (const auto& g : groups_)
      for (const Tensor& q : g.params)
        KILN_CHECK(!q.is_same(p), "{}: some parameters appear in more than one parameter group", name_);
  }
  groups_.push_back(std::move(group));
}

void Optimizer::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const auto& g : groups_)
    for (const Tensor& p : g.params) {
      if (!p.grad().defined()) continue;
      if (set_to_none)
        p.impl()->grad.reset();
      else
        p.grad().zero_();
    }
}

void Optimizer::set_lr(double lr) {
  for (auto& g : groups_) g.lr = lr * g.lr_mult;
  sync_lr_to_device();
}

void Optimizer::sync_lr_to_device() {
  if (!capturable_) return;
  for (std::size_t gi = 0; gi < device_scalars_.size() && gi < groups_.size(); ++gi) {
    DeviceScalars& ds = device_scalars_[gi];
    const double lr = *groups_[gi].lr;
    if (!ds.lr.defined() || ds.written_lr == lr) continue;
    // A write during capture would be baked into the graph and undo every later set_lr().
    KILN_CHECK(!graph_capture_active(),
               "{}: the learning rate changed during CUDA graph capture; call set_lr() before "
               "capture_begin() and before each replay()",
               name_);
    ops::fill(ds.lr, lr);  // a kernel in stream order: the next step (or replay) reads it
    ds.written_lr = lr;
  }
}

std::int64_t Optimizer::host_step(std::size_t gi) const {
  std::int64_t step = 0;
  for (const Tensor& p : groups_[gi].params) {
    auto it = state_.find(p.impl());
    if (it != state_.end()) step = std::max(step, it->second.step);
  }
  return step;
}

Optimizer::DeviceScalars& Optimizer::advance_device_step(std::size_t gi) {
  if (device_scalars_.size() < groups_.size()) device_scalars_.resize(groups_.size());
  DeviceScalars& ds = device_scalars_[gi];
  const Device device = groups_[gi].params.at(0).device();
  if (!ds.step.defined() || ds.step.device() != device) {
    KILN_CHECK(!graph_capture_active(),
               "{}: run one step() eagerly before capturing it in a CUDA graph (the capturable "
               "optimizer's device scalars and state are created then)",
               name_);
    // Moving devices keeps the device count; otherwise start from the host state, minus this
    // step (step() has already counted it on the host).
    const double step = ds.step.defined() ? ds.step.item() : static_cast<double>(host_step(gi) - 1);
    ds.step = Tensor::scalar(step, DType::F64, device);
    ds.lr = Tensor::scalar(*groups_[gi].lr, DType::F64, device);
    ds.written_lr = *groups_[gi].lr;
  }
  sync_lr_to_device();
  ops::binary_(ops::BinaryOp::Add, ds.step, 1.0);  // on the device: captured with the update
  return ds;
}

Tensor Optimizer::checked_grad(const Tensor& p) const {
  Tensor g = p.grad();
  KILN_CHECK(p.is_contiguous(), "{}: parameter {} is not contiguous", name_, p.describe());
  KILN_CHECK(g.dtype() == p.dtype() && g.shape() == p.shape() && g.device() == p.device(),
             "{}: gradient {} does not match parameter {}", name_, g.describe(), p.describe());
  return ops::contiguous(g);
}

TensorDict Optimizer::state_dict() const {
  TensorDict out;
  std::int64_t index = 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    out.insert(fmt::format("param_groups.{}.lr", gi), Tensor::scalar(*g.lr, DType::F64));
    out.insert(fmt::format("param_groups.{}.weight_decay", gi), Tensor::scalar(*g.weight_decay, DType::F64));
    out.insert(fmt::format("param_groups.{}.num_params", gi),
               Tensor::scalar(static_cast<double>(g.params.size()), DType::I64));
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    // Capturable mode: the device holds the group's count (the host's is stale after replays).
    std::optional<double> device_step;
    if (capturable_ && gi < device_scalars_.size() && device_scalars_[gi].step.defined())
      device_step = device_scalars_[gi].step.item();
    for (const Tensor& p : g.params) {
      auto it = state_.find(p.impl());
      if (it != state_.end()) {
        const ParamState& s = it->second;
        const double step = device_step ? *device_step : static_cast<double>(s.step);
        out.insert(fmt::format("state.{}.step", index), Tensor::scalar(step, DType::I64));
        if (s.exp_avg.defined()) out.insert(fmt::format("state.{}.exp_avg", index), s.exp_avg);
        if (s.exp_avg_sq.defined()) out.insert(fmt::format("state.{}.exp_avg_sq", index), s.exp_avg_sq);
        if (s.momentum_buffer.defined()) out.insert(fmt::format("state.{}.momentum_buffer", index), s.momentum_buffer);
      }
      ++index;
    }
  }
  return out;
}

void Optimizer::load_state_dict(const TensorDict& state) {
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Tensor* n = state.find(fmt::format("param_groups.{}.num_params", gi));
    KILN_CHECK(n != nullptr,
               "{}.load_state_dict: no entry for parameter group {} (the state has a different number "
               "of groups)",
               name_, gi);
    KILN_CHECK(static_cast<std::size_t>(n->item()) == groups_[gi].params.size(),
               "{}.load_state_dict: parameter group {} has {} parameters, the state {}", name_, gi,
               groups_[gi].params.size(), static_cast<std::int64_t>(n->item()));
  }
  KILN_CHECK(!state.contains(fmt::format("param_groups.{}.num_params", groups_.size())),
             "{}.load_state_dict: the state has more than {} parameter groups", name_, groups_.size());
  // Validate everything first, then install, so a bad state leaves the optimizer unchanged.
  std::unordered_map<const TensorImpl*, ParamState> loaded;
  std::int64_t index = 0;
  for (const auto& g : groups_) {
    for (const Tensor& p : g.params) {
      const Tensor* step = state.find(fmt::format("state.{}.step", index));
      if (step) {
        ParamState s;
        s.step = static_cast<std::int64_t>(step->item());
        auto take = [&](const char* what, Tensor& dst) {
          const Tensor* t = state.find(fmt::format("state.{}.{}", index, what));
          if (!t) return;
          KILN_CHECK(t->shape() == p.shape(), "{}.load_state_dict: state.{}.{} has shape {} but parameter {} is {}",
                     name_, index, what, shape_str(t->shape()), index, shape_str(p.shape()));
          // No silent conversion: a same-sized tensor of another dtype would turn into garbage moments.
          KILN_CHECK(t->dtype() == p.dtype(), "{}.load_state_dict: state.{}.{} is {} but parameter {} is {}", name_,
                     index, what, dtype_name(t->dtype()), index, dtype_name(p.dtype()));
          dst = Tensor::empty(p.shape(), p.dtype(), p.device());
          ops::copy_into(dst, *t);
        };
        take("exp_avg", s.exp_avg);
        take("exp_avg_sq", s.exp_avg_sq);
        take("momentum_buffer", s.momentum_buffer);
        loaded[p.impl()] = std::move(s);
      }
      ++index;
    }
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    if (const Tensor* lr = state.find(fmt::format("param_groups.{}.lr", gi))) groups_[gi].lr = lr->item();
    if (const Tensor* wd = state.find(fmt::format("param_groups.{}.weight_decay", gi)))
      groups_[gi].weight_decay = wd->item();
  }
  state_ = std::move(loaded);
  // Capturable mode: rewrite existing device scalars in place (a captured graph holds their
  // addresses); new ones are made from the host state at the next step().
  for (std::size_t gi = 0; gi < device_scalars_.size() && gi < groups_.size(); ++gi) {
    DeviceScalars& ds = device_scalars_[gi];
    if (!ds.step.defined()) continue;
    KILN_CHECK(!graph_capture_active(), "{}.load_state_dict: not allowed during CUDA graph capture", name_);
    ops::fill(ds.step, static_cast<double>(host_step(gi)));
    ops::fill(ds.lr, *groups_[gi].lr);
    ds.written_lr = *groups_[gi].lr;
  }
}

// ---- SGD
SGD::SGD(std::vector<Tensor> params, SGDOptions options) : SGD(single_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, SGDOptions options)
    : Optimizer("SGD", std::move(groups), options.lr, options.weight_decay, options.capturable), options_(options) {
  KILN_CHECK(options.momentum >= 0, "SGD: invalid momentum {}", options.momentum);
  KILN_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
             "SGD: Nesterov momentum requires a momentum and zero dampening");
}

void SGD::step() {
  NoGradGuard no_grad;
  const bool use_momentum = options_.momentum != 0;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    std::map<BucketKey, Bucket> buckets;
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      Tensor g = checked_grad(p);
      ParamState& s = state_for(p);
      bool first = false;
      if (use_momentum && !s.momentum_buffer.defined()) {
        KILN_CHECK(!graph_capture_active(), "{}: run one step() eagerly before capturing it (state is created then)",
                   name_);
        s.momentum_buffer = Tensor::empty(p.shape(), p.dtype(), p.device());
        first = true;
      }
      ++s.step;
      Bucket& b = buckets.try_emplace(bucket_key(p, first), Bucket{p.device(), {}, {}, {}, {}}).first->second;
      b.params.push_back(p);
      b.grads.push_back(g);
      if (use_momentum) b.a.push_back(s.momentum_buffer);
    }
    if (buckets.empty()) continue;
    const double* lr_ptr = nullptr;
    if (capturable_) {
      DeviceScalars& ds = advance_device_step(gi);
      lr_ptr = static_cast<const double*>(ds.lr.data_ptr());
      for (const auto& [key, b] : buckets)
        KILN_CHECK(b.device == ds.lr.device(), "{}: capturable mode needs every parameter of a group on one device",
                   name_);
    }
    for (auto& [key, b] : buckets) {
      ops::SgdParams hp;
      hp.lr_ptr = lr_ptr;
      hp.lr = *group.lr;
      hp.momentum = options_.momentum;
      hp.dampening = options_.dampening;
      hp.weight_decay = *group.weight_decay;
      hp.nesterov = options_.nesterov;
      hp.first_step = std::get<3>(key) != 0;
      KILN_KERNEL(b.device, sgd_step)(b.params, b.grads, b.a, {}, hp);
      for (const Tensor& p : b.params) p.storage()->bump_version();
    }
  }
}

// ---- Adam / AdamW
Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : Adam("Adam", single_group(std::move(params)), options, false) {}

Adam::Adam(std::vector<ParamGroup> groups, AdamOptions options) : Adam("Adam", std::move(groups), options, false) {}

Adam::Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled)
    : Optimizer(std::move(name), std::move(groups), options.lr, options.weight_decay, options.capturable),
      options_(options),
      decoupled_(decoupled) {
  KILN_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             "{}: invalid betas ({}, {})", name_, options.beta1, options.beta2);
  KILN_CHECK(options.eps >= 0, "{}: invalid eps {}", name_, options.eps);
}

void Adam::step() {
  NoGradGuard no_grad;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const ParamGroup& group = groups_[gi];
    std::map<BucketKey, Bucket> buckets;
    for (const Tensor& p : group.params) {
      if (!p.grad().defined()) continue;
      Tensor g = checked_grad(p);
      ParamState& s = state_for(p);
      if (!s.exp_avg.defined()) {
        KILN_CHECK(!graph_capture_active(), "{}: run one step() eagerly before capturing it (state is created then)",
                   name_);
        s.exp_avg = Tensor::zeros(p.shape(), p.dtype(), p.device());
        s.exp_avg_sq = Tensor::zeros(p.shape(), p.dtype(), p.device());
      }
      ++s.step;
      // Capturable: one bucket per device and dtype (the group's step is on the device).
      Bucket& b = buckets.try_emplace(bucket_key(p, capturable_ ? 0 : s.step), Bucket{p.device(), {}, {}, {}, {}})
                      .first->second;
      b.params.push_back(p);
      b.grads.push_back(g);
      b.a.push_back(s.exp_avg);
      b.b.push_back(s.exp_avg_sq);
    }
    if (buckets.empty()) continue;
    const double *lr_ptr = nullptr, *step_ptr = nullptr;
    if (capturable_) {
      DeviceScalars& ds = advance_device_step(gi);
      lr_ptr = static_cast<const double*>(ds.lr.data_ptr());
      step_ptr = static_cast<const double*>(ds.step.data_ptr());
      for (const auto& [key, b] : buckets)
        KILN_CHECK(b.device == ds.lr.device(), "{}: capturable mode needs every parameter of a group on one device",
                   name_);
    }
    for (auto& [key, b] : buckets) {
      ops::AdamParams hp;
      hp.lr_ptr = lr_ptr;
      hp.step_ptr = step_ptr;
      hp.lr = *group.lr;
      hp.beta1 = options_.beta1;
      hp.beta2 = options_.beta2;
      hp.eps = options_.eps;
      hp.weight_decay = *group.weight_decay;
      hp.decoupled_weight_decay = decoupled_;
      hp.step = std::get<3>(key);
      KILN_KERNEL(b.device, adam_step)(b.params, b.grads, b.a, b.b, {}, hp);
      for (const Tensor& p : b.params) p.storage()->bump_version();
    }
  }
}

AdamW::AdamW(std::vector<Tensor> params, AdamOptions options)
    : Adam("AdamW", single_group(std::move(params)), options, true) {}

AdamW::AdamW(std::vector<ParamGroup> groups, AdamOptions options) : Adam("AdamW", std::move(groups), options, true) {}

}  // namespace kiln::optim
