#include "kiln/runtime/cuda/cuda_graph.h"

#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln {

CudaGraph::~CudaGraph() {
  if (capturing_) {  // abandon an unfinished capture
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
  }
  reset();
}

void CudaGraph::reset() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
  if (graph_) cudaGraphDestroy(static_cast<cudaGraph_t>(graph_));
  exec_ = nullptr;
  graph_ = nullptr;
}

void CudaGraph::capture_begin(Device device) {
  KILN_CHECK(device.is_cuda(), "CudaGraph::capture_begin: {} is not a CUDA device", device.str());
  KILN_CHECK(!capturing_, "CudaGraph::capture_begin: a capture is already in progress");
  reset();
  device_ = device;
  DeviceGuard guard(device.index);
  cudaStream_t s = cuda_stream(device.index);
  stream_ = s;
  KILN_CUDA_CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
  capturing_ = true;
}

void CudaGraph::capture_end() {
  KILN_CHECK(capturing_, "CudaGraph::capture_end: no capture in progress");
  DeviceGuard guard(device_.index);
  cudaGraph_t g = nullptr;
  capturing_ = false;
  KILN_CUDA_CHECK(cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g));
  graph_ = g;
  cudaGraphExec_t e = nullptr;
  KILN_CUDA_CHECK(cudaGraphInstantiate(&e, g, 0));
  exec_ = e;
}

void CudaGraph::replay() {
  KILN_CHECK(exec_ != nullptr, "CudaGraph::replay: nothing captured");
  DeviceGuard guard(device_.index);
  KILN_CUDA_CHECK(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), cuda_stream(device_.index)));
}

}  // namespace kiln
