#include "kiln/optim/flat_optimizer.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "kiln/ops/kernels.h"
#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/views.h"

namespace kiln::optim {

namespace {

std::vector<ParamGroup> one_group(const GradBuffers& buffers) {
  std::vector<ParamGroup> groups(1);
  groups[0].params = buffers.params();
  return groups;
}

// Sorted, in bounds, not overlapping; adjacent ranges merged, empty ones dropped.
std::vector<ElementRange> normalise(const std::string& name, std::vector<ElementRange> ranges, std::size_t b,
                                    const ParamAndGradBuffer& buf) {
  for (const ElementRange& r : ranges)
    KILN_CHECK(r.begin >= 0 && r.begin <= r.end && r.end <= buf.numel(),
               "{}: shard range [{}, {}) of buffer {} is out of bounds (the buffer holds {} elements of {})", name,
               r.begin, r.end, b, buf.numel(), dtype_name(buf.param_dtype()));
  std::sort(ranges.begin(), ranges.end(),
            [](const ElementRange& x, const ElementRange& y) { return x.begin < y.begin; });
  std::vector<ElementRange> out;
  for (const ElementRange& r : ranges) {
    if (r.numel() == 0) continue;
    if (!out.empty()) {
      KILN_CHECK(r.begin >= out.back().end, "{}: shard ranges [{}, {}) and [{}, {}) of buffer {} overlap", name,
                 out.back().begin, out.back().end, r.begin, r.end, b);
      if (r.begin == out.back().end) {
        out.back().end = r.end;
        continue;
      }
    }
    out.push_back(r);
  }
  return out;
}

Tensor shaped(const Tensor& flat, const Shape& shape) { return views::view(flat, shape); }

}  // namespace

FlatOptimizer::FlatOptimizer(std::string name, GradBuffers& buffers, std::vector<ParamGroup> groups, double default_lr,
                             double default_weight_decay, Shard shard, std::vector<std::string> state_names)
    : Optimizer(std::move(name), std::move(groups), default_lr, default_weight_decay, false),
      buffers_(buffers),
      shard_(std::move(shard)),
      state_names_(std::move(state_names)) {
  const std::size_t nb = buffers.size();
  if (shard_.empty())
    for (std::size_t b = 0; b < nb; ++b) shard_.push_back({{0, buffers.buffer(b).numel()}});
  KILN_CHECK(shard_.size() == nb, "{}: the shard lists ranges for {} buffers, but the gradient buffers are {}", name_,
             shard_.size(), nb);
  for (std::size_t b = 0; b < nb; ++b) shard_[b] = normalise(name_, std::move(shard_[b]), b, buffers.buffer(b));

  // Which group and state-dict number each buffered parameter has (torch.optim's numbering).
  struct Owner {
    std::size_t group = 0, number = 0;
    bool present = false;
  };
  std::vector<std::vector<Owner>> owner(nb);
  for (std::size_t b = 0; b < nb; ++b) owner[b].resize(buffers.buffer(b).params().size());
  std::size_t number = 0;
  for (std::size_t g = 0; g < groups_.size(); ++g)
    for (const Tensor& p : groups_[g].params) {
      auto loc = buffers.locate(p);
      KILN_CHECK(loc.has_value(), "{}: parameter {} of group {} ({}) is not in the gradient buffers", name_, number, g,
                 p.describe());
      owner[loc->buffer][loc->index] = {g, number++, true};
    }

  NoGradGuard no_grad;
  std::map<std::pair<std::size_t, std::size_t>, Batch> batches;  // by (group, buffer)
  std::vector<int> pieces_of(number, 0);
  for (std::size_t b = 0; b < nb; ++b) {
    const ParamAndGradBuffer& buf = buffers.buffer(b);
    const bool separate_master = buf.param_dtype() != DType::F32;
    // fp8 bytes are not values (their scales live in the layers): set_master() seeds these masters.
    const bool fp8_buffer = is_fp8(buf.param_dtype());
    for (const ElementRange& r : shard_[b]) {
      const Tensor param_range = ParamAndGradBuffer::narrow(buf.param_data(), r);
      Tensor master = param_range;
      if (separate_master) {
        master = Tensor::zeros({r.numel()}, DType::F32, buf.device());
        if (!fp8_buffer) master.copy_(param_range);
        master_storage_.push_back(master);
      }
      std::vector<Tensor> state;
      for (std::size_t s = 0; s < state_names_.size(); ++s) {
        state.push_back(Tensor::zeros({r.numel()}, DType::F32, buf.device()));
        state_storage_.push_back(state.back());
      }
      for (std::size_t i = 0; i < buf.params().size(); ++i) {
        const ElementRange pr = buf.range_of(i);
        const std::int64_t s = std::max(pr.begin, r.begin), e = std::min(pr.end, r.end);
        if (s >= e || !owner[b][i].present) continue;
        const Owner& o = owner[b][i];
        KILN_CHECK(++pieces_of[o.number] == 1,
                   "{}: the shard cuts parameter {} ({}) into more than one piece; give each parameter one contiguous "
                   "range",
                   name_, o.number, buf.params()[i].describe());
        Piece piece;
        piece.param = o.number;
        piece.parameter = buf.params()[i];
        piece.elements = {s - pr.begin, e - pr.begin};
        const ElementRange local{s - r.begin, e - r.begin};
        piece.master = ParamAndGradBuffer::narrow(master, local);
        piece.grad = ParamAndGradBuffer::narrow(buf.grad_data(), {s, e});
        piece.has_master = separate_master;
        piece.fp8 = fp8_buffer;
        piece.seeded = !fp8_buffer;
        if (separate_master && !fp8_buffer) piece.model = ParamAndGradBuffer::narrow(buf.param_data(), {s, e});
        for (const Tensor& t : state) piece.state.push_back(ParamAndGradBuffer::narrow(t, local));

        Batch& batch = batches.try_emplace({o.group, b}).first->second;
        batch.group = o.group;
        batch.device = buf.device();
        batch.state.resize(state_names_.size());
        batch.masters.push_back(piece.master);
        batch.grads.push_back(piece.grad);
        if (piece.model.defined()) batch.models.push_back(piece.model);
        for (std::size_t k = 0; k < piece.state.size(); ++k) batch.state[k].push_back(piece.state[k]);
        pieces_.push_back(std::move(piece));
      }
    }
  }
  for (auto& [key, batch] : batches) batches_.push_back(std::move(batch));
}

void FlatOptimizer::zero_grad(bool /*set_to_none*/) { buffers_.zero_grad(); }

std::vector<FlatOptimizer::MasterPiece> FlatOptimizer::fp8_master_pieces() const {
  std::vector<MasterPiece> out;
  for (const Piece& p : pieces_)
    if (p.fp8) out.push_back({p.parameter, p.elements, p.master});
  return out;
}

void FlatOptimizer::set_master(const Tensor& param, const Tensor& value) {
  KILN_CHECK(value.defined() && value.shape() == param.shape() && is_floating(value.dtype()) && !is_fp8(value.dtype()),
             "{}.set_master: the value {} must be a high-precision tensor of the parameter's shape {}", name_,
             value.defined() ? value.describe() : "undefined", shape_str(param.shape()));
  NoGradGuard no_grad;
  for (Piece& p : pieces_) {
    if (!p.parameter.is_same(param)) continue;
    KILN_CHECK(p.has_master, "{}.set_master: parameter {} ({}) is its own master", name_, p.param, param.describe());
    const Tensor flat = value.detach().to(p.master.device()).contiguous().reshape({value.numel()});
    p.master.copy_(ParamAndGradBuffer::narrow(flat, p.elements));
    p.seeded = true;
  }
}

void FlatOptimizer::begin_step() {
  buffers_.check_views(name_.c_str());
  for (const Piece& p : pieces_)
    KILN_CHECK(p.seeded,
               "{}: the master of fp8 parameter {} ({}) was never set: call set_master() with its high-precision "
               "value before the first step",
               name_, p.param, p.parameter.describe());
  ++step_;
}

void FlatOptimizer::finish_step() {
  for (std::size_t b = 0; b < buffers_.size(); ++b) buffers_.buffer(b).param_data().storage()->bump_version();
}

TensorDict FlatOptimizer::state_dict() const {
  TensorDict out;
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const auto& g = groups_[gi];
    out.insert(fmt::format("param_groups.{}.lr", gi), Tensor::scalar(*g.lr, DType::F64));
    out.insert(fmt::format("param_groups.{}.weight_decay", gi), Tensor::scalar(*g.weight_decay, DType::F64));
    out.insert(fmt::format("param_groups.{}.num_params", gi),
               Tensor::scalar(static_cast<double>(g.params.size()), DType::I64));
  }
  std::vector<const Piece*> ordered;
  for (const Piece& p : pieces_) ordered.push_back(&p);
  std::sort(ordered.begin(), ordered.end(), [](const Piece* a, const Piece* b) { return a->param < b->param; });
  for (const Piece* p : ordered) {
    const bool whole = p->elements.numel() == p->parameter.numel();
    auto as_saved = [&](const Tensor& flat) { return whole ? shaped(flat, p->parameter.shape()) : flat; };
    out.insert(fmt::format("state.{}.step", p->param), Tensor::scalar(static_cast<double>(step_), DType::I64));
    if (!whole)
      out.insert(fmt::format("state.{}.shard", p->param),
                 Tensor::from_vector<std::int64_t>({p->elements.begin, p->elements.end}));
    if (p->has_master) out.insert(fmt::format("state.{}.master", p->param), as_saved(p->master));
    for (std::size_t k = 0; k < state_names_.size(); ++k)
      out.insert(fmt::format("state.{}.{}", p->param, state_names_[k]), as_saved(p->state[k]));
  }
  return out;
}

