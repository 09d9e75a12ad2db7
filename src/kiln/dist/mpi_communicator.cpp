// Communicator over MPI. Every MPI call is checked and throws kiln::Error naming the call.
#include <mpi.h>

#include <climits>
#include <cstdlib>
#include <mutex>

#include "kiln/dist/communicator.h"
#include "kiln/runtime/error.h"

namespace kiln::dist {

namespace {

void check_mpi(int rc, const char* call, const char* file, int line) {
  if (rc == MPI_SUCCESS) [[likely]]
    return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  detail::throw_error(fmt::format("MPI error in {}: {}", call, std::string(text, len)), file, line);
}
#define KILN_MPI_CHECK(call) check_mpi((call), #call, __FILE__, __LINE__)

MPI_Datatype mpi_type(ScalarKind kind) {
  switch (kind) {
    case ScalarKind::F64: return MPI_DOUBLE;
    case ScalarKind::F32: return MPI_FLOAT;
    case ScalarKind::I64: return MPI_INT64_T;
    case ScalarKind::I32: return MPI_INT32_T;
    case ScalarKind::U8: return MPI_UINT8_T;
  }
  return MPI_BYTE;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return MPI_SUM;
    case ReduceOp::Max: return MPI_MAX;
    case ReduceOp::Min: return MPI_MIN;
  }
  return MPI_SUM;
}

int checked_count(std::size_t count) {
  KILN_CHECK(count <= static_cast<std::size_t>(INT_MAX), "MPI message of {} elements exceeds INT_MAX", count);
  return static_cast<int>(count);
}

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
}

}  // namespace

void initialize(int* argc, char*** argv) {
  static std::once_flag once;
  std::call_once(once, [&] {
    int already = 0;
    MPI_Initialized(&already);
    if (already) return;
    int provided = 0;
    KILN_MPI_CHECK(MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
    std::atexit(finalize_at_exit);
  });
}

bool is_initialized() {
  int flag = 0;
  MPI_Initialized(&flag);
  return flag != 0;
}

struct Communicator::Impl {
  MPI_Comm comm = MPI_COMM_NULL;
  bool owned = false;
  int rank = 0;
  int size = 1;
  ~Impl() {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned && !finalized) MPI_Comm_free(&comm);
  }
};

Communicator::Communicator(std::shared_ptr<Impl> impl) : impl_(std::move(impl)) {}

Communicator Communicator::world() {
  initialize();
  auto impl = std::make_shared<Impl>();
  impl->comm = MPI_COMM_WORLD;
  KILN_MPI_CHECK(MPI_Comm_rank(impl->comm, &impl->rank));
  KILN_MPI_CHECK(MPI_Comm_size(impl->comm, &impl->size));
  return Communicator(impl);
}

int Communicator::rank() const { return impl_->rank; }
int Communicator::size() const { return impl_->size; }

Communicator Communicator::split(int color, int key) const {
  auto impl = std::make_shared<Impl>();
  KILN_MPI_CHECK(MPI_Comm_split(impl_->comm, color, key, &impl->comm));
  impl->owned = true;
  KILN_MPI_CHECK(MPI_Comm_rank(impl->comm, &impl->rank));
  KILN_MPI_CHECK(MPI_Comm_size(impl->comm, &impl->size));
  return Communicator(impl);
}

void Communicator::barrier() const { KILN_MPI_CHECK(MPI_Barrier(impl_->comm)); }

void Communicator::broadcast_bytes(void* data, std::size_t count, ScalarKind kind, int root) const {
  KILN_MPI_CHECK(MPI_Bcast(data, checked_count(count), mpi_type(kind), root, impl_->comm));
}

void Communicator::all_reduce_raw(void* data, std::size_t count, ScalarKind kind, ReduceOp op) const {
  KILN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_type(kind), mpi_op(op), impl_->comm));
}

void Communicator::all_gather_raw(const void* mine, std::size_t count, void* all, ScalarKind kind) const {
  KILN_MPI_CHECK(MPI_Allgather(mine, checked_count(count), mpi_type(kind), all, checked_count(count), mpi_type(kind),
                               impl_->comm));
}

