#include "kiln/nn/module.h"

#include <algorithm>
#include <sstream>

#include "kiln/io/safetensors.h"
#include "kiln/ops/copy.h"
#include "kiln/runtime/located_error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::nn {

void assign_tensor_in_place(const Tensor& dst, const Tensor& src) {
  KILN_CHECK(dst.defined() && src.defined(), "assign_tensor_in_place: both tensors must be defined");
  if (dst.is_same(src)) return;
  TensorImpl* d = dst.impl();
  const TensorImpl* s = src.impl();
  d->storage = s->storage;
  d->offset = s->offset;
  d->shape = s->shape;
  d->strides = s->strides;
  d->dtype = s->dtype;
  d->grad.reset();
  d->grad_accumulator.reset();
}

void Module::check_new_name(const std::string& name) const {
  KILN_CHECK(!name.empty() && name.find('.') == std::string::npos,
             "{}: invalid name '{}' (must be non-empty and contain no '.')", type_name_, name);
  KILN_CHECK(!params_.contains(name) && !buffers_.contains(name) && !children_.contains(name),
             "{}: the name '{}' is already registered", type_name_, name);
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name);
  if (t.defined()) {
    KILN_CHECK(t.is_leaf(), "{}: parameter '{}' must be a leaf tensor (detach() it first), got {}", type_name_, name,
               t.describe());
    if (requires_grad != t.requires_grad()) t.requires_grad_(requires_grad);
  }
  params_.insert(name, Entry{t, true});
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t, bool persistent, bool keep_dtype) {
  check_new_name(name);
  buffers_.insert(name, Entry{t, persistent, keep_dtype});
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> module) {
  check_new_name(name);
  KILN_CHECK(module != nullptr, "{}: child module '{}' is null", type_name_, name);
  KILN_CHECK(module.get() != this, "{}: a module cannot be its own child ('{}')", type_name_, name);
  children_.insert(name, std::move(module));
}

void Module::set_tensor(const std::string& name, const Tensor& value) {
  Entry* e = params_.find(name);
  if (!e) e = buffers_.find(name);
  KILN_CHECK(e != nullptr, "{}: no parameter or buffer named '{}'", type_name_, name);
  KILN_CHECK(e->tensor.defined(), "{}: '{}' is registered as absent (undefined) and cannot be set in place", type_name_,
             name);
  NoGradGuard no_grad;
  assign_tensor_in_place(e->tensor, value.detach());
}

void Module::collect_tensors(bool params, bool recursive, bool persistent_only, bool dedupe, const std::string& prefix,
                             TensorDict& out, std::vector<const TensorImpl*>& seen) const {
  for (const auto& [name, entry] : params ? params_ : buffers_) {
    if (!entry.tensor.defined() || (persistent_only && !entry.persistent)) continue;
    if (dedupe) {
      if (std::find(seen.begin(), seen.end(), entry.tensor.impl()) != seen.end()) continue;
      seen.push_back(entry.tensor.impl());
    }
    out.insert(prefix + name, entry.tensor);
  }
  if (!recursive) return;
  for (const auto& [name, child] : children_)
    child->collect_tensors(params, true, persistent_only, dedupe, prefix + name + ".", out, seen);
}

TensorDict Module::named_parameters(bool recursive) const {
  TensorDict out;
  std::vector<const TensorImpl*> seen;
  collect_tensors(true, recursive, false, true, "", out, seen);
  return out;
}

std::vector<Tensor> Module::parameters(bool recursive) const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named_parameters(recursive)) out.push_back(t);
  return out;
}

TensorDict Module::named_buffers(bool recursive) const {
  TensorDict out;
  std::vector<const TensorImpl*> seen;
  collect_tensors(false, recursive, false, true, "", out, seen);
  return out;
}

std::vector<Tensor> Module::buffers(bool recursive) const {
  std::vector<Tensor> out;
  for (const auto& [name, t] : named_buffers(recursive)) out.push_back(t);
  return out;
}