void FlatOptimizer::load_state_dict(const TensorDict& state) {
  const std::string call = name_ + ".load_state_dict";
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    const Tensor* n = state.find(fmt::format("param_groups.{}.num_params", gi));
    KILN_CHECK(n != nullptr, "{}: no entry for parameter group {} (the state has a different number of groups)", call,
               gi);
    KILN_CHECK(static_cast<std::size_t>(n->item()) == groups_[gi].params.size(),
               "{}: parameter group {} has {} parameters, the state {}", call, gi, groups_[gi].params.size(),
               static_cast<std::int64_t>(n->item()));
  }
  KILN_CHECK(!state.contains(fmt::format("param_groups.{}.num_params", groups_.size())),
             "{}: the state has more than {} parameter groups", call, groups_.size());

  // Validate everything first, then install, so a bad state leaves the optimizer unchanged.
  std::vector<std::pair<Tensor, const Tensor*>> copies;  // (destination, source)
  std::int64_t step = -1;
  for (const Piece& p : pieces_) {
    const Tensor* st = state.find(fmt::format("state.{}.step", p.param));
    KILN_CHECK(st != nullptr,
               "{}: no state.{}.step for parameter {} ({}): the state holds another part of the buffers (saved "
               "with another shard?) or another model",
               call, p.param, p.param, p.parameter.describe());
    const auto s = static_cast<std::int64_t>(st->item());
    KILN_CHECK(step < 0 || s == step, "{}: state.{}.step is {} but other parameters are at step {}", call, p.param, s,
               step);
    step = s;
    const bool whole = p.elements.numel() == p.parameter.numel();
    const Tensor* sh = state.find(fmt::format("state.{}.shard", p.param));
    if (whole) {
      KILN_CHECK(sh == nullptr,
                 "{}: state.{}.shard says the state holds part of parameter {}, this optimizer all of it", call,
                 p.param, p.param);
    } else {
      KILN_CHECK(sh != nullptr && sh->numel() == 2,
                 "{}: parameter {} is held in part ([{}, {})) but the state has no state.{}.shard", call, p.param,
                 p.elements.begin, p.elements.end, p.param);
      const auto r = sh->to_vector<std::int64_t>();
      KILN_CHECK(r[0] == p.elements.begin && r[1] == p.elements.end,
                 "{}: state.{}.shard is [{}, {}) but this optimizer holds elements [{}, {}) of parameter {}", call,
                 p.param, r[0], r[1], p.elements.begin, p.elements.end, p.param);
    }
    auto take = [&](const std::string& what, const Tensor& dst) {
      const std::string key = fmt::format("state.{}.{}", p.param, what);
      const Tensor* t = state.find(key);
      KILN_CHECK(t != nullptr, "{}: the state has no {}", call, key);
      KILN_CHECK(whole ? t->shape() == p.parameter.shape() : (t->dim() == 1 && t->numel() == dst.numel()),
                 "{}: {} is {} but parameter {} is {} (holding elements [{}, {}))", call, key, t->describe(), p.param,
                 p.parameter.describe(), p.elements.begin, p.elements.end);
      KILN_CHECK(is_floating(t->dtype()), "{}: {} is {}, expected a floating tensor", call, key, t->describe());
      copies.emplace_back(whole ? shaped(dst, t->shape()) : dst, t);
    };
    if (p.has_master) take("master", p.master);
    for (std::size_t k = 0; k < state_names_.size(); ++k) take(state_names_[k], p.state[k]);
  }
  for (std::size_t gi = 0; gi < groups_.size(); ++gi) {
    if (const Tensor* lr = state.find(fmt::format("param_groups.{}.lr", gi))) groups_[gi].lr = lr->item();
    if (const Tensor* wd = state.find(fmt::format("param_groups.{}.weight_decay", gi)))
      groups_[gi].weight_decay = wd->item();
  }
  NoGradGuard no_grad;
  for (auto& [dst, src] : copies) dst.copy_(*src);
  step_ = std::max<std::int64_t>(step, 0);
  // The parameters follow their masters (rounded as step() rounds them).
  for (Piece& p : pieces_) {
    if (p.model.defined()) p.model.copy_(p.master);
    p.seeded = true;  // fp8 parameters: the caller casts the loaded masters (fp8_master_pieces())
  }
  finish_step();
}

