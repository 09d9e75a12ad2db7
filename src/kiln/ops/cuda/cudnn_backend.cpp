#include "kiln/ops/cuda/cudnn_backend.h"

#include <algorithm>
#include <mutex>

#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"

namespace kiln::ops::cuda {

cudnnHandle_t cudnn_handle(int index) {
  static cudnnHandle_t handles[64];
  static std::once_flag once[64];
  KILN_CHECK(index >= 0 && index < 64, "cuDNN: device index {} out of range", index);
  std::call_once(once[index], [index] {
    DeviceGuard guard(index);
    KILN_CUDNN_CHECK(cudnnCreate(&handles[index]));
  });
  return handles[index];
}

std::string cudnn_status_detail(cudnnStatus_t st) {
  char last[2048] = {0};
  cudnnGetLastErrorString(last, sizeof(last));
  std::string s = cudnnGetErrorString(st);
  if (last[0] != '\0') s += fmt::format(" ({})", last);
  return s;
}

CudnnDescriptor::CudnnDescriptor(cudnnBackendDescriptorType_t type, std::string what) : what_(std::move(what)) {
  const cudnnStatus_t st = cudnnBackendCreateDescriptor(type, &d_);
  KILN_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: creating the backend descriptor of {} (type {}) failed: {}", what_,
             static_cast<int>(type), cudnn_status_detail(st));
}

CudnnDescriptor::~CudnnDescriptor() {
  if (d_) cudnnBackendDestroyDescriptor(d_);
}

CudnnDescriptor::CudnnDescriptor(CudnnDescriptor&& o) noexcept : d_(o.d_), what_(std::move(o.what_)) { o.d_ = nullptr; }

CudnnDescriptor& CudnnDescriptor::operator=(CudnnDescriptor&& o) noexcept {
  if (this != &o) {
    if (d_) cudnnBackendDestroyDescriptor(d_);
    d_ = o.d_;
    what_ = std::move(o.what_);
    o.d_ = nullptr;
  }
  return *this;
}

cudnnBackendDescriptor_t CudnnDescriptor::release() {
  cudnnBackendDescriptor_t d = d_;
  d_ = nullptr;
  return d;
}

void CudnnDescriptor::check_set(cudnnStatus_t st, const char* name_str) const {
  KILN_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: setting {} on {} failed: {}", name_str, what_,
             cudnn_status_detail(st));
}

void CudnnDescriptor::finalize() {
  const cudnnStatus_t st = cudnnBackendFinalize(d_);
  KILN_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: finalizing {} failed: {}", what_, cudnn_status_detail(st));
}

std::optional<CudnnDescriptor> engine_of(cudnnBackendDescriptor_t config) {
  CudnnDescriptor engine(CUDNN_BACKEND_ENGINE_DESCRIPTOR, "engine");
  cudnnBackendDescriptor_t e = engine.get();
  std::int64_t n = 0;
  if (cudnnBackendGetAttribute(config, CUDNN_ATTR_ENGINECFG_ENGINE, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &n, &e) !=
      CUDNN_STATUS_SUCCESS)
    return std::nullopt;
  return engine;
}

std::int64_t engine_global_index(cudnnBackendDescriptor_t config) {
  std::int64_t n = 0, index = -1;
  if (std::optional<CudnnDescriptor> engine = engine_of(config))
    cudnnBackendGetAttribute(engine->get(), CUDNN_ATTR_ENGINE_GLOBAL_INDEX, CUDNN_TYPE_INT64, 1, &n, &index);
  return index;
}

std::vector<cudnnBackendNumericalNote_t> engine_numerical_notes(cudnnBackendDescriptor_t config) {
  std::vector<cudnnBackendNumericalNote_t> out;
  std::optional<CudnnDescriptor> engine = engine_of(config);
  if (!engine) return out;
  cudnnBackendNumericalNote_t notes[CUDNN_NUMERICAL_NOTE_TYPE_COUNT];
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(engine->get(), CUDNN_ATTR_ENGINE_NUMERICAL_NOTE, CUDNN_TYPE_NUMERICAL_NOTE,
                               CUDNN_NUMERICAL_NOTE_TYPE_COUNT, &count, notes) != CUDNN_STATUS_SUCCESS)
    return out;
  out.assign(notes, notes + std::clamp<std::int64_t>(count, 0, CUDNN_NUMERICAL_NOTE_TYPE_COUNT));
  return out;
}

std::vector<CudnnDescriptor> engine_configs(const CudnnDescriptor& graph, cudnnBackendHeurMode_t mode) {
  std::vector<CudnnDescriptor> configs;
  CudnnDescriptor heur(CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR, "engine heuristics of " + graph.what());
  heur.set_descriptor(KILN_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH), graph.get());
  heur.set(KILN_CUDNN_ATTR(CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_TYPE_HEUR_MODE, 1, &mode);
  if (heur.try_finalize() != CUDNN_STATUS_SUCCESS) return configs;
  std::int64_t count = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, 0, &count,
                               nullptr) != CUDNN_STATUS_SUCCESS ||
      count <= 0)
    return configs;
  for (std::int64_t i = 0; i < count; ++i)
    configs.emplace_back(CUDNN_BACKEND_ENGINECFG_DESCRIPTOR, fmt::format("engine config {} of {}", i, graph.what()));
  std::vector<cudnnBackendDescriptor_t> raw;
  for (auto& c : configs) raw.push_back(c.get());
  std::int64_t returned = 0;
  if (cudnnBackendGetAttribute(heur.get(), CUDNN_ATTR_ENGINEHEUR_RESULTS, CUDNN_TYPE_BACKEND_DESCRIPTOR, count,
                               &returned, raw.data()) != CUDNN_STATUS_SUCCESS)
    return {};
  const auto keep = static_cast<std::size_t>(std::max<std::int64_t>(0, std::min(returned, count)));
  configs.erase(configs.begin() + static_cast<std::ptrdiff_t>(keep), configs.end());
  return configs;
}

std::int64_t plan_workspace_bytes(const CudnnDescriptor& plan) {
  std::int64_t workspace = 0, n = 0;
  const cudnnStatus_t st = cudnnBackendGetAttribute(plan.get(), CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE,
                                                    CUDNN_TYPE_INT64, 1, &n, &workspace);
  KILN_CHECK(st == CUDNN_STATUS_SUCCESS, "cuDNN: reading CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE of {} failed: {}",
             plan.what(), cudnn_status_detail(st));
  return workspace;
}

}  // namespace kiln::ops::cuda
