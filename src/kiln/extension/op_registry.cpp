#include "kiln/extension/op_registry.h"

#include <algorithm>
#include <atomic>
#include <map>
#include <mutex>
#include <shared_mutex>

#include "kiln/autograd/node.h"
#include "kiln/autograd/record.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln {

namespace detail {

struct OpEntry {
  std::string name;
  std::string node_name;                   // "<name>Backward": the autograd node's name
  std::shared_ptr<const OpSchema> schema;  // null until declared (kernels may come first)
  ops::KernelOp<OpKernelSignature> op;     // in the registry's kernel table
};

}  // namespace detail

using detail::OpEntry;

namespace {
std::uint64_t next_id() {
  static std::atomic<std::uint64_t> counter{0};
  return ++counter;
}
}  // namespace

struct OpRegistry::Impl {
  std::uint64_t id = next_id();
  mutable std::shared_mutex mutex;
  std::map<std::string, std::unique_ptr<OpEntry>, std::less<>> ops;
  std::unique_ptr<ops::KernelRegistry> owned_kernels;  // set unless over a shared table
  ops::KernelRegistry* kernels = nullptr;

  OpEntry& entry(std::string_view name) {  // caller holds the lock exclusively
    auto it = ops.find(name);
    if (it != ops.end()) return *it->second;
    auto e = std::make_unique<OpEntry>();
    e->name = std::string(name);
    e->node_name = e->name + "Backward";
    const std::optional<ops::OpId> taken = kernels->find_id(name);
    try {
      e->op = kernels->declare<OpKernelSignature>(name);
    } catch (const Error&) {
      if (!taken) throw;  // not a name clash (the table is full)
      KILN_FAIL("custom op '{}': the name is taken by an op of another kind in the kernel table ({})", name,
                kernels->describe(*taken));
    }
    return *ops.emplace(e->name, std::move(e)).first->second;
  }
  const OpEntry* find(std::string_view name) const {  // caller holds the lock
    auto it = ops.find(name);
    return it == ops.end() ? nullptr : it->second.get();
  }
  std::string kernel_list(const OpEntry& e) const { return kernels->kernel_list(e.op.id); }
  bool has_slot(const OpEntry& e, DeviceKind device, DType dtype) const {
    return kernels->kernel_at(e.op.id, device, dtype) != nullptr;
  }
};

namespace {

void check_name(std::string_view name) {
  KILN_CHECK(!name.empty(), "custom op: the op name is empty");
  KILN_CHECK(std::none_of(name.begin(), name.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; }),
             "custom op '{}': op names cannot contain whitespace", name);
}

