#include "kiln/ops/kernel_registry.h"

#include <algorithm>

#include "kiln/ops/kernels.h"

namespace kiln::ops {

namespace {
std::string slot_name(int dtype_slot) {
  return dtype_slot == kNumDTypes ? "every dtype" : std::string(dtype_name(static_cast<DType>(dtype_slot)));
}
}  // namespace

KernelRegistry::KernelRegistry() { declare_builtin_ops(*this); }
KernelRegistry::~KernelRegistry() = default;

OpId KernelRegistry::declare_erased(std::string_view name, const std::type_info& signature) {
  KILN_CHECK(!name.empty(), "kernel registry: an op name is empty");
  KILN_CHECK(std::none_of(name.begin(), name.end(), [](char c) { return c == ' ' || c == '\t' || c == '\n'; }),
             "kernel registry: op name '{}' contains whitespace", name);
  std::lock_guard lock(mutex_);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    const Entry& e = *owned_[it->second];
    KILN_CHECK(*e.signature == signature,
               "op '{}' is already declared with another kernel type ({}); it cannot be declared as {}", name,
               e.signature->name(), signature.name());
    return it->second;
  }
  const auto id = static_cast<OpId>(owned_.size());
  KILN_CHECK(id < kMaxOps, "kernel registry: cannot declare op '{}': the table holds at most {} ops", name, kMaxOps);
  auto e = std::make_unique<Entry>();
  e->name = std::string(name);
  e->signature = &signature;
  entries_[id].store(e.get(), std::memory_order_release);
  owned_.push_back(std::move(e));
  by_name_.emplace(std::string(name), id);
  return id;
}

OpId KernelRegistry::find_erased(std::string_view name, const std::type_info& signature) const {
  std::lock_guard lock(mutex_);
  auto it = by_name_.find(name);
  KILN_CHECK(it != by_name_.end(), "op '{}' is not registered (register its op family first)", name);
  const Entry& e = *owned_[it->second];
  KILN_CHECK(*e.signature == signature, "op '{}' has kernel type {}, not {}", name, e.signature->name(),
             signature.name());
  return it->second;
}

std::optional<OpId> KernelRegistry::find_id(std::string_view name) const {
  std::lock_guard lock(mutex_);
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return std::nullopt;
  return it->second;
}

void KernelRegistry::add_erased(OpId op, const std::type_info& signature, DeviceKind device, DTypeSet dtypes,
                                Kernel kernel) {
  std::lock_guard lock(mutex_);
  KILN_CHECK(op < owned_.size(), "kernel registry: op id {} is not declared in this registry", op);
  Entry& e = *owned_[op];
  KILN_CHECK(*e.signature == signature, "op '{}': a kernel of type {} cannot be registered for kernel type {}", e.name,
             signature.name(), e.signature->name());
  const int d = static_cast<int>(device);
  std::vector<int> slots;
  if (dtypes.is_every()) {
    slots.push_back(kEvery);
  } else {
    for (int t = 0; t < kNumDTypes; ++t)
      if (dtypes.has(static_cast<DType>(t))) slots.push_back(t);
  }
  for (int s : slots)
    KILN_CHECK(!e.slots[d][s].load(std::memory_order_relaxed),
               "op '{}': a kernel for device {} and {} is already registered (kernels: {})", e.name,
               device_kind_name(device), slot_name(s), list_locked(e));
  e.owned.push_back(std::make_unique<const Kernel>(std::move(kernel)));
  for (int s : slots) e.slots[d][s].store(e.owned.back().get(), std::memory_order_release);
}

std::string KernelRegistry::list_locked(const Entry& e) const {
  std::string out;
  for (int d = 0; d < kNumDeviceKinds; ++d) {
    std::string dtypes;
    for (int s = 0; s <= kNumDTypes; ++s) {
      if (!e.slots[d][s].load(std::memory_order_relaxed)) continue;
      if (!dtypes.empty()) dtypes += ", ";
      dtypes += slot_name(s);
    }
    if (dtypes.empty()) continue;
    if (!out.empty()) out += ", ";
    out += fmt::format("{} ({})", device_kind_name(static_cast<DeviceKind>(d)), dtypes);
  }
  return out.empty() ? "none" : out;
}

void KernelRegistry::missing_kernel(OpId op, Device device, std::optional<DType> dtype) const {
  std::lock_guard lock(mutex_);
  const Entry& e = *owned_.at(op);
  if (dtype)
    KILN_FAIL("{}: no kernel for device {} and dtype {} (registered: {})", e.name, device.str(), dtype_name(*dtype),
              list_locked(e));
  KILN_FAIL("{}: no kernel for device {} (registered: {})", e.name, device.str(), list_locked(e));
}

const std::string& KernelRegistry::name(OpId op) const {
  std::lock_guard lock(mutex_);
  KILN_CHECK(op < owned_.size(), "kernel registry: op id {} is not declared in this registry", op);
  return owned_[op]->name;
}

bool KernelRegistry::has_kernel(std::string_view op, DeviceKind device, DType dtype) const {
  std::optional<OpId> id = find_id(op);
  return id && find_kernel(*id, device, dtype) != nullptr;
}