std::vector<std::shared_ptr<Module>> Module::children() const {
  std::vector<std::shared_ptr<Module>> out;
  for (const auto& [name, c] : children_) out.push_back(c);
  return out;
}

void Module::collect_modules(const std::string& prefix, OrderedDict<std::shared_ptr<Module>>& out) const {
  for (const auto& [name, child] : children_) {
    std::string full = prefix.empty() ? name : prefix + "." + name;
    bool seen = false;
    for (const auto& item : out) seen = seen || item.second == child;
    if (seen) continue;
    out.insert(full, child);
    child->collect_modules(full, out);
  }
}

OrderedDict<std::shared_ptr<Module>> Module::named_modules() const {
  OrderedDict<std::shared_ptr<Module>> out;
  // The root is held by shared_ptr in normal use; a stack-allocated root is listed without one.
  std::shared_ptr<const Module> self = weak_from_this().lock();
  out.insert("", std::const_pointer_cast<Module>(self));
  collect_modules("", out);
  return out;
}

std::int64_t Module::num_parameters(bool trainable_only) const {
  std::int64_t n = 0;
  for (const auto& [name, t] : named_parameters())
    if (!trainable_only || t.requires_grad()) n += t.numel();
  return n;
}

Module& Module::train(bool on) {
  training_ = on;
  for (const auto& [name, child] : children_) child->train(on);
  return *this;
}

void Module::convert_tensors(const std::function<Tensor(const Tensor&, bool)>& convert) {
  NoGradGuard no_grad;
  std::vector<const TensorImpl*> done;  // shared tensors are converted once
  auto visit = [&](Module& m, auto& self) -> void {
    for (auto* dict : {&m.params_, &m.buffers_}) {
      for (auto& [name, entry] : *dict) {
        const Tensor& t = entry.tensor;
        if (!t.defined() || std::find(done.begin(), done.end(), t.impl()) != done.end()) continue;
        done.push_back(t.impl());
        Tensor grad = t.grad();
        Tensor moved = convert(t.detach(), entry.keep_dtype);
        if (moved.storage() == t.storage() && moved.dtype() == t.dtype()) continue;
        assign_tensor_in_place(t, moved);
        if (grad.defined()) t.impl()->grad = convert(grad, entry.keep_dtype).impl_ptr();
      }
    }
    for (auto& [name, child] : m.children_) self(*child, self);
  };
  visit(*this, visit);
}

Module& Module::to(Device device) {
  convert_tensors([&](const Tensor& t, bool) { return ops::to(t, device, t.dtype()); });
  return *this;
}

Module& Module::to(DType dtype) {
  KILN_CHECK(is_floating(dtype), "{}.to({}): modules can only be converted to floating dtypes", type_name_,
             dtype_name(dtype));
  convert_tensors(
      [&](const Tensor& t, bool keep) { return is_floating(t.dtype()) && !keep ? ops::to(t, t.device(), dtype) : t; });
  return *this;
}

Module& Module::to(Device device, DType dtype) {
  KILN_CHECK(is_floating(dtype), "{}.to({}): modules can only be converted to floating dtypes", type_name_,
             dtype_name(dtype));
  convert_tensors([&](const Tensor& t, bool keep) {
    return ops::to(t, device, is_floating(t.dtype()) && !keep ? dtype : t.dtype());
  });
  return *this;
}

Module& Module::requires_grad_(bool on) {
  for (const Tensor& p : parameters()) p.impl()->requires_grad = on;
  return *this;
}

void Module::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none)
      p.impl()->grad.reset();
    else
      p.grad().zero_();
  }
}

TensorDict Module::state_dict() const {
  TensorDict out;
  std::vector<const TensorImpl*> seen;
  // Parameters then buffers per module, recursively, as PyTorch orders them.
  auto visit = [&](const Module& m, const std::string& prefix, auto& self) -> void {
    for (const auto& [name, e] : m.params_)
      if (e.tensor.defined()) out.insert(prefix + name, m.state_value(name, e.tensor));
    for (const auto& [name, e] : m.buffers_)
      if (e.tensor.defined() && e.persistent) out.insert(prefix + name, m.state_value(name, e.tensor));
    for (const auto& [name, child] : m.children_) self(*child, prefix + name + ".", self);
  };
  visit(*this, "", visit);
  return out;
}

