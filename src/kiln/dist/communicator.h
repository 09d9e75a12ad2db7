#pragma once
// Communicator: a group of processes (MPI today; NCCL for GPU buffers behind the same calls).
// HPL, HPCG and the training stack all talk to each other through this, never MPI directly.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <type_traits>

#include "kiln/dist/element_type.h"

namespace kiln::dist {

// The element types of the Communicator's typed calls (its templates map C++ types onto them).
using ScalarKind = ElementType;
// Avg is the sum divided by the group's size (truncating for integers); the collectives of
// collectives.h take it, the Communicator's blocking all_reduce refuses it.
enum class ReduceOp : std::uint8_t { Sum, Max, Min, Avg };
std::string_view reduce_op_name(ReduceOp op);

// How a broadcast travels (HPL's BCAST topologies). Tree is MPI's own (MPI_Bcast: binomial tree or
// scatter + all-gather for long messages). The rings are point-to-point chains, so the first
// receivers get the data, and can start working, before the root has finished sending: Ring goes
// root -> root+1 -> ... ; TwoRing splits the others into two halves each served by its own chain;
// the Modified variants first send to root+1 alone (the next panel's owner in HPL) and ring the rest.
enum class BroadcastTopology : std::uint8_t { Ring, RingModified, TwoRing, TwoRingModified, Tree };

template <class T>
constexpr ScalarKind scalar_kind_of() {
  if constexpr (std::is_same_v<T, double>)
    return ScalarKind::F64;
  else if constexpr (std::is_same_v<T, float>)
    return ScalarKind::F32;
  else if constexpr (std::is_same_v<T, std::int64_t>)
    return ScalarKind::I64;
  else if constexpr (std::is_same_v<T, std::int32_t>)
    return ScalarKind::I32;
  else {
    static_assert(sizeof(T) == 1, "unsupported element type for a collective");
    return ScalarKind::U8;
  }
}

// Starts MPI once per process (thread level FUNNELED) and stops it at exit. Safe to call without
// mpirun: the process is then a world of one.
void initialize(int* argc = nullptr, char*** argv = nullptr);
bool is_initialized();

// A broadcast started with Communicator::start_broadcast and not yet complete. Until finish()
// returns, the root must not change the data and a receiver must not read it. finish() waits for
// this process's part: a receiver's data has arrived (a ring relay forwards it then), a root's
// sends are done. Destroying an unfinished one finishes it.
class PendingBroadcast {
 public:
  PendingBroadcast();
  ~PendingBroadcast();
  PendingBroadcast(PendingBroadcast&&) noexcept;
  PendingBroadcast& operator=(PendingBroadcast&&) noexcept;
  void finish();
  // Lets the transfer move on without waiting (MPI makes progress only inside MPI calls): true
  // once this process's part is done but for a ring relay's forward, which finish() sends.
  bool poll();
  bool active() const { return state_ != nullptr; }

 private:
  friend class Communicator;
  struct State;
  std::unique_ptr<State> state_;
};

class Communicator {
 public:
  static Communicator world();  // initializes MPI on first use

  int rank() const;
  int size() const;
  // Processes with the same color form a new communicator, ordered by key (MPI_Comm_split).
  Communicator split(int color, int key) const;
  // The same, where a negative color leaves this process out of every new communicator
  // (MPI_UNDEFINED): it gets no communicator back.
  std::optional<Communicator> split_optional(int color, int key) const;
  void barrier() const;
  // Collective: makes this communicator's NCCL communicator on cuda:`device` now. Calls on
  // device buffers go through NCCL (CUDA builds); the first collective one (broadcast,
  // all-reduce, all-gather) makes it too, but point-to-point calls (send, recv, send_recv) on
  // device buffers need it made first, and are refused otherwise.
  void use_device(int device) const;