void Communicator::send_raw(const void* data, std::size_t count, ScalarKind kind, int dest, int tag) const {
  KILN_MPI_CHECK(MPI_Send(data, checked_count(count), mpi_type(kind), dest, tag, impl_->comm));
}

void Communicator::recv_raw(void* data, std::size_t count, ScalarKind kind, int source, int tag) const {
  KILN_MPI_CHECK(MPI_Recv(data, checked_count(count), mpi_type(kind), source, tag, impl_->comm, MPI_STATUS_IGNORE));
}

void Communicator::send_recv_raw(const void* out, std::size_t out_count, int dest, void* in, std::size_t in_count,
                                 int source, ScalarKind kind, int tag) const {
  KILN_MPI_CHECK(MPI_Sendrecv(out, checked_count(out_count), mpi_type(kind), dest, tag, in, checked_count(in_count),
                              mpi_type(kind), source, tag, impl_->comm, MPI_STATUS_IGNORE));
}

std::intptr_t Communicator::native_handle() const { return reinterpret_cast<std::intptr_t>(impl_->comm); }

void Communicator::broadcast_topology_raw(void* data, std::size_t count, ScalarKind kind, int root,
                                          BroadcastTopology topology) const {
  const int n = impl_->size;
  if (n == 1) return;
  if (topology == BroadcastTopology::Tree) {
    broadcast_bytes(data, count, kind, root);
    return;
  }
  const int me = (impl_->rank - root + n) % n;  // position relative to the root
  const bool modified = topology == BroadcastTopology::RingModified || topology == BroadcastTopology::TwoRingModified;
  const bool two_rings = topology == BroadcastTopology::TwoRing || topology == BroadcastTopology::TwoRingModified;
  // Positions 1..n-1 receive. The modified variants serve position 1 directly from the root and
  // chain the others from position 2, so position 1 is never a relay.
  const int first = modified ? 2 : 1;
  // Each chain is a run of consecutive positions [begin, end); the root feeds every chain's head.
  struct Chain {
    int begin, end;
  };
  Chain chains[2] = {{first, n}, {n, n}};
  if (two_rings && n - first >= 2) {
    int half = first + (n - first + 1) / 2;
    chains[0] = {first, half};
    chains[1] = {half, n};
  }
  auto to_rank = [&](int position) { return (position + root) % n; };
  const int c = checked_count(count);
  MPI_Datatype type = mpi_type(kind);
  if (me == 0) {
    if (modified) KILN_MPI_CHECK(MPI_Send(data, c, type, to_rank(1), 0, impl_->comm));
    for (const Chain& chain : chains)
      if (chain.begin < chain.end) KILN_MPI_CHECK(MPI_Send(data, c, type, to_rank(chain.begin), 0, impl_->comm));
    return;
  }
  if (modified && me == 1) {
    KILN_MPI_CHECK(MPI_Recv(data, c, type, to_rank(0), 0, impl_->comm, MPI_STATUS_IGNORE));
    return;
  }
  for (const Chain& chain : chains) {
    if (me < chain.begin || me >= chain.end) continue;
    int from = me == chain.begin ? 0 : me - 1;
    KILN_MPI_CHECK(MPI_Recv(data, c, type, to_rank(from), 0, impl_->comm, MPI_STATUS_IGNORE));
    if (me + 1 < chain.end) KILN_MPI_CHECK(MPI_Send(data, c, type, to_rank(me + 1), 0, impl_->comm));
  }
}

Communicator Communicator::split_node_local() const {
  auto impl = std::make_shared<Impl>();
  KILN_MPI_CHECK(MPI_Comm_split_type(impl_->comm, MPI_COMM_TYPE_SHARED, impl_->rank, MPI_INFO_NULL, &impl->comm));
  impl->owned = true;
  KILN_MPI_CHECK(MPI_Comm_rank(impl->comm, &impl->rank));
  KILN_MPI_CHECK(MPI_Comm_size(impl->comm, &impl->size));
  return Communicator(impl);
}

}  // namespace kiln::dist