std::vector<Tensor> run(const OpRegistry::Impl& impl, const OpEntry& e, const std::vector<Tensor>& inputs,
                        const Attrs& attrs) {
  std::shared_mutex& mutex = impl.mutex;
  std::shared_ptr<const OpSchema> schema;
  {
    std::shared_lock lock(mutex);
    schema = e.schema;
  }
  KILN_CHECK(schema, "custom op '{}' has kernels but was never declared: call OpRegistry::def() for it", e.name);
  const std::string& name = e.name;
  KILN_CHECK(schema->num_inputs < 0 || static_cast<int>(inputs.size()) == schema->num_inputs,
             "custom op '{}': expected {} inputs, got {}", name, schema->num_inputs, inputs.size());

  // The first defined input picks the device and the dtype.
  std::size_t first = inputs.size();
  for (std::size_t i = 0; i < inputs.size(); ++i)
    if (inputs[i].defined()) {
      first = i;
      break;
    }
  KILN_CHECK(first < inputs.size(), "custom op '{}': needs a defined tensor input to pick a device and dtype", name);
  const Device device = inputs[first].device();
  const DType dtype = inputs[first].dtype();
  for (std::size_t i = first + 1; i < inputs.size(); ++i)
    KILN_CHECK(!inputs[i].defined() || inputs[i].device() == device,
               "custom op '{}': input {} is {} but input {} is on {}; all inputs must be on one device", name, i,
               inputs[i].describe(), first, device.str());

  const ops::Kernel* kernel = impl.kernels->find_kernel(e.op.id, device.kind, dtype);
  if (!kernel)
    KILN_FAIL("custom op '{}': no kernel for device {} and dtype {} (input {}); registered kernels: {}", name,
              device.str(), dtype_name(dtype), inputs[first].describe(), impl.kernel_list(e));

  std::vector<Tensor> outputs;
  {
    NoGradGuard no_grad;  // kernels compute; the backward is recorded below
    outputs = kernel->callable ? (*static_cast<const OpKernel*>(kernel->callable))(inputs, attrs)
                               : reinterpret_cast<ops::KernelOp<OpKernelSignature>::Fn>(kernel->fn)(inputs, attrs);
  }
  KILN_CHECK(schema->num_outputs < 0 || static_cast<int>(outputs.size()) == schema->num_outputs,
             "custom op '{}': its {} kernel returned {} outputs, the op declares {}", name, device.str(),
             outputs.size(), schema->num_outputs);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    KILN_CHECK(outputs[i].defined(), "custom op '{}': its {} kernel returned an undefined output {}", name,
               device.str(), i);
    KILN_CHECK(outputs[i].device() == device, "custom op '{}': its {} kernel returned output {} on {}", name,
               device.str(), i, outputs[i].device().str());
  }

  if (!autograd::needs_grad(inputs)) return outputs;
  std::vector<int> differentiable;  // outputs that get a gradient: the floating-point ones
  std::vector<Tensor*> recorded;
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    if (!is_floating(outputs[i].dtype())) continue;
    // A kernel may hand back an input (or another tensor already in a graph): record on an alias.
    if (outputs[i].requires_grad()) outputs[i] = outputs[i].detach();
    differentiable.push_back(static_cast<int>(i));
  }
  if (differentiable.empty()) return outputs;
  for (int i : differentiable) recorded.push_back(&outputs[static_cast<std::size_t>(i)]);

  std::vector<autograd::SavedTensor> saved_inputs, saved_outputs;
  if (schema->save_inputs)
    for (const auto& t : inputs) saved_inputs.emplace_back(t.defined() ? t.detach() : Tensor());
  if (schema->save_outputs)
    for (const auto& t : outputs) saved_outputs.emplace_back(t.detach());
  std::vector<bool> needs_input_grad;
  std::vector<Shape> input_shapes;
  for (const auto& t : inputs) {
    needs_input_grad.push_back(t.defined() && t.requires_grad());
    input_shapes.push_back(t.defined() ? t.shape() : Shape{});
  }

  autograd::record(
      e.node_name.c_str(), inputs, recorded,
      [schema, saved_inputs = std::move(saved_inputs), saved_outputs = std::move(saved_outputs), attrs,
       needs_input_grad = std::move(needs_input_grad), input_shapes = std::move(input_shapes),
       differentiable = std::move(differentiable), num_outputs = outputs.size(),
       device](const autograd::Grads& grads) -> autograd::Grads {
        const std::string& name = schema->name;
        const std::size_t num_inputs = needs_input_grad.size();
        KILN_CHECK(schema->backward,
                   "custom op '{}' has no backward: set OpSchema::backward when declaring it to differentiate "
                   "through it",
                   name);
        BackwardContext ctx;
        ctx.grad_outputs.resize(num_outputs);
        bool any = false;
        for (std::size_t k = 0; k < differentiable.size(); ++k) {
          ctx.grad_outputs[static_cast<std::size_t>(differentiable[k])] = grads[k];
          any = any || grads[k].defined();
        }
        if (!any) return autograd::Grads(num_inputs);
        for (const auto& s : saved_inputs) ctx.inputs.push_back(s.defined() ? s.get(name.c_str()) : Tensor());
        for (const auto& s : saved_outputs) ctx.outputs.push_back(s.get(name.c_str()));
        ctx.attrs = attrs;
        ctx.needs_input_grad = needs_input_grad;
        autograd::Grads out = schema->backward(ctx);
        KILN_CHECK(out.size() == num_inputs, "custom op '{}': backward returned {} gradients for {} inputs", name,
                   out.size(), num_inputs);
        for (std::size_t i = 0; i < num_inputs; ++i) {
          if (!needs_input_grad[i]) {
            out[i] = Tensor();
            continue;
          }
          if (!out[i].defined()) continue;
          KILN_CHECK(out[i].shape() == input_shapes[i],
                     "custom op '{}': backward returned a gradient {} for input {} of shape {}", name,
                     out[i].describe(), i, shape_str(input_shapes[i]));
          KILN_CHECK(out[i].device() == device, "custom op '{}': backward returned a gradient on {} for an input on {}",
                     name, out[i].device().str(), device.str());
        }
        return out;
      });
  return outputs;
}

}  // namespace

