// NCCL behind the Communicator for device buffers (see nccl_channel.h).
#include "kiln/dist/nccl_channel.h"

#include <cstring>
#include <vector>

#include "kiln/dist/mpi_check.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"

namespace kiln::dist::gpu {

namespace {

// Where a rank's GPU is: its host and PCI bus id, fixed-size so MPI can gather it as bytes.
struct GpuPlace {
  char host[MPI_MAX_PROCESSOR_NAME] = {};
  char bus_id[32] = {};
};

// NCCL needs a GPU of its own for each rank, and says only "invalid usage" when two share one
// (its check runs inside ncclCommInitRank). Every rank gathers every rank's place over MPI first,
// so all of them refuse alike, naming the ranks and the GPU, before any of them waits in NCCL.
void refuse_shared_gpus(MPI_Comm comm, int size, int device) {
  GpuPlace mine;
  int length = 0;
  KILN_MPI_CHECK(MPI_Get_processor_name(mine.host, &length));
  KILN_CUDA_CHECK(cudaDeviceGetPCIBusId(mine.bus_id, static_cast<int>(sizeof(mine.bus_id)), device));
  std::vector<GpuPlace> all(static_cast<std::size_t>(size));
  KILN_MPI_CHECK(MPI_Allgather(&mine, static_cast<int>(sizeof(GpuPlace)), MPI_BYTE, all.data(),
                               static_cast<int>(sizeof(GpuPlace)), MPI_BYTE, comm));
  for (int a = 0; a < size; ++a)
    for (int b = a + 1; b < size; ++b) {
      const GpuPlace &pa = all[static_cast<std::size_t>(a)], &pb = all[static_cast<std::size_t>(b)];
      KILN_CHECK(std::strcmp(pa.host, pb.host) != 0 || std::strcmp(pa.bus_id, pb.bus_id) != 0,
                 "Communicator on device buffers: ranks {} and {} are both on the GPU at PCI {} of host {}; NCCL "
                 "needs a GPU of its own for each rank (start at most one rank per GPU, each on its own device)",
                 a, b, pa.bus_id, pa.host);
    }
}

}  // namespace

ncclDataType_t nccl_type(ElementType type) {
  switch (type) {
    case ElementType::F64: return ncclFloat64;
    case ElementType::F32: return ncclFloat32;
    case ElementType::BF16: return ncclBfloat16;
    case ElementType::F16: return ncclFloat16;
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 24, 0)
    case ElementType::F8E4M3: return ncclFloat8e4m3;
    case ElementType::F8E5M2: return ncclFloat8e5m2;
#else
    case ElementType::F8E4M3:
    case ElementType::F8E5M2: return ncclUint8;  // moved as bytes; reductions are refused (nccl_reduce_type)
#endif
    case ElementType::I64: return ncclInt64;
    case ElementType::I32: return ncclInt32;
    case ElementType::U8: return ncclUint8;
  }
  return ncclUint8;
}

ncclDataType_t nccl_reduce_type(ElementType type, const char* call) {
#if NCCL_VERSION_CODE < NCCL_VERSION(2, 24, 0)
  KILN_CHECK(type != ElementType::F8E4M3 && type != ElementType::F8E5M2,
             "{} on {} device buffers: this NCCL ({}.{}) has no fp8 reductions (2.24 added them)", call,
             element_type_name(type), NCCL_MAJOR, NCCL_MINOR);
#else
  (void)call;
#endif
  return nccl_type(type);
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return ncclSum;
    case ReduceOp::Max: return ncclMax;
    case ReduceOp::Min: return ncclMin;
    case ReduceOp::Avg: return ncclAvg;
  }
  return ncclSum;
}

int device_of(const void* p) {
  if (p == nullptr || !kiln::detail::g_cuda_memory_allocated.load(std::memory_order_relaxed)) return -1;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    cudaGetLastError();  // a pointer CUDA does not know is host memory; clear the sticky error
    return -1;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged ? attributes.device : -1;
}

NcclChannel::NcclChannel(MPI_Comm comm, int rank, int size, int device) : device_(device) {
  DeviceGuard guard(device);
  stream_ = cuda_stream(device);
  refuse_shared_gpus(comm, size, device);
  ncclUniqueId id{};
  if (rank == 0) KILN_NCCL_CHECK(ncclGetUniqueId(&id));
  KILN_MPI_CHECK(MPI_Bcast(&id, static_cast<int>(sizeof(id)), MPI_BYTE, 0, comm));
  KILN_NCCL_CHECK(ncclCommInitRank(&comm_, size, id, rank));
}

NcclChannel::~NcclChannel() {
  if (comm_ != nullptr) ncclCommDestroy(comm_);
}

void NcclChannel::finish() { KILN_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

void NcclChannel::broadcast(void* data, std::size_t count, ScalarKind kind, int root) {
  DeviceGuard guard(device_);
  KILN_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(kind), root, comm_, stream_));
  finish();
}

void NcclChannel::all_reduce(void* data, std::size_t count, ScalarKind kind, ReduceOp op) {
  DeviceGuard guard(device_);
  KILN_NCCL_CHECK(ncclAllReduce(data, data, count, nccl_type(kind), nccl_op(op), comm_, stream_));
  finish();
}

void NcclChannel::all_gather(const void* mine, std::size_t count, void* all, ScalarKind kind) {
  DeviceGuard guard(device_);
  KILN_NCCL_CHECK(ncclAllGather(mine, all, count, nccl_type(kind), comm_, stream_));
  finish();
}

void NcclChannel::send_recv(const void* out, std::size_t out_count, int dest, void* in, std::size_t in_count,
                            int source, ScalarKind kind) {
  DeviceGuard guard(device_);
  // One group, so a send and a receive between the same two ranks cannot wait for each other.
  KILN_NCCL_CHECK(ncclGroupStart());
  if (out_count > 0) KILN_NCCL_CHECK(ncclSend(out, out_count, nccl_type(kind), dest, comm_, stream_));
  if (in_count > 0) KILN_NCCL_CHECK(ncclRecv(in, in_count, nccl_type(kind), source, comm_, stream_));
  KILN_NCCL_CHECK(ncclGroupEnd());
  finish();
}

cudaEvent_t NcclChannel::start_broadcast(void* data, std::size_t count, ScalarKind kind, int root) {
  DeviceGuard guard(device_);
  KILN_NCCL_CHECK(ncclBroadcast(data, data, count, nccl_type(kind), root, comm_, stream_));
  cudaEvent_t done = nullptr;
  KILN_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  KILN_CUDA_CHECK(cudaEventRecord(done, stream_));
  return done;
}

}  // namespace kiln::dist::gpu