// ---- SGD
FlatSGD::FlatSGD(GradBuffers& buffers, SGDOptions options, Shard shard)
    : FlatSGD(buffers, one_group(buffers), options, std::move(shard)) {}

FlatSGD::FlatSGD(GradBuffers& buffers, std::vector<ParamGroup> groups, SGDOptions options, Shard shard)
    : FlatOptimizer("FlatSGD", buffers, std::move(groups), options.lr, options.weight_decay, std::move(shard),
                    options.momentum != 0 ? std::vector<std::string>{"momentum_buffer"} : std::vector<std::string>{}),
      options_(options) {
  KILN_CHECK(options.momentum >= 0, "FlatSGD: invalid momentum {}", options.momentum);
  KILN_CHECK(!options.nesterov || (options.momentum > 0 && options.dampening == 0),
             "FlatSGD: Nesterov momentum requires a momentum and zero dampening");
  KILN_CHECK(!options.capturable, "FlatSGD: capturable mode is not supported by the flat optimizers");
}

void FlatSGD::step() {
  NoGradGuard no_grad;
  begin_step();
  for (Batch& b : batches_) {
    ops::SgdParams hp;
    hp.lr = *groups_[b.group].lr;
    hp.momentum = options_.momentum;
    hp.dampening = options_.dampening;
    hp.weight_decay = *groups_[b.group].weight_decay;
    hp.nesterov = options_.nesterov;
    hp.first_step = step_ == 1;
    static const std::vector<Tensor> none;
    KILN_KERNEL(b.device, sgd_step)(b.masters, b.grads, b.state.empty() ? none : b.state[0], b.models, hp);
  }
  finish_step();
}

