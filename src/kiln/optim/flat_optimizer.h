#pragma once
// Optimizers over flat gradient buffers (grad_buffers.h), with fp32 master weights: Megatron-
// core's mixed-precision optimizer and, given a shard of the buffers, the local step of its
// distributed optimizer.
//
//   optim::GradBuffers grads(model.parameters(), {.grad_dtype = DType::F32});   // bf16 params
//   optim::FlatAdamW opt(grads, {.lr = 3e-4, .weight_decay = 0.1});
//   opt.zero_grad(); loss.backward(); opt.step();
//
// For a parameter of a 16-bit dtype the optimizer keeps an fp32 master copy of the elements it
// updates; step() updates the master with the gradient (f32, or bf16 read as f32) and writes the
// master rounded to the parameter's dtype back into the parameter, in the same fused
// multi-tensor kernel as SGD/Adam/AdamW (the adam_step / sgd_step kernels). An f32 parameter is its
// own master. The math is torch.optim's on the fp32 masters.
//
// Shard: per buffer, the element ranges this optimizer updates ([begin, end) of the flat
// buffers; empty: everything). A distributed optimizer passes GradBuffers::shard(rank, dp):
// each rank updates its part of every bucket (after a reduce-scatter of the gradients), and
// all-gathers the parameter buffers afterwards. Masters and moments exist only for the shard.
// Ranges are merged when adjacent; a parameter must fall into one contiguous range piece.
//
// fp8 parameters (--fp8-param-gather's FP8 weights) have fp32 masters too, but their bytes mean
// nothing without the layer's scales: set_master() seeds each one's master from its high-precision
// value before the first step (step() refuses an unseeded one), step() updates the master only, and
// the caller casts fp8_master_pieces() into the weights (te/fp8_primary_weights.h).
//
// All parameters step together (one step count); a parameter that got no gradient has a zero
// one in the buffer and is updated with it (Megatron's behaviour; torch.optim would skip it).
// zero_grad() zeroes the buffers (set_to_none cannot apply: .grad stays a view of them).
// Capturable mode is not supported here.
//
// state_dict(): torch.optim's numbering (parameters across groups in order), per parameter that
// the shard touches: "state.<i>.step", the moments ("exp_avg", "exp_avg_sq" / "momentum_buffer")
// and, for 16-bit parameters, "state.<i>.master" (f32); whole parameters keep their shape, a
// parameter the shard cuts is flat with "state.<i>.shard" = [begin, end) (int64: its elements
// held). Plus "param_groups.<g>.lr/weight_decay/num_params". load_state_dict() checks that the
// layout matches, installs the state and rewrites the parameters from the masters.
#include <string>
#include <vector>

#include "kiln/optim/grad_buffers.h"
#include "kiln/optim/optimizer.h"

namespace kiln::optim {

class FlatOptimizer : public Optimizer {
 public:
  using Shard = std::vector<std::vector<ElementRange>>;  // per buffer; empty: all of every buffer

  void zero_grad(bool set_to_none = true) override;
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

  std::int64_t steps() const { return step_; }

  // A piece's fp32 master (1-D view) and the elements of its parameter it holds.
  struct MasterPiece {
    Tensor parameter;
    ElementRange elements;
    Tensor master;
  };
  // The pieces of the fp8 parameters (their masters are all there is of their values).
  std::vector<MasterPiece> fp8_master_pieces() const;
  // Seeds `param`'s master (the part this optimizer holds) from `value`, its whole high-precision
  // value (any floating dtype, the parameter's shape). For fp8 parameters; does nothing for a
  // parameter outside this optimizer's shard.
  void set_master(const Tensor& param, const Tensor& value);
  const Shard& shard() const { return shard_; }
  GradBuffers& buffers() { return buffers_; }

 protected:
  FlatOptimizer(std::string name, GradBuffers& buffers, std::vector<ParamGroup> groups, double default_lr,
                double default_weight_decay, Shard shard, std::vector<std::string> state_names);

  // One call of the multi-tensor kernel: the pieces of one parameter group in one buffer.
  struct Batch {
    std::size_t group = 0;
    Device device;
    std::vector<Tensor> masters, grads, models;  // models empty for f32 parameters
    std::vector<std::vector<Tensor>> state;      // per state name
  };
  std::vector<Batch> batches_;
  std::int64_t step_ = 0;

  // Checks the views and counts the step; the caller then runs the kernels and finish_step().
  void begin_step();
  void finish_step();

 private:
  // The part of one parameter this optimizer updates, as 1-D views.
  struct Piece {
    std::size_t param = 0;  // state-dict number
    Tensor parameter;
    ElementRange elements;  // of the parameter
    Tensor master, grad, model;
    std::vector<Tensor> state;
    bool has_master = false;  // a master of its own (16-bit and fp8 parameters)
    bool fp8 = false;         // an fp8 parameter: no model view, seeded by set_master()
    bool seeded = true;       // its master holds a value (false: an fp8 one before set_master())
  };
  std::vector<Piece> pieces_;
  GradBuffers& buffers_;
  Shard shard_;
  std::vector<std::string> state_names_;
  std::vector<Tensor> master_storage_, state_storage_;  // own the flat tensors the pieces view
};

// torch.optim.SGD on fp32 masters (see optimizer.h's SGD for the update).
class FlatSGD : public FlatOptimizer {
 public:
  explicit FlatSGD(GradBuffers& buffers, SGDOptions options = {}, Shard shard = {});
  FlatSGD(GradBuffers& buffers, std::vector<ParamGroup> groups, SGDOptions options, Shard shard = {});
  void step() override;

 private:
  SGDOptions options_;
};

// torch.optim.Adam on fp32 masters; FlatAdamW: torch.optim.AdamW (decoupled weight decay).
class FlatAdam : public FlatOptimizer {
 public:
  explicit FlatAdam(GradBuffers& buffers, AdamOptions options = {}, Shard shard = {});
  FlatAdam(GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options, Shard shard = {});
  void step() override;
  // The next step() multiplies every gradient by `scale`, a float32 scalar on the buffers' device
  // (clip_grad.h's clip_coefficient), in float32 as it reads it, and then forgets it: gradient
  // clipping without a pass of its own over the gradients. For f32 gradient buffers the step equals
  // scaling the buffers first (clip_to_norm_) and stepping, bit for bit.
  void set_grad_scale(Tensor scale);

 protected:
  FlatAdam(std::string name, GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options, Shard shard,
           bool decoupled);

 private:
  AdamOptions options_;
  bool decoupled_;
  Tensor grad_scale_;  // set_grad_scale's, for the next step only
};

class FlatAdamW : public FlatAdam {
 public:
  explicit FlatAdamW(GradBuffers& buffers, AdamOptions options = AdamW::defaults(), Shard shard = {});
  FlatAdamW(GradBuffers& buffers, std::vector<ParamGroup> groups, AdamOptions options, Shard shard = {});
};

}  // namespace kiln::optim
