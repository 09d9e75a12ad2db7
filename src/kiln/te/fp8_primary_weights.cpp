#include "kiln/te/fp8_primary_weights.h"

#include "kiln/nn/module.h"
#include "kiln/ops/fp8.h"
#include "kiln/te/fp8_amax_reduction.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"
#include "kiln/tensor/views.h"

namespace kiln::te {

namespace {

// A contiguous fp8 or f32 tensor seen flat (views only: the casts write through them).
Tensor flat(const Tensor& t) { return views::view(t.detach(), {t.numel()}); }

}  // namespace

Fp8PrimaryWeights::Fp8PrimaryWeights(const std::vector<Linear>& linears, const Fp8Recipe& recipe) : recipe_(recipe) {
  KILN_CHECK(recipe.recipe != Fp8ScalingRecipe::Mxfp8, "--fp8-param-gather: the mxfp8 recipe is not supported");
  layout_ = recipe.recipe == Fp8ScalingRecipe::Blockwise ? ScalingLayout::Block128x128 : ScalingLayout::PerTensor;
  const bool delayed = recipe.recipe == Fp8ScalingRecipe::Delayed;
  if (linears.empty()) return;
  NoGradGuard no_grad;
  const Device device = linears.front().weight.device();
  std::int64_t entries = 0;
  for (const Linear& l : linears) {
    const Tensor& w = l.weight;
    KILN_CHECK(l.state != nullptr && w.defined() && w.dim() == 2 && w.is_contiguous() && w.device() == device &&
                   (w.dtype() == DType::F32 || w.dtype() == DType::BF16),
               "--fp8-param-gather: an FP8 linear's weight must be a contiguous float32 or bfloat16 [out, in] matrix "
               "on {} with the layer's FP8 state, got {}",
               device.str(), w.defined() ? w.describe() : "undefined");
    KILN_CHECK(!l.state->primary_weight, "--fp8-param-gather: weight {} is already kept in FP8", w.describe());
    // Tensor (x context) parallelism: every FP8 linear's amaxes reduce over the same group.
    KILN_CHECK(l.state->amax_group.has_value() == linears.front().state->amax_group.has_value(),
               "--fp8-param-gather: the FP8 linears' amax reduction groups differ");
    if (l.state->amax_group && !amax_group_) amax_group_ = l.state->amax_group;
    Weight W;
    W.param = w;
    W.primary = std::make_shared<Fp8PrimaryWeight>();
    W.primary->value_dtype = w.dtype();
    W.primary->delayed = delayed ? &l.state->weight : nullptr;
    W.primary->cast.layout = layout_;
    W.primary->cast.data = Tensor::empty(w.shape(), recipe.forward_dtype(), device);
    W.offset = entries;
    W.entries = numel_of(fp8_scale_shape(layout_, w.shape()[0], w.shape()[1]));
    entries += W.entries;
    weights_.push_back(std::move(W));
  }
  amax_ = Tensor::zeros({entries}, DType::F32, device);
  scales_ = ops::fp8_alloc(entries, 1, recipe.forward_dtype(), ScalingLayout::Block1x128, device);
  for (std::size_t i = 0; i < weights_.size(); ++i) {
    Weight& W = weights_[i];
    Fp8Tensor& c = W.primary->cast;
    const Shape grid = fp8_scale_shape(layout_, c.rows(), c.cols());
    if (delayed) {
      // The master's amax goes straight into the history's entry 0, where the update reads it.
      c.amax = linears[i].state->weight.amax_history.narrow(0, 0, 1);
      c.scale = linears[i].state->weight.scale;
      c.scale_inv = linears[i].state->weight.scale_inv;
    } else {
      c.amax = views::view(amax_.narrow(0, W.offset, W.entries), grid);
      c.scale = views::view(scales_.scale.narrow(1, W.offset, W.entries), grid);
      c.scale_inv = views::view(scales_.scale_inv.narrow(1, W.offset, W.entries), grid);
    }
  }
  // The first cast: each weight's value as its master (whole, in this process).
  std::vector<optim::FlatOptimizer::MasterPiece> pieces;
  for (const Weight& W : weights_) {
    initial_values_.push_back(W.param.detach());  // keeps the high-precision storage until taken
    pieces.push_back({W.param, {0, W.param.numel()}, flat(W.param.detach().to(DType::F32).contiguous())});
  }
  cast_masters(pieces, nullptr, /*record_delayed_amax=*/true);
  for (std::size_t i = 0; i < weights_.size(); ++i) {
    Weight& W = weights_[i];
    // The parameter handle now holds the bytes (same TensorImpl: the module's member, its
    // registration and every parameter list follow); the cast reads and writes through it, so it
    // follows the parameter into the gradient buffers' flat storage too.
    nn::assign_tensor_in_place(W.param, W.primary->cast.data);
    W.primary->cast.data = W.param;
    linears[i].state->primary_weight = W.primary;
  }
}

std::vector<Tensor> Fp8PrimaryWeights::take_initial_values() {
  KILN_CHECK(!initial_values_.empty() || weights_.empty(),
             "Fp8PrimaryWeights::take_initial_values: the initial values were taken already");
  return std::exchange(initial_values_, {});
}

std::size_t Fp8PrimaryWeights::index_of(const Tensor& param) const {
  for (std::size_t i = 0; i < weights_.size(); ++i)
    if (weights_[i].param.is_same(param)) return i;
  KILN_FAIL("Fp8PrimaryWeights: the master piece of {} belongs to no FP8 weight", param.describe());
}

void Fp8PrimaryWeights::cast_masters(const std::vector<optim::FlatOptimizer::MasterPiece>& pieces,
                                     const dist::Communicator* shard_group, bool record_delayed_amax) {
  if (weights_.empty()) return;
  NoGradGuard no_grad;
  const bool delayed = recipe_.recipe == Fp8ScalingRecipe::Delayed;
  std::vector<std::size_t> owner;
  owner.reserve(pieces.size());
  for (const auto& p : pieces) owner.push_back(index_of(p.parameter));
  auto piece_of = [&](std::size_t i, const optim::FlatOptimizer::MasterPiece& p) {
    const Fp8Tensor& c = weights_[i].primary->cast;
    return ops::Fp8MatrixPiece{c.rows(), c.cols(), p.elements.begin, layout_};
  };
  // (A delayed recast uses the state's scale as it is: nothing to measure.)
  if (!delayed || record_delayed_amax) {
    // 1-2: the pieces' amaxes, then the whole weights' (one all-reduce for every weight). Delayed:
    // into each history's entry 0 (zeroed by the last update), reduced as the layers' recorded
    // amaxes are (te/fp8_amax_reduction.h).
    std::vector<ops::Fp8DelayedScalingRef> refs;
    if (delayed)
      for (const Weight& W : weights_) {
        const Fp8ScalingState& s = *W.primary->delayed;
        refs.push_back(
            {s.amax_history, s.scale, s.scale_inv, ops::fp8_scaled_max(recipe_.forward_dtype(), recipe_.margin)});
      }
    else
      amax_.zero_();
    for (std::size_t k = 0; k < pieces.size(); ++k)
      ops::fp8_piece_amax_(pieces[k].master, piece_of(owner[k], pieces[k]), weights_[owner[k]].primary->cast.amax);
    const bool sharded = shard_group != nullptr && shard_group->size() > 1;
    if (sharded && delayed) reduce_recorded_amaxes(refs, *shard_group);
    if (sharded && !delayed) dist::all_reduce(*shard_group, amax_, dist::ReduceOp::Max).wait();
    // A weight split over the tensor-parallel group: its per-tensor scale is the whole weight's, as
    // the layers' casts reduce theirs (blockwise needs none: no 128x128 block straddles two ranks).
    if (amax_group_ && amax_group_->size() > 1 && delayed) reduce_recorded_amaxes(refs, *amax_group_);
    if (amax_group_ && amax_group_->size() > 1 && layout_ == ScalingLayout::PerTensor && !delayed)
      dist::all_reduce(*amax_group_, amax_, dist::ReduceOp::Max).wait();
    // 3: the scales.
    if (delayed) {
      ops::fp8_delayed_scaling_update_many(refs, recipe_.amax_compute_algo);
    } else {
      ops::Fp8CastOptions o;
      o.power_of_two_scales = layout_ == ScalingLayout::Block128x128;
      ops::fp8_quantize_into(views::view(amax_, {amax_.numel(), 1}), scales_, o);
    }
  }
  // 4: each piece into its part of the bytes.
  for (std::size_t k = 0; k < pieces.size(); ++k) {
    const Fp8Tensor& c = weights_[owner[k]].primary->cast;
    const optim::ElementRange e = pieces[k].elements;
    ops::fp8_piece_quantize_into(pieces[k].master, piece_of(owner[k], pieces[k]), c.scale,
                                 flat(c.data).narrow(0, e.begin, e.numel()));
  }
  for (const Weight& W : weights_) W.param.storage()->bump_version();
}

}  // namespace kiln::te
