// Communicator over MPI, and over NCCL for buffers in GPU memory (CUDA builds; nccl_channel.h).
// Every MPI call is checked and throws kiln::Error naming the call.
#include <mpi.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/dist/communicator_impl.h"
#include "kiln/dist/mpi_check.h"
#include "kiln/runtime/error.h"

namespace kiln::dist {

namespace {

MPI_Op blocking_mpi_op(ReduceOp op) {
  KILN_CHECK(op != ReduceOp::Avg,
             "Communicator::all_reduce: ReduceOp::Avg is taken by dist::all_reduce (collectives.h), not the "
             "blocking call");
  return mpi_op(op);
}

// The private session directory of a singleton (below), removed once MPI is finalized.
std::string g_private_session_dir;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (!finalized) MPI_Finalize();
  if (!g_private_session_dir.empty()) {
    std::error_code ignored;  // at exit: nothing left to report to
    std::filesystem::remove_all(g_private_session_dir, ignored);
  }
}

// True when a launcher started this process as a rank of a job: mpirun / mpiexec (Open MPI sets
// OMPI_COMM_WORLD_SIZE and PMIX_RANK), srun with PMIx (PMIX_RANK) or PMI-2 (PMI_RANK), MPICH's
// Hydra (PMI_RANK). SLURM_PROCID alone is not such a sign: a batch script's own shell has it.
bool started_by_a_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMIX_RANK", "PMI_RANK", "PMI_SIZE"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

// Open MPI 4 singletons (a process that calls MPI_Init without mpirun: every single-process test
// and `kiln` run that touches MPI) create the session directory /tmp/ompi.<host>.<uid> in
// orte_init. Several starting at once (ctest -j) race on that mkdir and one of them sometimes
// fails with "A call to mkdir was unable to create the desired directory ... Error: File exists".
// A singleton therefore gets a directory of its own as the session-directory base (the MCA
// variable orte_tmpdir_base, read from the environment by MPI_Init and by the orted it forks).
// Ranks started by a launcher keep the launcher's setting, and so does a user's explicit one.
void use_private_session_dir_if_singleton() {
  if (started_by_a_launcher() || std::getenv("OMPI_MCA_orte_tmpdir_base") != nullptr) return;
  const char* tmp = std::getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr && *tmp != '\0' ? tmp : "/tmp") + "/kiln-ompi.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return;  // no private directory: Open MPI's default, as before
  g_private_session_dir = pattern;
  setenv("OMPI_MCA_orte_tmpdir_base", g_private_session_dir.c_str(), 1);
}

}  // namespace

void initialize(int* argc, char*** argv) {
  static std::once_flag once;
  std::call_once(once, [&] {
    int already = 0;
    MPI_Initialized(&already);
    if (already) return;
    use_private_session_dir_if_singleton();
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

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::Sum: return "sum";
    case ReduceOp::Max: return "max";
    case ReduceOp::Min: return "min";
    case ReduceOp::Avg: return "avg";
  }
  return "?";
}

std::optional<Communicator> Communicator::split_optional(int color, int key) const {
  MPI_Comm comm = MPI_COMM_NULL;
  KILN_MPI_CHECK(MPI_Comm_split(impl_->comm, color < 0 ? MPI_UNDEFINED : color, key, &comm));
  if (comm == MPI_COMM_NULL) return std::nullopt;
  auto impl = std::make_shared<Impl>();
  impl->comm = comm;
  impl->owned = true;
  KILN_MPI_CHECK(MPI_Comm_rank(impl->comm, &impl->rank));
  KILN_MPI_CHECK(MPI_Comm_size(impl->comm, &impl->size));
  return Communicator(impl);
}

void Communicator::barrier() const { KILN_MPI_CHECK(MPI_Barrier(impl_->comm)); }

void Communicator::use_device(int device) const {
#if KILN_WITH_CUDA
  impl_->nccl_on(device, "use_device");
#else
  KILN_FAIL("Communicator::use_device({}): this build of Kiln has no CUDA (device buffers need NCCL)", device);
#endif
}

void Communicator::broadcast_bytes(void* data, std::size_t count, ScalarKind kind, int root) const {
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("broadcast", data)) return nccl->broadcast(data, count, kind, root);
#endif
  KILN_MPI_CHECK(MPI_Bcast(data, checked_count(count), mpi_movement_type(kind), root, impl_->comm));
}

void Communicator::all_reduce_raw(void* data, std::size_t count, ScalarKind kind, ReduceOp op) const {
  KILN_CHECK(!is_reduced_precision(kind), "Communicator::all_reduce on {}: reduce it through dist::all_reduce",
             element_type_name(kind));
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("all_reduce", data)) return nccl->all_reduce(data, count, kind, op);
#endif
  KILN_MPI_CHECK(MPI_Allreduce(MPI_IN_PLACE, data, checked_count(count), mpi_movement_type(kind), blocking_mpi_op(op),
                               impl_->comm));
}

