#pragma once
// What every cuDNN graph (backend API) Kiln builds shares: one handle per device, an owning
// wrapper of backend descriptors whose failures name the descriptor and the attribute, and the
// engine-configuration queries (heuristics, engine of a configuration, numerical notes).
// Users: convolutions (cudnn_conv_graph.h) and te/'s fused attention (te/cuda/attention_cudnn.h).
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/vendor/cudnn.h"

namespace kiln::ops::cuda {

// The cuDNN handle of cuda:index, created on first use. Callers set its stream
// (cudnnSetStream(h, cuda_stream(index))) before each use.
cudnnHandle_t cudnn_handle(int index);

// cuDNN's status name followed by its last error message (cudnnGetLastErrorString), for errors
// that should say why cuDNN refused, not only that it did.
std::string cudnn_status_detail(cudnnStatus_t st);

// An attribute name with its spelling, for messages: d.set(KILN_CUDNN_ATTR(CUDNN_ATTR_TENSOR_DIMENSIONS), ...).
#define KILN_CUDNN_ATTR(name) name, #name

// Owns one backend descriptor. `what` names it in errors ("tensor Q", "pointwise exp_s", ...).
class CudnnDescriptor {
 public:
  CudnnDescriptor(cudnnBackendDescriptorType_t type, std::string what);
  ~CudnnDescriptor();
  CudnnDescriptor(const CudnnDescriptor&) = delete;
  CudnnDescriptor& operator=(const CudnnDescriptor&) = delete;
  CudnnDescriptor(CudnnDescriptor&& o) noexcept;
  CudnnDescriptor& operator=(CudnnDescriptor&& o) noexcept;

  cudnnBackendDescriptor_t get() const { return d_; }
  const std::string& what() const { return what_; }
  // Gives up ownership (the caller destroys it).
  cudnnBackendDescriptor_t release();

  // cudnnBackendSetAttribute; on failure raises an error naming this descriptor, the attribute
  // and cuDNN's message.
  template <class T>
  void set(cudnnBackendAttributeName_t name, const char* name_str, cudnnBackendAttributeType_t type, std::int64_t count,
           const T* values) {
    check_set(cudnnBackendSetAttribute(d_, name, type, count, values), name_str);
  }
  void set_descriptor(cudnnBackendAttributeName_t name, const char* name_str, cudnnBackendDescriptor_t value) {
    set(name, name_str, CUDNN_TYPE_BACKEND_DESCRIPTOR, 1, &value);
  }
  // cudnnBackendFinalize; raises an error naming this descriptor on failure.
  void finalize();
  // cudnnBackendFinalize without raising: the status (for graphs and plans cuDNN may refuse).
  cudnnStatus_t try_finalize() { return cudnnBackendFinalize(d_); }

 private:
  void check_set(cudnnStatus_t st, const char* name_str) const;
  cudnnBackendDescriptor_t d_ = nullptr;
  std::string what_;
};

// The engine configurations the heuristics propose for a finalized operation graph, best first
// (empty when the heuristics have none or fail).
std::vector<CudnnDescriptor> engine_configs(const CudnnDescriptor& graph, cudnnBackendHeurMode_t mode);

// The engine an engine configuration runs (an owned copy of its descriptor); empty on failure.
std::optional<CudnnDescriptor> engine_of(cudnnBackendDescriptor_t config);

// The engine's global index (-1 when cuDNN does not say).
std::int64_t engine_global_index(cudnnBackendDescriptor_t config);

// The engine's numerical notes (empty when cuDNN does not say).
std::vector<cudnnBackendNumericalNote_t> engine_numerical_notes(cudnnBackendDescriptor_t config);

// The execution plan's workspace in bytes.
std::int64_t plan_workspace_bytes(const CudnnDescriptor& plan);

}  // namespace kiln::ops::cuda
