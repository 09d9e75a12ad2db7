#pragma once
// The GPU side of a Communicator (CUDA builds only): NCCL moves buffers that live in device
// memory, over the same calls that MPI serves for host buffers. Each Communicator makes its NCCL
// communicator collectively, in use_device() or its first collective call on device buffers:
// rank 0 creates the NCCL id and sends it to the others over the Communicator's own MPI
// communicator, and every rank joins on its device.
//
// The calls keep MPI's blocking meaning: each is enqueued on kiln's compute stream of the device
// (so it is ordered after the kernels that produced the data) and has finished when it returns.
// start_broadcast returns at once with an event that finish() waits for.
#include <mpi.h>

#include <cstddef>

#include "kiln/dist/communicator.h"
#include "kiln/runtime/vendor/nccl.h"

namespace kiln::dist::gpu {

// The CUDA device whose memory holds `p` (device or managed memory), or -1 for host memory.
// Device memory is recognised once Kiln's CUDA allocator is in use in the process (every Kiln
// tensor and buffer comes from it); before that every buffer is taken for host memory.
int device_of(const void* p);

// NCCL's names for dist's element types and reductions. nccl_reduce_type refuses, naming `call`,
// a type this NCCL cannot reduce.
ncclDataType_t nccl_type(ElementType type);
ncclDataType_t nccl_reduce_type(ElementType type, const char* call);
ncclRedOp_t nccl_op(ReduceOp op);

class NcclChannel {
 public:
  // Collective over `comm` (every rank calls it); `device` is this rank's GPU.
  NcclChannel(MPI_Comm comm, int rank, int size, int device);
  ~NcclChannel();
  NcclChannel(const NcclChannel&) = delete;
  NcclChannel& operator=(const NcclChannel&) = delete;

  int device() const { return device_; }
  ncclComm_t comm() const { return comm_; }  // for the stream-ordered collectives (collectives.h)
  void broadcast(void* data, std::size_t count, ScalarKind kind, int root);
  void all_reduce(void* data, std::size_t count, ScalarKind kind, ReduceOp op);
  void all_gather(const void* mine, std::size_t count, void* all, ScalarKind kind);
  // Either side may be empty (count 0): a plain send or receive. NCCL has no tags: messages
  // between two ranks match in the order they are posted.
  void send_recv(const void* out, std::size_t out_count, int dest, void* in, std::size_t in_count, int source,
                 ScalarKind kind);
  // The broadcast enqueued; the returned event (owned by the caller, cudaEventDestroy) completes
  // with it.
  cudaEvent_t start_broadcast(void* data, std::size_t count, ScalarKind kind, int root);

 private:
  void finish();  // waits for the stream's work so far
  ncclComm_t comm_ = nullptr;
  int device_ = 0;
  cudaStream_t stream_ = nullptr;
};

}  // namespace kiln::dist::gpu