Tensor Module::state_value(const std::string& /*name*/, const Tensor& stored) const { return stored.detach(); }

void Module::load_state_value(const std::string& /*name*/, const Tensor& stored, const Tensor& value) {
  ops::copy_into(stored.detach(), value);
}

namespace {
std::string join_keys(const std::vector<std::string>& keys) {
  std::string s;
  for (const auto& k : keys) s += (s.empty() ? "\"" : ", \"") + k + "\"";
  return s;
}
}  // namespace

LoadResult Module::load_state_dict(const TensorDict& state, bool strict) {
  // Targets share storage with the module, so copying into them updates the module in place.
  TensorDict targets = state_dict();
  LoadResult result;
  std::vector<std::string> mismatches;
  for (const auto& [name, target] : targets) {
    const Tensor* src = state.find(name);
    if (!src) {
      result.missing_keys.push_back(name);
      continue;
    }
    if (src->shape() != target.shape())
      mismatches.push_back(
          fmt::format("size mismatch for {}: copying a param with shape {} from checkpoint, the "
                      "shape in current model is {}",
                      name, shape_str(src->shape()), shape_str(target.shape())));
  }
  for (const auto& [name, t] : state)
    if (!targets.contains(name)) result.unexpected_keys.push_back(name);

  std::string errors;
  if (strict && !result.missing_keys.empty())
    errors += fmt::format("\n\tMissing key(s) in state_dict: {}.", join_keys(result.missing_keys));
  if (strict && !result.unexpected_keys.empty())
    errors += fmt::format("\n\tUnexpected key(s) in state_dict: {}.", join_keys(result.unexpected_keys));
  for (const auto& m : mismatches) errors += "\n\t" + m + ".";
  KILN_CHECK(errors.empty(), "Error(s) in loading state_dict for {}:{}", type_name_, errors);

  NoGradGuard no_grad;
  // Into the stored tensors, through their modules (load_state_value), in state_dict()'s order.
  auto visit = [&](Module& m, const std::string& prefix, auto& self) -> void {
    for (OrderedDict<Entry>* entries : {&m.params_, &m.buffers_})
      for (const auto& [name, e] : *entries) {
        if (!e.tensor.defined() || (entries == &m.buffers_ && !e.persistent)) continue;
        if (const Tensor* src = state.find(prefix + name)) m.load_state_value(name, e.tensor, *src);
        e.tensor.storage()->bump_version();
      }
    for (const auto& [name, child] : m.children_) self(*child, prefix + name + ".", self);
  };
  visit(*this, "", visit);
  return result;
}

void Module::save(const std::string& path) const { io::save_safetensors(path, state_dict(), {{"format", "pt"}}); }

LoadResult Module::load(const std::string& path, bool strict) {
  io::SafetensorsFile file = io::load_safetensors(path);
  try {
    return load_state_dict(file.tensors, strict);
  } catch (const Error& e) {
    KILN_FAIL("loading {}: {}", path, error_message(e));  // one location: this one
  }
}

namespace {
std::string indent_following_lines(const std::string& s, int spaces) {
  std::string out;
  for (char c : s) {
    out += c;
    if (c == '\n') out += std::string(static_cast<std::size_t>(spaces), ' ');
  }
  return out;
}
}  // namespace

std::string Module::repr() const {
  std::string extra = extra_repr();
  if (children_.empty()) return type_name_ + "(" + extra + ")";
  std::ostringstream os;
  os << type_name_ << "(";
  if (!extra.empty()) os << "\n  " << indent_following_lines(extra, 2);
  for (const auto& [name, child] : children_)
    os << "\n  (" << name << "): " << indent_following_lines(child->repr(), 2);
  os << "\n)";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Module& m) { return os << m.repr(); }

}  // namespace kiln::nn
