#pragma once
// CudaGraph: capture the work Kiln queues on a device's compute stream and replay it with one
// launch (PyTorch's torch.cuda.CUDAGraph, with a private memory pool per graph).
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
// - memory: the capture gets a private pool of the device's caching allocator (PyTorch's graph
//   pools). Allocations during capture come from it (cached blocks are taken over first, so the
//   warm-up's cache usually suffices; otherwise cudaMalloc in relaxed capture mode), blocks freed
//   during capture stay in it, and nothing in it is handed to other allocations or freed to the
//   driver until the graph is reset or destroyed. So other work may allocate between replays;
//   the graph still reads and writes the exact memory of the capture: keep input tensors alive
//   and update them in place (copy_) between replays;
// - a first-time cuDNN algorithm search or cuBLASLt plan synchronises: the warm-up does them;
// - host scalars are frozen at capture time: use a capturable optimizer (lr and step on the
//   device, set_lr() between replays) and graph-safe random modules (nn::set_graph_safe_random);
//   runtime/graph_capture_state.h tells code above whether a capture is active.
#include <cstdint>

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
  void release_pool();

  Device device_{};
  std::uint64_t pool_ = 0;  // the caching allocator's private pool for this graph (0: none)
  void* stream_ = nullptr;  // cudaStream_t the capture ran on
  void* graph_ = nullptr;   // cudaGraph_t
  void* exec_ = nullptr;    // cudaGraphExec_t
  bool capturing_ = false;
};

}  // namespace kiln