std::vector<std::string> KernelRegistry::op_names() const {
  std::lock_guard lock(mutex_);
  std::vector<std::string> names;
  for (const auto& [name, id] : by_name_) names.push_back(name);
  return names;
}

std::vector<KernelInfo> KernelRegistry::kernels() const {
  std::lock_guard lock(mutex_);
  std::vector<KernelInfo> out;
  for (const auto& [name, id] : by_name_) {
    const Entry& e = *owned_[id];
    for (int d = 0; d < kNumDeviceKinds; ++d)
      for (int s = 0; s <= kNumDTypes; ++s) {
        if (!e.slots[d][s].load(std::memory_order_relaxed)) continue;
        KernelInfo k{name, static_cast<DeviceKind>(d), std::nullopt};
        if (s != kEvery) k.dtype = static_cast<DType>(s);
        out.push_back(std::move(k));
      }
  }
  return out;
}

std::string KernelRegistry::describe(OpId op) const {
  std::lock_guard lock(mutex_);
  KILN_CHECK(op < owned_.size(), "kernel registry: op id {} is not declared in this registry", op);
  return fmt::format("{}: {}", owned_[op]->name, list_locked(*owned_[op]));
}

std::string KernelRegistry::kernel_list(OpId op) const {
  std::lock_guard lock(mutex_);
  KILN_CHECK(op < owned_.size(), "kernel registry: op id {} is not declared in this registry", op);
  return list_locked(*owned_[op]);
}

std::vector<std::string> KernelRegistry::merge(KernelRegistry&& other) {
  KILN_CHECK(&other != this, "KernelRegistry::merge: cannot merge a registry into itself");
  std::scoped_lock lock(mutex_, other.mutex_);
  // Check everything first, so that a conflict leaves both registries as they were.
  std::size_t new_ops = 0;
  for (const auto& theirs : other.owned_) {
    auto it = by_name_.find(theirs->name);
    if (it == by_name_.end()) {
      ++new_ops;
      continue;
    }
    const Entry& ours = *owned_[it->second];
    KILN_CHECK(*ours.signature == *theirs->signature,
               "op '{}' is already declared with another kernel type ({}); it cannot be declared as {}", ours.name,
               ours.signature->name(), theirs->signature->name());
    for (int d = 0; d < kNumDeviceKinds; ++d)
      for (int s = 0; s <= kNumDTypes; ++s)
        KILN_CHECK(
            !(ours.slots[d][s].load(std::memory_order_relaxed) && theirs->slots[d][s].load(std::memory_order_relaxed)),
            "op '{}': a kernel for device {} and {} is already registered", ours.name,
            device_kind_name(static_cast<DeviceKind>(d)), slot_name(s));
  }
  KILN_CHECK(owned_.size() + new_ops <= kMaxOps, "kernel registry: merging {} new ops exceeds the table's {} ops",
             new_ops, kMaxOps);
  std::vector<std::string> names;
  for (auto& theirs : other.owned_) {
    OpId id = 0;
    if (auto it = by_name_.find(theirs->name); it != by_name_.end()) {
      id = it->second;
    } else {
      id = static_cast<OpId>(owned_.size());
      auto e = std::make_unique<Entry>();
      e->name = theirs->name;
      e->signature = theirs->signature;
      entries_[id].store(e.get(), std::memory_order_release);
      owned_.push_back(std::move(e));
      by_name_.emplace(theirs->name, id);
    }
    Entry& ours = *owned_[id];
    if (theirs->owned.empty()) continue;
    names.push_back(theirs->name);
    for (int d = 0; d < kNumDeviceKinds; ++d)
      for (int s = 0; s <= kNumDTypes; ++s)
        if (const Kernel* k = theirs->slots[d][s].load(std::memory_order_relaxed))
          ours.slots[d][s].store(k, std::memory_order_release);
    for (auto& k : theirs->owned) ours.owned.push_back(std::move(k));
    theirs->owned.clear();
    for (auto& row : theirs->slots)
      for (auto& slot : row) slot.store(nullptr, std::memory_order_relaxed);
  }
  return names;
}

KernelRegistry& kernel_registry() {
  // Looked up on every op: a function-local static is one inline guard load after the first call.
  // Never destroyed: kernels may be looked up by other static destructors and by extension code.
  static KernelRegistry* registry = [] {
    auto* r = new KernelRegistry();
    register_cpu_kernels(*r);
#if KILN_WITH_CUDA
    register_cuda_kernels(*r);
#endif
    return r;
  }();
  return *registry;
}

void declare_builtin_ops(KernelRegistry& r) {
  // In KILN_BUILTIN_OPS order, so every registry gives the built-in ops the ids of ops::op.
#define KILN_DECLARE_BUILTIN_OP(name) \
  KILN_CHECK(r.declare<sig::name>(#name).id == op::name.id, "built-in op '{}' declared out of order", #name);
  KILN_BUILTIN_OPS(KILN_DECLARE_BUILTIN_OP)
#undef KILN_DECLARE_BUILTIN_OP
}

}  // namespace kiln::ops