OpRegistry::OpRegistry() : impl_(std::make_unique<Impl>()) {
  impl_->owned_kernels = std::make_unique<ops::KernelRegistry>();
  impl_->kernels = impl_->owned_kernels.get();
}
OpRegistry::OpRegistry(ops::KernelRegistry& kernels) : impl_(std::make_unique<Impl>()) { impl_->kernels = &kernels; }
OpRegistry::~OpRegistry() = default;
OpRegistry::OpRegistry(OpRegistry&&) noexcept = default;
OpRegistry& OpRegistry::operator=(OpRegistry&&) noexcept = default;

OpRegistry& OpRegistry::def(OpSchema schema) {
  check_name(schema.name);
  std::unique_lock lock(impl_->mutex);
  OpEntry& e = impl_->entry(schema.name);
  KILN_CHECK(!e.schema, "custom op '{}' is already declared (kernels: {}); an op can be declared once", schema.name,
             impl_->kernel_list(e));
  e.schema = std::make_shared<const OpSchema>(std::move(schema));
  return *this;
}

OpRegistry& OpRegistry::impl(std::string_view op, DeviceKind device, std::initializer_list<DType> dtypes,
                             OpKernel kernel) {
  check_name(op);
  KILN_CHECK(kernel != nullptr, "custom op '{}': the kernel for device {} is empty", op, device_kind_name(device));
  KILN_CHECK(dtypes.size() > 0, "custom op '{}': no dtypes given for the {} kernel", op, device_kind_name(device));
  std::unique_lock lock(impl_->mutex);
  OpEntry& e = impl_->entry(op);
  for (DType t : dtypes)
    KILN_CHECK(!impl_->has_slot(e, device, t),
               "custom op '{}': a kernel for device {} and dtype {} is already registered (kernels: {})", op,
               device_kind_name(device), dtype_name(t), impl_->kernel_list(e));
  impl_->kernels->add(e.op, device, std::move(kernel), ops::DTypeSet(dtypes));
  return *this;
}

OpRegistry& OpRegistry::impl(std::string_view op, DeviceKind device, DType dtype, OpKernel kernel) {
  return impl(op, device, {dtype}, std::move(kernel));
}

std::uint64_t OpRegistry::id() const { return impl_->id; }

bool OpRegistry::has(std::string_view op) const {
  std::shared_lock lock(impl_->mutex);
  const OpEntry* e = impl_->find(op);
  return e && e->schema;
}

bool OpRegistry::has_kernel(std::string_view op, DeviceKind device, DType dtype) const {
  std::shared_lock lock(impl_->mutex);
  const OpEntry* e = impl_->find(op);
  return e && impl_->kernels->find_kernel(e->op.id, device, dtype) != nullptr;
}

std::vector<std::string> OpRegistry::op_names() const {
  std::shared_lock lock(impl_->mutex);
  std::vector<std::string> names;
  for (const auto& [name, e] : impl_->ops)
    if (e->schema) names.push_back(name);
  return names;
}

std::string OpRegistry::describe(std::string_view op) const {
  std::shared_lock lock(impl_->mutex);
  const OpEntry* e = impl_->find(op);
  KILN_CHECK(e, "custom op '{}' is not registered", op);
  std::string out = fmt::format("{}: {}", op, impl_->kernel_list(*e));
  if (!e->schema) return out + " (not declared)";
  if (!e->schema->backward) out += " (no backward)";
  if (!e->schema->doc.empty()) out += " - " + e->schema->doc;
  return out;
}