// ---- Adam / AdamW
FlatAdam::FlatAdam(GradBuffers& buffers, AdamOptions options, Shard shard)
    : FlatAdam("FlatAdam", buffers, one_group(buffers), options, std::move(shard), false) {}

FlatAdam::FlatAdam(GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options, Shard shard)
    : FlatAdam("FlatAdam", buffers, std::move(groups), options, std::move(shard), false) {}

FlatAdam::FlatAdam(std::string name, GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options,
                   Shard shard, bool decoupled)
    : FlatOptimizer(std::move(name), buffers, std::move(groups), options.lr, options.weight_decay, std::move(shard),
                    {"exp_avg", "exp_avg_sq"}),
      options_(options),
      decoupled_(decoupled) {
  KILN_CHECK(options.beta1 >= 0 && options.beta1 < 1 && options.beta2 >= 0 && options.beta2 < 1,
             "{}: invalid betas ({}, {})", name_, options.beta1, options.beta2);
  KILN_CHECK(options.eps >= 0, "{}: invalid eps {}", name_, options.eps);
  KILN_CHECK(!options.capturable, "{}: capturable mode is not supported by the flat optimizers", name_);
}

void FlatAdam::step() {
  NoGradGuard no_grad;
  begin_step();
  for (Batch& b : batches_) {
    ops::AdamParams hp;
    hp.lr = *groups_[b.group].lr;
    hp.beta1 = options_.beta1;
    hp.beta2 = options_.beta2;
    hp.eps = options_.eps;
    hp.weight_decay = *groups_[b.group].weight_decay;
    hp.decoupled_weight_decay = decoupled_;
    hp.step = step_;
    if (grad_scale_.defined()) {
      KILN_CHECK(grad_scale_.device() == b.device, "{}: the gradient scale is on {}, the gradients on {}", name_,
                 grad_scale_.device().str(), b.device.str());
      hp.grad_scale_ptr = static_cast<const float*>(grad_scale_.data_ptr());
    }
    KILN_KERNEL(b.device, adam_step)(b.masters, b.grads, b.state[0], b.state[1], b.models, hp);
  }
  // Released after the launches: the allocator hands its block out again in stream order only.
  grad_scale_ = Tensor();
  finish_step();
}

void FlatAdam::set_grad_scale(Tensor scale) {
  KILN_CHECK(scale.defined() && scale.numel() == 1 && scale.dtype() == DType::F32,
             "{}: the gradient scale must be a float32 scalar, got {}", name_,
             scale.defined() ? scale.describe() : "undefined");
  grad_scale_ = std::move(scale);
}

FlatAdamW::FlatAdamW(GradBuffers& buffers, AdamOptions options, Shard shard)
    : FlatAdam("FlatAdamW", buffers, one_group(buffers), options, std::move(shard), true) {}

FlatAdamW::FlatAdamW(GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options, Shard shard)
    : FlatAdam("FlatAdamW", buffers, std::move(groups), options, std::move(shard), true) {}

}  // namespace kiln::optim
