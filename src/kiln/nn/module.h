#pragma once
// nn::Module: the base of every layer, with PyTorch's semantics. A module owns named parameters,
// buffers and child modules (in registration order); names nest with dots ("block.0.weight").
// Modules are held by shared_ptr. Each concrete module has its own forward(); modules whose
// forward is Tensor -> Tensor derive from UnaryModule so Sequential can chain them.
//
//   class Mlp : public nn::UnaryModule {
//    public:
//     Mlp() : UnaryModule("Mlp") {
//       fc1 = register_module("fc1", std::make_shared<nn::Linear>(784, 256));
//       fc2 = register_module("fc2", std::make_shared<nn::Linear>(256, 10));
//     }
//     Tensor forward(const Tensor& x) override { return fc2->forward(relu(fc1->forward(x))); }
//     std::shared_ptr<nn::Linear> fc1, fc2;
//   };
//
// Parameter and buffer tensors are shared handles: a module keeps the Tensor returned by
// register_parameter() as a member, and to(device)/to(dtype)/load_state_dict() update the
// registered tensors in place (the TensorImpl is re-pointed to the new storage), so every
// handle — the module's members, an optimizer's parameter list — sees the change.
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "kiln/tensor/ordered_dict.h"
#include "kiln/tensor/tensor.h"

namespace kiln::nn {

// What load_state_dict() found (with strict=false; strict=true throws instead).
struct LoadResult {
  std::vector<std::string> missing_keys;
  std::vector<std::string> unexpected_keys;
};

class Module : public std::enable_shared_from_this<Module> {
 public:
  explicit Module(std::string type_name) : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;
  Module(const Module&) = delete;
  Module& operator=(const Module&) = delete;

  const std::string& type_name() const { return type_name_; }

  // ---- registration. An undefined tensor registers an absent parameter (like bias=None): it is
  // listed nowhere but reserves the name. Parameters are made leaves that require grad (unless
  // requires_grad=false). Non-persistent buffers are left out of state_dict(). A keep_dtype buffer
  // keeps its dtype through to(dtype) (state whose precision is part of its meaning, e.g. FP8
  // scaling factors and amax histories, which must stay float32 in a bf16 model).
  Tensor register_parameter(const std::string& name, Tensor t, bool requires_grad = true);
  Tensor register_buffer(const std::string& name, Tensor t, bool persistent = true, bool keep_dtype = false);
  template <class M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }
  // Replaces the tensor registered under `name` (own parameter or buffer) by re-pointing the
  // existing handle to `value`'s storage: shapes may change. For weight tying use the same
  // Tensor in two register_parameter() calls instead.
  void set_tensor(const std::string& name, const Tensor& value);

  // ---- traversal. Names are dotted paths; recursive lists are depth first, own entries first.
  // Parameters shared by several modules are listed once (first occurrence), as in PyTorch.
  TensorDict named_parameters(bool recursive = true) const;
  std::vector<Tensor> parameters(bool recursive = true) const;
  TensorDict named_buffers(bool recursive = true) const;
  std::vector<Tensor> buffers(bool recursive = true) const;
  const OrderedDict<std::shared_ptr<Module>>& named_children() const { return children_; }
  std::vector<std::shared_ptr<Module>> children() const;
  // Every module below (and including) this one, with dotted names ("" for this one).
  OrderedDict<std::shared_ptr<Module>> named_modules() const;
  std::int64_t num_parameters(bool trainable_only = false) const;

  // ---- mode, placement, gradients (all recursive)
  Module& train(bool on = true);
  Module& eval() { return train(false); }
  bool is_training() const { return training_; }
  // Moves parameters and buffers (and their grads) to `device`.
  Module& to(Device device);
  // Converts floating parameters and buffers to `dtype`; integer buffers are kept.
  Module& to(DType dtype);
  Module& to(Device device, DType dtype);
  Module& requires_grad_(bool on = true);
  void zero_grad(bool set_to_none = true);

  // ---- state. state_dict() holds parameters and persistent buffers (sharing storage with the
  // module, detached). load_state_dict() copies values in (converting dtype and device); shape
  // mismatches always raise; missing/unexpected keys raise when strict, naming every key.
  TensorDict state_dict() const;
  LoadResult load_state_dict(const TensorDict& state, bool strict = true);
  // Safetensors checkpoint of state_dict() (io/safetensors.h), written atomically.
  void save(const std::string& path) const;
  LoadResult load(const std::string& path, bool strict = true);

  // ---- printing, PyTorch-style: "Linear(in_features=4, out_features=2, bias=True)", children
  // indented below "(name): ".
  virtual std::string extra_repr() const { return ""; }
  std::string repr() const;

 protected:
  void add_child(const std::string& name, std::shared_ptr<Module> module);
  // A registered tensor whose stored form is not its value (an FP8 linear's weight under
  // --fp8-param-gather: fp8 bytes whose scales live in the layer) shows state_dict() its value and
  // takes load_state_dict()'s value through these, so checkpoints, rewind snapshots and exports see
  // the same tensors as without it. By default the stored tensor is the value.
  virtual Tensor state_value(const std::string& name, const Tensor& stored) const;
  virtual void load_state_value(const std::string& name, const Tensor& stored, const Tensor& value);

 private:
  struct Entry {
    Tensor tensor;
    bool persistent = true;
    bool keep_dtype = false;
  };
  void check_new_name(const std::string& name) const;
  void collect_tensors(bool params, bool recursive, bool persistent_only, bool dedupe, const std::string& prefix,
                       TensorDict& out, std::vector<const TensorImpl*>& seen) const;
  void collect_modules(const std::string& prefix, OrderedDict<std::shared_ptr<Module>>& out) const;
  // Applies `convert` to every parameter and buffer (and grad) below, in place.
  // convert(tensor, keep_dtype): the converted tensor (keep_dtype: the entry's dtype must not change).
  void convert_tensors(const std::function<Tensor(const Tensor&, bool)>& convert);

  std::string type_name_;
  bool training_ = true;
  OrderedDict<Entry> params_;
  OrderedDict<Entry> buffers_;
  OrderedDict<std::shared_ptr<Module>> children_;
};

std::ostream& operator<<(std::ostream& os, const Module& m);

// A module whose forward maps one tensor to one tensor: what Sequential chains.
class UnaryModule : public Module {
 public:
  using Module::Module;
  virtual Tensor forward(const Tensor& x) = 0;
  Tensor operator()(const Tensor& x) { return forward(x); }
};

// Re-points `dst`'s TensorImpl at `src`'s storage, offset, shape, strides and dtype, keeping
// dst's autograd identity (requires_grad); dst's grad is dropped. Used by to() and set_tensor();
// exposed for code that must replace tensors that other holders share.
void assign_tensor_in_place(const Tensor& dst, const Tensor& src);

}  // namespace kiln::nn