void Communicator::all_gather_raw(const void* mine, std::size_t count, void* all, ScalarKind kind) const {
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("all_gather", mine, all)) return nccl->all_gather(mine, count, all, kind);
#endif
  KILN_MPI_CHECK(MPI_Allgather(mine, checked_count(count), mpi_movement_type(kind), all, checked_count(count),
                               mpi_movement_type(kind), impl_->comm));
}

void Communicator::send_raw(const void* data, std::size_t count, ScalarKind kind, int dest, int tag) const {
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("send", data, nullptr, false))
    return nccl->send_recv(data, count, dest, nullptr, 0, -1, kind);
#endif
  KILN_MPI_CHECK(MPI_Send(data, checked_count(count), mpi_movement_type(kind), dest, tag, impl_->comm));
}

void Communicator::recv_raw(void* data, std::size_t count, ScalarKind kind, int source, int tag) const {
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("recv", data, nullptr, false))
    return nccl->send_recv(nullptr, 0, -1, data, count, source, kind);
#endif
  KILN_MPI_CHECK(
      MPI_Recv(data, checked_count(count), mpi_movement_type(kind), source, tag, impl_->comm, MPI_STATUS_IGNORE));
}

void Communicator::send_recv_raw(const void* out, std::size_t out_count, int dest, void* in, std::size_t in_count,
                                 int source, ScalarKind kind, int tag) const {
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("send_recv", out, in, false))
    return nccl->send_recv(out, out_count, dest, in, in_count, source, kind);
#endif
  KILN_MPI_CHECK(MPI_Sendrecv(out, checked_count(out_count), mpi_movement_type(kind), dest, tag, in,
                              checked_count(in_count), mpi_movement_type(kind), source, tag, impl_->comm,
                              MPI_STATUS_IGNORE));
}

void Communicator::all_to_all_v_raw(const void* out, std::size_t out_size, std::span<const std::size_t> out_counts,
                                    void* in, std::size_t in_size, std::span<const std::size_t> in_counts,
                                    ScalarKind kind) const {
#if KILN_WITH_CUDA
  KILN_CHECK(impl_->device_channel("all_to_all_v", out, in, false) == nullptr,
             "Communicator::all_to_all_v: device buffers are not supported (host buffers only)");
#endif
  const auto n = static_cast<std::size_t>(impl_->size);
  KILN_CHECK(out_counts.size() == n && in_counts.size() == n,
             "Communicator::all_to_all_v: {} send and {} receive counts for a communicator of {} ranks",
             out_counts.size(), in_counts.size(), n);
  // MPI takes int counts and offsets: the blocks lie one after another in rank order.
  std::vector<int> send_counts(n), send_offsets(n), recv_counts(n), recv_offsets(n);
  std::size_t send_total = 0, recv_total = 0;
  for (std::size_t r = 0; r < n; ++r) {
    send_offsets[r] = checked_count(send_total);
    send_counts[r] = checked_count(out_counts[r]);
    send_total += out_counts[r];
    recv_offsets[r] = checked_count(recv_total);
    recv_counts[r] = checked_count(in_counts[r]);
    recv_total += in_counts[r];
  }
  KILN_CHECK(send_total <= out_size && recv_total <= in_size,
             "Communicator::all_to_all_v: the counts add up to {} to send and {} to receive, but the buffers hold {} "
             "and {} elements",
             send_total, recv_total, out_size, in_size);
  const MPI_Datatype type = mpi_movement_type(kind);
  KILN_MPI_CHECK(MPI_Alltoallv(out, send_counts.data(), send_offsets.data(), type, in, recv_counts.data(),
                               recv_offsets.data(), type, impl_->comm));
}

std::intptr_t Communicator::native_handle() const { return reinterpret_cast<std::intptr_t>(impl_->comm); }

namespace {

// Where this process's part of a ring broadcast comes from and goes to (ranks; source -1 at the
// root). Positions are relative to the root; positions 1..n-1 receive.
struct RingRoute {
  int source = -1;
  int destinations[3] = {-1, -1, -1};
};

RingRoute ring_route(int rank, int n, int root, BroadcastTopology topology) {
  const int me = (rank - root + n) % n;  // position relative to the root
  const bool modified = topology == BroadcastTopology::RingModified || topology == BroadcastTopology::TwoRingModified;
  const bool two_rings = topology == BroadcastTopology::TwoRing || topology == BroadcastTopology::TwoRingModified;
  // The modified variants serve position 1 directly from the root and chain the others from
  // position 2, so position 1 is never a relay.
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
  RingRoute r;
  int d = 0;
  if (me == 0) {
    if (modified && n > 1) r.destinations[d++] = to_rank(1);
    for (const Chain& chain : chains)
      if (chain.begin < chain.end) r.destinations[d++] = to_rank(chain.begin);
    return r;
  }
  if (modified && me == 1) {
    r.source = to_rank(0);
    return r;
  }
  for (const Chain& chain : chains) {
    if (me < chain.begin || me >= chain.end) continue;
    r.source = to_rank(me == chain.begin ? 0 : me - 1);
    if (me + 1 < chain.end) r.destinations[d++] = to_rank(me + 1);
  }
  return r;
}

}  // namespace

