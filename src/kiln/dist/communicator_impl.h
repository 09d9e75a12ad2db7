#pragma once
// The Communicator's state, shared by the files that implement its calls (mpi_communicator.cpp,
// the collectives of collectives_*.cpp). Not for use outside dist/.
#include <mpi.h>

#include <climits>
#include <memory>
#include <string>

#include "kiln/dist/communicator.h"
#include "kiln/runtime/error.h"
#if KILN_WITH_CUDA
#include "kiln/dist/nccl_channel.h"
#endif

namespace kiln::dist {

// MPI's type for moving (not reducing) elements: the reduced-precision floats travel as their bits.
inline MPI_Datatype mpi_movement_type(ElementType type) {
  switch (type) {
    case ElementType::F64: return MPI_DOUBLE;
    case ElementType::F32: return MPI_FLOAT;
    case ElementType::BF16:
    case ElementType::F16: return MPI_UINT16_T;
    case ElementType::F8E4M3:
    case ElementType::F8E5M2:
    case ElementType::U8: return MPI_UINT8_T;
    case ElementType::I64: return MPI_INT64_T;
    case ElementType::I32: return MPI_INT32_T;
  }
  return MPI_BYTE;
}

// Avg is reduced as a sum and divided afterwards.
inline MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum:
    case ReduceOp::Avg: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

inline int checked_count(std::size_t count) {
  KILN_CHECK(count <= static_cast<std::size_t>(INT_MAX), "MPI message of {} elements exceeds INT_MAX", count);
  return static_cast<int>(count);
}

struct Communicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  int rank = 0;
  int size = 1;
#if KILN_WITH_CUDA
  std::unique_ptr<gpu::NcclChannel> nccl;  // made by use_device() or the first collective on device buffers

  // The NCCL channel on `device`, made now if there is none (collective: every rank calls it).
  gpu::NcclChannel& nccl_on(int device, const char* call) {
    if (!nccl) nccl = std::make_unique<gpu::NcclChannel>(comm, rank, size, device);
    KILN_CHECK(nccl->device() == device,
               "Communicator::{}: this rank's NCCL communicator is on cuda:{}, but the buffer is on cuda:{}", call,
               nccl->device(), device);
    return *nccl;
  }

  // The NCCL channel for a call whose buffers are `a` (and `b`, when the call has two), or
  // nullptr when they are host memory. Every rank of a call must pass buffers of the same kind.
  // The NCCL communicator is made collectively, by use_device() or by the first collective call
  // with device buffers; point-to-point calls, which not every rank makes, cannot make it.
  gpu::NcclChannel* device_channel(const char* call, const void* a, const void* b = nullptr, bool collective = true) {
    const int da = gpu::device_of(a), db = b == nullptr ? da : gpu::device_of(b);
    auto where = [](int d) { return d < 0 ? std::string("the host") : fmt::format("cuda:{}", d); };
    KILN_CHECK(da == db, "Communicator::{}: one buffer is on {} and the other on {}: both must be in one place", call,
               where(da), where(db));
    if (da < 0) return nullptr;
    KILN_CHECK(nccl || collective,
               "Communicator::{} on a device buffer (cuda:{}) before this communicator has NCCL: every rank must "
               "first call use_device() or a collective on device buffers",
               call, da);
    return &nccl_on(da, call);
  }
#endif
  ~Impl() {
#if KILN_WITH_CUDA
    nccl.reset();  // before the MPI communicator it was made over
#endif
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized) MPI_Comm_free(&comm);
  }
};

// The collectives' way in to a Communicator's handles (a friend of Communicator).
struct CommunicatorAccess {
  using Impl = Communicator::Impl;
  static Impl& impl(const Communicator& c) { return *c.impl_; }
};

}  // namespace kiln::dist
