#pragma once
// CudaGraph: capture the work Kiln queues on a device's compute stream and replay it with one
// launch (PyTorch's torch.cuda.CUDAGraph, minus private memory pools).
//
//   CudaGraph g;
//   step();                    // 1. warm up eagerly: fills the caching allocator, cuBLASLt/cuDNN
//                              //    plans and algorithm searches, the optimizer's pointer tables
//   g.capture_begin(Device::cuda(0));
//   step();                    // 2. captured (nothing runs yet)
//   g.capture_end();
//   for (...) g.replay();      // 3. replays the captured kernels on the same memory
//
// Rules while capturing (cudaStreamCaptureModeThreadLocal on this thread):
// - no host synchronisation: no .item()/to_vector()/copies to or from the host, no
//   kiln::synchronize; the CUDA kernels themselves never synchronise;
// - no cudaMalloc: every allocation must be served from the caching allocator's cache, which is why
//   the eager warm-up step (same shapes) comes first; a first-time cuDNN algorithm search also
//   synchronises, so it must have happened in the warm-up;
// - the graph reads and writes the exact memory used during capture: keep the input/output
//   tensors alive and update inputs in place (copy_) between replays. Temporaries freed during
//   capture go back to the cache; do not allocate other tensors between replays that could be
//   handed those blocks (in a loop that only replays, this holds);
// - host scalars are frozen at capture time (e.g. AdamParams::step, learning rates).
#include "kiln/runtime/device.h"

namespace kiln {

class CudaGraph {
 public:
  CudaGraph() = default;
  ~CudaGraph();
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void capture_begin(Device device);
  void capture_end();
  void replay();  // asynchronous, on the device's current stream
  bool captured() const { return exec_ != nullptr; }
  void reset();   // frees the graph

 private:
  Device device_{};
  void* stream_ = nullptr;  // cudaStream_t the capture ran on
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  bool capturing_ = false;
};

}  // namespace kiln