void Communicator::broadcast_topology_raw(void* data, std::size_t count, ScalarKind kind, int root,
                                          BroadcastTopology topology) const {
  if (impl_->size == 1) return;
#if KILN_WITH_CUDA
  // NCCL chooses its own rings and trees over the GPUs' links; the topologies are MPI's.
  if (auto* nccl = impl_->device_channel("broadcast", data)) return nccl->broadcast(data, count, kind, root);
#endif
  if (topology == BroadcastTopology::Tree) {
    broadcast_bytes(data, count, kind, root);
    return;
  }
  const RingRoute route = ring_route(impl_->rank, impl_->size, root, topology);
  const int c = checked_count(count);
  MPI_Datatype type = mpi_movement_type(kind);
  if (route.source >= 0) KILN_MPI_CHECK(MPI_Recv(data, c, type, route.source, 0, impl_->comm, MPI_STATUS_IGNORE));
  for (int dest : route.destinations)
    if (dest >= 0) KILN_MPI_CHECK(MPI_Send(data, c, type, dest, 0, impl_->comm));
}

struct PendingBroadcast::State {
  MPI_Comm comm = MPI_COMM_NULL;
  void* data = nullptr;
  int count = 0;
  MPI_Datatype type = MPI_BYTE;
  MPI_Request requests[3] = {MPI_REQUEST_NULL, MPI_REQUEST_NULL, MPI_REQUEST_NULL};
  int relay_to = -1;  // a ring relay forwards to this rank once its data is in
#if KILN_WITH_CUDA
  cudaEvent_t device_done = nullptr;  // a broadcast of device memory: NCCL's, done at this event
#endif
};

PendingBroadcast::PendingBroadcast() = default;
PendingBroadcast::PendingBroadcast(PendingBroadcast&&) noexcept = default;
PendingBroadcast& PendingBroadcast::operator=(PendingBroadcast&& other) noexcept {
  if (this != &other) {
    if (state_) {
      try {
        finish();
      } catch (...) {  // a failed MPI call: the run is ending with that error anyway
      }
    }
    state_ = std::move(other.state_);
  }
  return *this;
}
PendingBroadcast::~PendingBroadcast() {
  if (!state_) return;
  try {
    finish();
  } catch (...) {  // destructors do not throw; finish() explicitly to see the error
  }
}

void PendingBroadcast::finish() {
  if (!state_) return;
  std::unique_ptr<State> s = std::move(state_);
#if KILN_WITH_CUDA
  if (s->device_done != nullptr) {
    const cudaError_t waited = cudaEventSynchronize(s->device_done);
    cudaEventDestroy(s->device_done);
    KILN_CUDA_CHECK(waited);
    return;
  }
#endif
  KILN_MPI_CHECK(MPI_Waitall(3, s->requests, MPI_STATUSES_IGNORE));
  if (s->relay_to >= 0) KILN_MPI_CHECK(MPI_Send(s->data, s->count, s->type, s->relay_to, 0, s->comm));
}

bool PendingBroadcast::poll() {
  if (!state_) return true;
#if KILN_WITH_CUDA
  if (state_->device_done != nullptr) return cudaEventQuery(state_->device_done) == cudaSuccess;
#endif
  int done = 0;
  KILN_MPI_CHECK(MPI_Testall(3, state_->requests, &done, MPI_STATUSES_IGNORE));
  return done != 0;
}

PendingBroadcast Communicator::start_broadcast_raw(void* data, std::size_t count, ScalarKind kind, int root,
                                                   BroadcastTopology topology) const {
  PendingBroadcast pending;
  if (impl_->size == 1) return pending;
  auto s = std::make_unique<PendingBroadcast::State>();
#if KILN_WITH_CUDA
  if (auto* nccl = impl_->device_channel("start_broadcast", data)) {
    s->device_done = nccl->start_broadcast(data, count, kind, root);
    pending.state_ = std::move(s);
    return pending;
  }
#endif
  s->comm = impl_->comm;
  s->data = data;
  s->count = checked_count(count);
  s->type = mpi_movement_type(kind);
  if (topology == BroadcastTopology::Tree) {
    KILN_MPI_CHECK(MPI_Ibcast(data, s->count, s->type, root, impl_->comm, &s->requests[0]));
  } else {
    const RingRoute route = ring_route(impl_->rank, impl_->size, root, topology);
    if (route.source >= 0) {
      KILN_MPI_CHECK(MPI_Irecv(data, s->count, s->type, route.source, 0, impl_->comm, &s->requests[0]));
      s->relay_to = route.destinations[0];  // a receiver forwards to at most one
    } else {
      for (int i = 0; i < 3; ++i)
        if (route.destinations[i] >= 0)
          KILN_MPI_CHECK(MPI_Isend(data, s->count, s->type, route.destinations[i], 0, impl_->comm, &s->requests[i]));
    }
  }
  pending.state_ = std::move(s);
  return pending;
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
