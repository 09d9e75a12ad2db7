#pragma once
// One direction of a 2-D convolution (forward, backward data or backward filter) as a cuDNN graph
// (the backend API that cuDNN 9 is built on and that PyTorch reaches through cudnn-frontend).
// The legacy cudnnFind*/cudnnConvolution* API only sees a subset of cuDNN 9's engines; on the
// H200 it picked bf16 kernels 1.3-3.5x slower than PyTorch's for the ResNet-18 CIFAR shapes.
//
// Building a plan asks the heuristics (mode A) for engine configurations, drops the ones whose
// numerics Kiln does not allow (TF32 for f32 unless KILN_ALLOW_TF32=1, down-converted inputs,
// reduced-precision reductions), finalizes the rest and times each on the caller's buffers
// (CUDA events, median of three after one warm-up run), keeping the fastest: what
// torch.backends.cudnn.benchmark=True does. Building synchronises the stream; execution does not.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "kiln/runtime/vendor/cudnn.h"
#include "kiln/tensor/dtype.h"

namespace kiln::ops::cuda {

enum class ConvDirection { Forward, BackwardData, BackwardFilter };

// cuDNN's data type for a Kiln dtype (f64, f32, f16, bf16); others raise an error naming conv2d.
cudnnDataType_t cudnn_data_type(DType t);

// A tensor as cuDNN's graph sees it: 4 dims in NCHW order with their strides (any layout) and
// the byte alignment of its data pointer (at most 16).
struct ConvTensorLayout {
  std::int64_t dims[4];
  std::int64_t strides[4];
  std::int64_t alignment;
};

struct ConvGeometry {
  std::int64_t pad[2], stride[2], dilation[2];
};

// The three buffers of a convolution: x (or dx), w (or dw), y (or dy). Which are read and which
// written depends on the direction.
struct ConvBuffers {
  void* x;
  void* w;
  void* y;
};

class CudnnConvGraph {
 public:
  // Returns null when no engine can run this convolution (the caller falls back to the legacy API).
  static std::unique_ptr<CudnnConvGraph> build(cudnnHandle_t handle, int device_index, ConvDirection direction,
                                               DType dtype, const ConvTensorLayout& x, const ConvTensorLayout& w,
                                               const ConvTensorLayout& y, const ConvGeometry& geometry,
                                               const ConvBuffers& buffers);
  ~CudnnConvGraph();
  CudnnConvGraph(const CudnnConvGraph&) = delete;
  CudnnConvGraph& operator=(const CudnnConvGraph&) = delete;

  // Runs on the handle's stream; the workspace comes from the caching allocator.
  void execute(cudnnHandle_t handle, int device_index, const ConvBuffers& buffers) const;
  std::size_t workspace_bytes() const { return workspace_; }
  std::int64_t engine_index() const { return engine_; }
  float time_ms() const { return time_ms_; }  // as measured when the plan was chosen

 private:
  CudnnConvGraph() = default;
  cudnnBackendDescriptor_t plan_ = nullptr;
  std::size_t workspace_ = 0;
  std::int64_t engine_ = -1;
  float time_ms_ = 0.0f;
  std::vector<cudnnBackendDescriptor_t> keep_;  // what the plan was built from
};

}  // namespace kiln::ops::cuda
