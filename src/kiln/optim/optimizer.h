#pragma once
// Optimizers over parameter groups, with torch.optim's semantics. step() updates every
// parameter that has a gradient with one call of the backend's multi-tensor kernel per group
// (the sgd_step / adam_step kernels; more only when a group mixes devices, dtypes or per-parameter
// step counts). Parameters and gradients must be float32 (float64 works on the CPU). For bf16
// parameters with fp32 master weights and flat gradient buffers, see flat_optimizer.h.
//
//   optim::AdamW opt(model->parameters(), {.lr = 3e-4, .weight_decay = 0.1});
//   opt.zero_grad();
//   loss.backward();
//   opt.step();
//
// Capturable mode (options.capturable, PyTorch's capturable=True), for CUDA graphs: each parameter
// group's learning rate and step count live in float64 scalars on the parameters' device. step()
// increments the step there and the kernels read both when they run, so one captured step()
// replays correctly. set_lr() writes the new rate with a tiny kernel in stream order: call it
// outside the capture, before each replay (LR schedules keep working). The math is the host
// path's, so both modes give the same parameters. A group's parameters share the group's step
// count (it advances when any of them has a gradient): the per-parameter count whenever the set
// of gradients is fixed, as it is under graph capture. The first step() must run eagerly (it
// creates the device scalars and the optimizer state).
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kiln/tensor/ordered_dict.h"
#include "kiln/tensor/tensor.h"

namespace kiln::optim {

struct ParamGroup {
  std::vector<Tensor> params;
  std::optional<double> lr;            // unset: the optimizer's default (filled in at construction)
  std::optional<double> weight_decay;  // unset: the optimizer's default
  double lr_mult = 1.0;                // LR schedules set lr = schedule(step) * lr_mult (as Megatron)
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  virtual void step() = 0;
  // set_to_none (the default, as PyTorch 2) drops the gradients; otherwise zeroes them.
  virtual void zero_grad(bool set_to_none = true);

  std::vector<ParamGroup>& param_groups() { return groups_; }
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  void add_param_group(ParamGroup group);
  // Sets every group's lr to lr * lr_mult (capturable: also writes it to the device).
  void set_lr(double lr);
  bool capturable() const { return capturable_; }
  // Capturable mode: writes every group's host lr to its device scalar where it changed (set_lr
  // calls it; call it yourself after assigning param_groups()[g].lr directly). Not during capture.
  void sync_lr_to_device();
  double lr() const { return groups_.at(0).lr.value(); }  // the first group's

  // Resumable state, as tensors (so it can be saved with io::save_safetensors). Parameters are
  // numbered across groups in order, as torch.optim does: "state.<i>.step" (int64 scalar),
  // "state.<i>.exp_avg", "state.<i>.exp_avg_sq", "state.<i>.momentum_buffer" (those that exist),
  // "param_groups.<g>.lr", "param_groups.<g>.weight_decay" (float64 scalars) and
  // "param_groups.<g>.num_params" (int64). load_state_dict() checks the group layout and shapes
  // and copies the state to the parameters' devices.
  virtual TensorDict state_dict() const;
  virtual void load_state_dict(const TensorDict& state);

  const std::string& name() const { return name_; }

 protected:
  Optimizer(std::string name, std::vector<ParamGroup> groups, double default_lr, double default_weight_decay,
            bool capturable = false);

  struct ParamState {
    std::int64_t step = 0;
    Tensor exp_avg, exp_avg_sq, momentum_buffer;
  };
  ParamState& state_for(const Tensor& param) { return state_[param.impl()]; }
  // Checks a parameter and its gradient before an update; returns the gradient (contiguous).
  Tensor checked_grad(const Tensor& param) const;

  // Capturable mode: a group's lr and step (float64 scalars on its parameters' device).
  struct DeviceScalars {
    Tensor lr, step;
    double written_lr = 0;  // the host value last written to `lr`
  };
  // Group gi's device scalars, created on first use (from the host state: not during capture) with
  // the lr brought up to date. Then advances the step on the device; returns the scalars.
  DeviceScalars& advance_device_step(std::size_t gi);
  // The step count of group gi's parameters in the host state (the largest), for new scalars.
  std::int64_t host_step(std::size_t gi) const;

  std::string name_;
  std::vector<ParamGroup> groups_;
  double default_lr_, default_weight_decay_;
  std::unordered_map<const TensorImpl*, ParamState> state_;
  bool capturable_ = false;
  std::vector<DeviceScalars> device_scalars_;  // per group, capturable mode
};

struct SGDOptions {
  double lr = 0.01;
  double momentum = 0;
  double dampening = 0;
  double weight_decay = 0;
  bool nesterov = false;
  bool capturable = false;  // lr read from device memory (see "Capturable mode" above)
};

// torch.optim.SGD: g += wd * p; buf = momentum * buf + (1 - dampening) * g (buf = g on the
// first step); g = nesterov ? g + momentum * buf : buf; p -= lr * g.
class SGD : public Optimizer {
 public:
  explicit SGD(std::vector<Tensor> params, SGDOptions options = {});
  SGD(std::vector<ParamGroup> groups, SGDOptions options);
  void step() override;
  const SGDOptions& options() const { return options_; }

 private:
  SGDOptions options_;
};

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0;
  bool capturable = false;  // lr and step read from device memory (see "Capturable mode" above)
};

// torch.optim.Adam (L2 weight decay added to the gradient), with PyTorch's bias correction.
class Adam : public Optimizer {
 public:
  explicit Adam(std::vector<Tensor> params, AdamOptions options = {});
  Adam(std::vector<ParamGroup> groups, AdamOptions options);
  void step() override;
  const AdamOptions& options() const { return options_; }

 protected:
  Adam(std::string name, std::vector<ParamGroup> groups, AdamOptions options, bool decoupled);

 private:
  AdamOptions options_;
  bool decoupled_;
};

// torch.optim.AdamW: decoupled weight decay p *= 1 - lr * wd before the Adam update.
// Its default weight_decay is 0.01, as PyTorch's.
class AdamW : public Adam {
 public:
  static AdamOptions defaults() {
    AdamOptions o;
    o.weight_decay = 1e-2;
    return o;
  }
  explicit AdamW(std::vector<Tensor> params, AdamOptions options = defaults());
  AdamW(std::vector<ParamGroup> groups, AdamOptions options);
};

}  // namespace kiln::optim