ops::KernelRegistry& OpRegistry::kernels() const { return *impl_->kernels; }

std::vector<std::string> OpRegistry::merge(OpRegistry&& other) {
  KILN_CHECK(&other != this, "OpRegistry::merge: cannot merge a registry into itself");
  KILN_CHECK(other.impl_->kernels != impl_->kernels,
             "OpRegistry::merge: both registries are over the same kernel table; there is nothing to move");
  std::unique_lock lock(impl_->mutex);
  std::unique_lock other_lock(other.impl_->mutex);
  // Check everything first, so that a conflict leaves both registries as they were; the kernel
  // table's merge checks the rest (kernels of other ops) itself before it changes anything.
  for (const auto& [name, theirs] : other.impl_->ops) {
    const OpEntry* ours = impl_->find(name);
    if (!ours) continue;
    KILN_CHECK(!(ours->schema && theirs->schema), "custom op '{}' is already declared (kernels: {})", name,
               impl_->kernel_list(*ours));
    for (int d = 0; d < kNumDeviceKinds; ++d)
      for (int t = 0; t < kNumDTypes; ++t)
        KILN_CHECK(!(impl_->has_slot(*ours, static_cast<DeviceKind>(d), static_cast<DType>(t)) &&
                     other.impl_->has_slot(*theirs, static_cast<DeviceKind>(d), static_cast<DType>(t))),
                   "custom op '{}': a kernel for device {} and dtype {} is already registered", name,
                   device_kind_name(static_cast<DeviceKind>(d)), dtype_name(static_cast<DType>(t)));
  }
  std::vector<std::string> moved = impl_->kernels->merge(std::move(*other.impl_->kernels));
  std::vector<std::string> names;
  for (auto& [name, theirs] : other.impl_->ops) {
    names.push_back(name);
    OpEntry& ours = impl_->entry(name);  // declared in our table by the merge above
    if (theirs->schema) ours.schema = std::move(theirs->schema);
  }
  other.impl_->ops.clear();
  // Kernels the extension added to ops it did not declare (built-in ops, say) are named too.
  for (auto& n : moved)
    if (std::find(names.begin(), names.end(), n) == names.end()) names.push_back(std::move(n));
  std::sort(names.begin(), names.end());
  return names;
}

std::vector<Tensor> OpRegistry::call(std::string_view op, const std::vector<Tensor>& inputs, const Attrs& attrs) const {
  const OpEntry* e = nullptr;
  {
    std::shared_lock lock(impl_->mutex);
    e = impl_->find(op);
    if (!e) {
      std::string known;
      for (const auto& [name, entry] : impl_->ops) known += (known.empty() ? "" : ", ") + name;
      KILN_FAIL(
          "custom op '{}' is not registered (registered ops: {}); load its extension first with "
          "kiln::load_extension()",
          op, known.empty() ? "none" : known);
    }
  }
  return run(*impl_, *e, inputs, attrs);
}

OpRegistry& op_registry() {
  // Never destroyed: kernels of extensions may be called until the process exits.
  static OpRegistry* registry = new OpRegistry(ops::kernel_registry());
  return *registry;
}

std::vector<Tensor> call_op(std::string_view op, const std::vector<Tensor>& inputs, const Attrs& attrs) {
  return op_registry().call(op, inputs, attrs);
}

Op::Op(std::string_view name, const OpRegistry& registry) : registry_(&registry) {
  std::shared_lock lock(registry.impl_->mutex);
  entry_ = registry.impl_->find(name);
  KILN_CHECK(entry_ && entry_->schema, "custom op '{}' is not declared; load its extension first", name);
}

std::vector<Tensor> Op::operator()(const std::vector<Tensor>& inputs, const Attrs& attrs) const {
  return run(*registry_->impl_, *entry_, inputs, attrs);
}

const std::string& Op::name() const { return entry_->name; }

}  // namespace kiln
