#pragma once
// The kernel registry: Kiln's one table of kernels, keyed by (op, device kind, dtype where it
// matters). The built-in ops (ops/kernels.h), op families registered by higher layers (the image
// augmentation of vision/, ...) and the custom ops of extensions (extension/op_registry.h) all
// live in it and are dispatched the same way.
//
//   // declare an op: its name and its kernel's function type (checked wherever it is used again)
//   const auto scale = registry.declare<void(const Tensor& in, double s, const Tensor& out)>("scale");
//   registry.add(scale, DeviceKind::CPU, cpu_scale);                           // every dtype
//   registry.add(scale, DeviceKind::CUDA, cuda_scale_f32, {DType::F32});       // one dtype
//   ops::kernel(scale, x.device(), x.dtype())(x, 2.0, y);
//
// An op is a small integer id; a lookup is two array loads, no string and no lock, so an op
// wrapper pays nothing for the table. A kernel registered without dtypes takes every dtype (it
// checks what it supports itself); one registered for given dtypes serves those and wins over an
// every-dtype kernel of the same device. Registration is explicit (no static initialisers): the
// built-in kernels on first use of kernel_registry(), other families by a function their layer
// calls at startup. Ops and kernels are never removed, so handles and kernel pointers stay valid.
#include <atomic>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <typeinfo>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/dtype.h"

namespace kiln::ops {

using OpId = std::uint32_t;
using ErasedFn = void (*)();  // a kernel's function pointer with its type erased

// A typed handle to an op of a registry: its id, and its kernel's function type `Sig`.
template <class Sig>
struct KernelOp;
template <class R, class... Args>
struct KernelOp<R(Args...)> {
  using Signature = R(Args...);
  using Fn = R (*)(Args...);
  OpId id = 0;
};

// The dtypes a kernel serves; empty means every dtype (the kernel checks its inputs itself).
class DTypeSet {
 public:
  DTypeSet() = default;
  DTypeSet(DType t) : bits_(bit(t)) {}  // NOLINT(google-explicit-constructor): {DType::F32} reads best
  DTypeSet(std::initializer_list<DType> ts) {
    for (DType t : ts) bits_ |= bit(t);
  }
  static DTypeSet every() { return {}; }
  bool is_every() const { return bits_ == 0; }
  bool has(DType t) const { return (bits_ & bit(t)) != 0; }

 private:
  static std::uint32_t bit(DType t) { return 1u << static_cast<unsigned>(t); }
  std::uint32_t bits_ = 0;
};

// What a kernel says about itself beyond its type.
enum KernelFlag : unsigned {
  kTakesChannelsLast = 1u,  // its 4-D tensors may all be channels-last instead of contiguous
};

// One registered kernel: a function pointer, or a callable the registry keeps alive (an
// extension's std::function). Immutable once registered.
struct Kernel {
  ErasedFn fn = nullptr;
  const void* callable = nullptr;  // a std::function<Sig>, owned through `owner`
  std::shared_ptr<const void> owner;
  unsigned flags = 0;
};

// One row of KernelRegistry::kernels(): what the test harness enumerates.
struct KernelInfo {
  std::string op;
  DeviceKind device{};
  std::optional<DType> dtype;  // empty: the kernel serves every dtype
};

class KernelRegistry {
 public:
  static constexpr OpId kMaxOps = 1024;

  KernelRegistry();  // declares the built-in ops (ops/kernels.h), without kernels
  ~KernelRegistry();
  KernelRegistry(const KernelRegistry&) = delete;
  KernelRegistry& operator=(const KernelRegistry&) = delete;

  // Declares an op whose kernels have type `Sig`, or returns the op already declared under that
  // name; throws kiln::Error naming the op when it was declared with another kernel type.
  template <class Sig>
  KernelOp<Sig> declare(std::string_view name) {
    return {declare_erased(name, typeid(Sig))};
  }
  // The op declared under `name` with kernel type `Sig`; throws naming the op when there is none.
  template <class Sig>
  KernelOp<Sig> find(std::string_view name) const {
    return {find_erased(name, typeid(Sig))};
  }
  std::optional<OpId> find_id(std::string_view name) const;

  // Registers `fn` as the kernel of `op` on `device` for `dtypes` (every dtype when left out).
  // Throws kiln::Error naming the op, the device and the dtype if that slot is taken.
  template <class Sig>
  void add(KernelOp<Sig> op, DeviceKind device, Sig* fn, DTypeSet dtypes = {}, unsigned flags = 0) {
    KILN_CHECK(fn != nullptr, "{}: the {} kernel is null", name(op.id), device_kind_name(device));
    Kernel k;
    k.fn = reinterpret_cast<ErasedFn>(fn);
    k.flags = flags;
    add_erased(op.id, typeid(Sig), device, dtypes, std::move(k));
  }
  // The same for a callable with state; the registry keeps it alive.
  template <class Sig>
  void add(KernelOp<Sig> op, DeviceKind device, std::type_identity_t<std::function<Sig>> fn, DTypeSet dtypes = {},
           unsigned flags = 0) {
    KILN_CHECK(fn != nullptr, "{}: the {} kernel is empty", name(op.id), device_kind_name(device));
    auto owned = std::make_shared<const std::function<Sig>>(std::move(fn));
    Kernel k;
    k.callable = owned.get();
    k.owner = std::move(owned);
    k.flags = flags;
    add_erased(op.id, typeid(Sig), device, dtypes, std::move(k));
  }