  template <class T>
  void broadcast(std::span<T> data, int root) const {
    broadcast_bytes(data.data(), data.size(), scalar_kind_of<std::remove_const_t<T>>(), root);
  }
  template <class T>
  void all_reduce(std::span<T> data, ReduceOp op = ReduceOp::Sum) const {
    all_reduce_raw(data.data(), data.size(), scalar_kind_of<T>(), op);
  }
  template <class T>
  T all_reduce_value(T value, ReduceOp op = ReduceOp::Sum) const {
    all_reduce_raw(&value, 1, scalar_kind_of<T>(), op);
    return value;
  }
  // Every rank contributes `mine` (same size on all); `all` has size() * mine.size() elements.
  template <class T>
  void all_gather(std::span<const T> mine, std::span<T> all) const {
    all_gather_raw(mine.data(), mine.size(), all.data(), scalar_kind_of<T>());
  }
  template <class T>
  void send(std::span<const T> data, int dest, int tag = 0) const {
    send_raw(data.data(), data.size(), scalar_kind_of<T>(), dest, tag);
  }
  template <class T>
  void recv(std::span<T> data, int source, int tag = 0) const {
    recv_raw(data.data(), data.size(), scalar_kind_of<T>(), source, tag);
  }
  // Every rank sends out_counts[r] elements of `out` to rank r (the blocks one after another in rank
  // order) and receives in_counts[r] from rank r into `in` (likewise); a count may be 0. Each pair's
  // counts must agree (rank a's out_counts[b] is rank b's in_counts[a]): MPI_Alltoallv. Host
  // buffers only (PME's transposes).
  template <class T>
  void all_to_all_v(std::span<const T> out, std::span<const std::size_t> out_counts, std::span<T> in,
                    std::span<const std::size_t> in_counts) const {
    all_to_all_v_raw(out.data(), out.size(), out_counts, in.data(), in.size(), in_counts, scalar_kind_of<T>());
  }
  // Send to `dest` and receive from `source` at once (no deadlock in rings and halo exchanges).
  template <class T>
  void send_recv(std::span<const T> out, int dest, std::span<T> in, int source, int tag = 0) const {
    send_recv_raw(out.data(), out.size(), dest, in.data(), in.size(), source, scalar_kind_of<T>(), tag);
  }

  // The underlying MPI_Comm as an integer handle (for libraries that take one).
  std::intptr_t native_handle() const;

  // Broadcast along a chosen topology (see BroadcastTopology); Tree is the same as broadcast().
  template <class T>
  void broadcast(std::span<T> data, int root, BroadcastTopology topology) const {
    broadcast_topology_raw(data.data(), data.size(), scalar_kind_of<std::remove_const_t<T>>(), root, topology);
  }
  // The same broadcast, split in two: the root's sends and the receivers' receives are posted now
  // and complete in PendingBroadcast::finish(), so each process can work in between. HPL's
  // look-ahead sends the next panel as soon as it is factored while the others are still updating.
  template <class T>
  PendingBroadcast start_broadcast(std::span<T> data, int root, BroadcastTopology topology) const {
    return start_broadcast_raw(data.data(), data.size(), scalar_kind_of<std::remove_const_t<T>>(), root, topology);
  }
  // The processes of this communicator that share memory with this one (one node), ordered by rank.
  Communicator split_node_local() const;

 private:
  struct Impl;
  friend struct CommunicatorAccess;  // the collectives (collectives.cpp) reach the MPI and NCCL handles
  explicit Communicator(std::shared_ptr<Impl> impl);
  void broadcast_bytes(void* data, std::size_t count, ScalarKind kind, int root) const;
  void all_reduce_raw(void* data, std::size_t count, ScalarKind kind, ReduceOp op) const;
  void all_gather_raw(const void* mine, std::size_t count, void* all, ScalarKind kind) const;
  void send_raw(const void* data, std::size_t count, ScalarKind kind, int dest, int tag) const;
  void recv_raw(void* data, std::size_t count, ScalarKind kind, int source, int tag) const;
  void send_recv_raw(const void* out, std::size_t out_count, int dest, void* in, std::size_t in_count, int source,
                     ScalarKind kind, int tag) const;
  void all_to_all_v_raw(const void* out, std::size_t out_size, std::span<const std::size_t> out_counts, void* in,
                        std::size_t in_size, std::span<const std::size_t> in_counts, ScalarKind kind) const;
  void broadcast_topology_raw(void* data, std::size_t count, ScalarKind kind, int root,
                              BroadcastTopology topology) const;
  PendingBroadcast start_broadcast_raw(void* data, std::size_t count, ScalarKind kind, int root,
                                       BroadcastTopology topology) const;
  std::shared_ptr<Impl> impl_;
};

}  // namespace kiln::dist
