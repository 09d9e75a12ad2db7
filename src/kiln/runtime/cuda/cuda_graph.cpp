#include "kiln/runtime/cuda/cuda_graph.h"

#include "kiln/runtime/caching_allocator.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/graph_capture_state.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln {

CudaGraph::~CudaGraph() {
  if (capturing_) {  // abandon an unfinished capture
    cudaGraph_t g = nullptr;
    cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
    if (g) cudaGraphDestroy(g);
    (void)cudaGetLastError();
    cuda_caching_allocator(device_.index).end_pool();
    set_graph_capture_active(false);
    capturing_ = false;
  }
  try {
    reset();
  } catch (...) {  // a destructor must not throw; the pool is then kept (leaked, never reused)
  }
}

void CudaGraph::reset() {
  KILN_CHECK(!capturing_, "CudaGraph::reset: a capture is in progress");
  if (exec_) {
    // A replay may still run: wait for it before the pool's memory can go to other work.
    DeviceGuard guard(device_.index);
    KILN_CUDA_CHECK(cudaStreamSynchronize(cuda_stream(device_.index)));
    KILN_CUDA_CHECK(cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_)));
  }
  exec_ = nullptr;
  if (graph_) KILN_CUDA_CHECK(cudaGraphDestroy(static_cast<cudaGraph_t>(graph_)));
  graph_ = nullptr;
  release_pool();
}

void CudaGraph::release_pool() {
  if (!pool_) return;
  cuda_caching_allocator(device_.index).release_pool(pool_);
  pool_ = 0;
}

void CudaGraph::capture_begin(Device device) {
  KILN_CHECK(device.is_cuda(), "CudaGraph::capture_begin: {} is not a CUDA device", device.str());
  KILN_CHECK(!capturing_, "CudaGraph::capture_begin: a capture is already in progress");
  KILN_CHECK(!graph_capture_active(), "CudaGraph::capture_begin: this thread is already capturing another graph");
  reset();
  device_ = device;
  DeviceGuard guard(device.index);
  cudaStream_t s = cuda_stream(device.index);
  stream_ = s;
  // The pool is active from before the capture starts until it ends, so that every allocation
  // the captured work makes is the graph's.
  CachingAllocator& allocator = cuda_caching_allocator(device.index);
  pool_ = allocator.create_pool();
  allocator.begin_pool(pool_);
  const cudaError_t err = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
  if (err != cudaSuccess) {
    allocator.end_pool();
    release_pool();
    KILN_CUDA_CHECK(err);
  }
  capturing_ = true;
  set_graph_capture_active(true);
}

void CudaGraph::capture_end() {
  KILN_CHECK(capturing_, "CudaGraph::capture_end: no capture in progress");
  DeviceGuard guard(device_.index);
  cudaGraph_t g = nullptr;
  capturing_ = false;
  set_graph_capture_active(false);
  const cudaError_t err = cudaStreamEndCapture(static_cast<cudaStream_t>(stream_), &g);
  // The pool stays the graph's (its blocks are not handed out) but takes no new allocations.
  cuda_caching_allocator(device_.index).end_pool();
  if (err != cudaSuccess) {
    if (g) cudaGraphDestroy(g);
    release_pool();  // nothing captured will ever run
    KILN_CUDA_CHECK(err);
  }
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