  // The kernel for `dtype` on `device` (a dtype's own kernel first, else the every-dtype one), or
  // null. Lock-free: two array loads.
  const Kernel* find_kernel(OpId op, DeviceKind device, DType dtype) const noexcept {
    const Entry* e = entries_[op].load(std::memory_order_acquire);
    const Kernel* k = e->slots[static_cast<int>(device)][static_cast<int>(dtype)].load(std::memory_order_acquire);
    return k ? k : e->slots[static_cast<int>(device)][kEvery].load(std::memory_order_acquire);
  }
  // The every-dtype kernel on `device`, or null.
  const Kernel* find_kernel(OpId op, DeviceKind device) const noexcept {
    return entries_[op]
        .load(std::memory_order_acquire)
        ->slots[static_cast<int>(device)][kEvery]
        .load(std::memory_order_acquire);
  }
  // The kernel in exactly one slot: `dtype`'s own, or the every-dtype one when `dtype` is empty.
  const Kernel* kernel_at(OpId op, DeviceKind device, std::optional<DType> dtype) const noexcept {
    return entries_[op]
        .load(std::memory_order_acquire)
        ->slots[static_cast<int>(device)][dtype ? static_cast<int>(*dtype) : kEvery]
        .load(std::memory_order_acquire);
  }
  // Throws "<op>: no kernel for device <d>[ and dtype <t>] (registered: ...)".
  [[noreturn]] void missing_kernel(OpId op, Device device, std::optional<DType> dtype) const;

  const std::string& name(OpId op) const;
  bool has_kernel(std::string_view op, DeviceKind device, DType dtype) const;
  std::vector<std::string> op_names() const;  // every declared op, sorted
  std::vector<KernelInfo> kernels() const;    // every registered kernel, sorted by op, device, dtype
  std::string describe(OpId op) const;        // "copy: cpu (every dtype), cuda (every dtype)"
  std::string kernel_list(OpId op) const;     // "cpu (every dtype), cuda (every dtype)"; "none"

  // Moves every op and kernel of `other` into this registry (ops matched by name), all or
  // nothing: on a conflict (an op declared with another type, a kernel slot taken in both)
  // nothing changes and kiln::Error names the op, the device and the dtype. Returns the names of
  // the ops that `other` registered kernels for.
  std::vector<std::string> merge(KernelRegistry&& other);

 private:
  static constexpr int kEvery = kNumDTypes;  // the slot of every-dtype kernels
  struct Entry {
    std::string name;
    const std::type_info* signature = nullptr;
    std::atomic<const Kernel*> slots[kNumDeviceKinds][kNumDTypes + 1] = {};
    std::vector<std::unique_ptr<const Kernel>> owned;  // what the slots point to
  };

  OpId declare_erased(std::string_view name, const std::type_info& signature);
  OpId find_erased(std::string_view name, const std::type_info& signature) const;
  void add_erased(OpId op, const std::type_info& signature, DeviceKind device, DTypeSet dtypes, Kernel kernel);
  std::string list_locked(const Entry& e) const;  // caller holds mutex_

  mutable std::mutex mutex_;  // writers, and readers of names and the kernel lists
  std::map<std::string, OpId, std::less<>> by_name_;
  std::vector<std::unique_ptr<Entry>> owned_;
  std::atomic<const Entry*> entries_[kMaxOps] = {};
};

// The process-wide registry. Its first use registers the built-in CPU (and CUDA) kernels; it is
// never destroyed (kernels may be looked up until the process exits).
KernelRegistry& kernel_registry();

// The kernel of `op` for `device` and `dtype`, as a function pointer; throws naming the op, the
// device and the dtype when there is none.
template <class Sig>
typename KernelOp<Sig>::Fn kernel(KernelOp<Sig> op, Device device, DType dtype) {
  const KernelRegistry& r = kernel_registry();
  const Kernel* k = r.find_kernel(op.id, device.kind, dtype);
  if (!k || !k->fn) [[unlikely]]
    r.missing_kernel(op.id, device, dtype);
  return reinterpret_cast<typename KernelOp<Sig>::Fn>(k->fn);
}
// The every-dtype kernel of `op` for `device` (the built-in ops' kernels take every dtype).
template <class Sig>
typename KernelOp<Sig>::Fn kernel(KernelOp<Sig> op, Device device) {
  const KernelRegistry& r = kernel_registry();
  const Kernel* k = r.find_kernel(op.id, device.kind);
  if (!k || !k->fn) [[unlikely]]
    r.missing_kernel(op.id, device, std::nullopt);
  return reinterpret_cast<typename KernelOp<Sig>::Fn>(k->fn);
}
// Whether `device`'s every-dtype kernel of `op` has `flag` (false when there is no kernel).
template <class Sig>
bool kernel_has_flag(KernelOp<Sig> op, DeviceKind device, KernelFlag flag) {
  const Kernel* k = kernel_registry().find_kernel(op.id, device);
  return k && (k->flags & flag) != 0;
}

}  // namespace kiln::ops
