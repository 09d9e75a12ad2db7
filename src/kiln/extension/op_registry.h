#pragma once
// Custom ops: operators written outside Kiln (in an extension library, see docs/extensions.md)
// that dispatch by device and dtype and take part in autograd like the built-in ones.
//
//   registry.def({.name = "bias_gelu", .num_inputs = 2, .num_outputs = 1,
//                 .backward = [](const kiln::BackwardContext& ctx) { ... return {gx, gb}; }});
//   registry.impl("bias_gelu", kiln::DeviceKind::CPU, {kiln::DType::F32, kiln::DType::F64}, cpu_kernel);
//   registry.impl("bias_gelu", kiln::DeviceKind::CUDA, kiln::DType::F32, cuda_kernel);
//   kiln::Tensor y = kiln::call_op("bias_gelu", {x, b})[0];
//
// Dispatch: the device and dtype of the first defined tensor input pick the kernel; every defined
// input must be on that device. Registration is explicit (no static initialisers): an extension's
// kiln_extension_init(OpRegistry&) or a function the application calls. Ops are never removed.
//
// The kernels live in Kiln's one kernel table (ops/kernel_registry.h), keyed by (op, device kind,
// dtype) like the built-in ops' kernels; this layer adds what sits above autograd: the schema
// (arity, backward) and the recording of the backward node.
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kiln/extension/attrs.h"
#include "kiln/ops/kernel_registry.h"
#include "kiln/runtime/device.h"
#include "kiln/tensor/tensor.h"

namespace kiln {

// A forward kernel: receives the op's inputs (on its device; undefined for absent optional
// inputs) and attributes, allocates and returns its outputs on the same device. Kernels run with
// grad mode off: they compute, the registry records the backward.
using OpKernelSignature = std::vector<Tensor>(const std::vector<Tensor>& inputs, const Attrs& attrs);
using OpKernel = std::function<OpKernelSignature>;

// What a backward function sees. Saved tensors are detached views of the forward's tensors.
struct BackwardContext {
  std::vector<Tensor> grad_outputs;    // one per output; undefined where no gradient reached it
  std::vector<Tensor> inputs;          // the forward inputs (empty if OpSchema::save_inputs is off)
  std::vector<Tensor> outputs;         // the forward outputs (empty if OpSchema::save_outputs is off)
  Attrs attrs;                         // the forward attributes
  std::vector<bool> needs_input_grad;  // which inputs want a gradient
};

// Returns one gradient per input (undefined where none is needed), each shaped like its input.
// Backward functions usually call other ops (call_op("<op>_backward", ...) or built-ins), so they
// are device-agnostic; they run with grad mode off.
using OpBackward = std::function<std::vector<Tensor>(const BackwardContext& ctx)>;

struct OpSchema {
  std::string name{};
  int num_inputs = -1;   // checked at every call; -1: any number
  int num_outputs = -1;  // checked against what the kernel returns; -1: any number
  // Empty: the op is not differentiable; a backward pass that reaches it raises kiln::Error.
  OpBackward backward{};
  bool save_inputs = true;   // keep the inputs for backward
  bool save_outputs = true;  // keep the outputs for backward
  std::string doc{};         // one line, shown by OpRegistry::describe()
};

namespace detail {
struct OpEntry;
}

class OpRegistry {
 public:
  OpRegistry();  // with a kernel table of its own (a staging registry, a test's)
  // Over an existing kernel table (op_registry() is over ops::kernel_registry()).
  explicit OpRegistry(ops::KernelRegistry& kernels);
  ~OpRegistry();
  OpRegistry(OpRegistry&&) noexcept;
  OpRegistry& operator=(OpRegistry&&) noexcept;
  OpRegistry(const OpRegistry&) = delete;
  OpRegistry& operator=(const OpRegistry&) = delete;

  // Declares an op. Throws kiln::Error if an op of that name is already declared here.
  OpRegistry& def(OpSchema schema);
  // Registers a kernel of `op` for one device kind and one or more dtypes. The op may be declared
  // before or after (kernels for an op declared by another extension are fine). Throws
  // kiln::Error naming the op, the device and the dtype if that kernel is already registered.
  OpRegistry& impl(std::string_view op, DeviceKind device, std::initializer_list<DType> dtypes, OpKernel kernel);
  OpRegistry& impl(std::string_view op, DeviceKind device, DType dtype, OpKernel kernel);

  bool has(std::string_view op) const;  // declared
  bool has_kernel(std::string_view op, DeviceKind device, DType dtype) const;
  std::vector<std::string> op_names() const;        // declared ops, sorted
  std::uint64_t id() const;                         // unique per registry object in this process
  std::string describe(std::string_view op) const;  // "bias_gelu: cpu (float32, float64), cuda (float32)"
  // The kernel table the kernels are in. An extension may register kernels of the built-in ops
  // there too (e.g. for another device kind); load_extension() merges them with the rest.
  ops::KernelRegistry& kernels() const;

  // Moves every declaration and kernel of `other` into this registry, all or nothing: on a
  // conflict (an op declared in both, the same kernel in both) nothing changes and kiln::Error
  // names the op and the device. Returns the names of the ops `other` declared or added kernels to.
  std::vector<std::string> merge(OpRegistry&& other);

  // Runs `op` on `inputs`: picks the kernel by device and dtype, checks what the kernel returns,
  // and records the backward when an input requires grad and grad mode is on.
  std::vector<Tensor> call(std::string_view op, const std::vector<Tensor>& inputs, const Attrs& attrs = {}) const;

  struct Impl;  // defined in op_registry.cpp

 private:
  friend class Op;
  std::unique_ptr<Impl> impl_;
};

// The process-wide registry that call_op() and load_extension() use. It lives in libkiln.so, so
// the application and every extension share it.
OpRegistry& op_registry();

// op_registry().call(op, inputs, attrs).
std::vector<Tensor> call_op(std::string_view op, const std::vector<Tensor>& inputs, const Attrs& attrs = {});

// A handle to a declared op: looks the name up once, then each call goes straight to dispatch.
class Op {
 public:
  explicit Op(std::string_view name, const OpRegistry& registry = op_registry());  // throws if not declared
  std::vector<Tensor> operator()(const std::vector<Tensor>& inputs, const Attrs& attrs = {}) const;
  const std::string& name() const;

 private:
  const OpRegistry* registry_;
  const detail::OpEntry* entry_;
};

// A typed handle for single-output ops taking tensors:
//   static const kiln::TypedOp<2> bias_gelu("bias_gelu");  Tensor y = bias_gelu(x, b);
template <int NumInputs>
class TypedOp {
 public:
  explicit TypedOp(std::string_view name, const OpRegistry& registry = op_registry()) : op_(name, registry) {}
  template <class... Ts>
  requires(sizeof...(Ts) == NumInputs && (std::is_convertible_v<const Ts&, const Tensor&> && ...)) Tensor operator()(
      const Ts&... inputs) const {
    return single(op_({inputs...}));
  }
  template <class... Ts>
  requires(sizeof...(Ts) == NumInputs && (std::is_convertible_v<const Ts&, const Tensor&> && ...)) Tensor
      with(const Attrs& attrs, const Ts&... inputs)
  const { return single(op_({inputs...}, attrs)); }
  const Op& op() const { return op_; }

 private:
  Tensor single(std::vector<Tensor> outputs) const {
    KILN_CHECK(outputs.size() == 1, "custom op '{}' returned {} outputs; TypedOp expects one", op_.name(),
               outputs.size());
    return std::move(outputs[0]);
  }
  Op op_;
};

}  // namespace kiln
