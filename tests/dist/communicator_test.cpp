// The Communicator's calls, on host buffers (MPI) and on device buffers (NCCL, CUDA builds with a
// GPU per rank). Each test works on any world size: alone (ctest runs each test by itself) and
// under `mpirun -np 4` (CTest dist_mpirun_4). Values depend on the rank, so a message that went to
// the wrong place, or not at all, is seen.
#include "kiln/dist/communicator.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"

namespace kiln::dist {
namespace communicator_test {

// Where a test's buffers live: host vectors, or device memory from Kiln's CUDA allocator that is
// filled from and read back into host vectors.
class Buffers {
 public:
  explicit Buffers(bool on_device) : on_device_(on_device) {}
  ~Buffers() {
    for (void* p : owned_) backend_for(Device::cuda(device())).deallocate(p, device());
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  // A buffer holding `values`; read() gives its contents back.
  double* make(std::vector<double>& values) {
    if (!on_device_) return values.data();
    Backend& cuda = backend_for(Device::cuda(device()));
    void* p = cuda.allocate(sizeof(double) * values.size(), device());
    owned_.push_back(p);
    cuda.copy_from_host(p, values.data(), sizeof(double) * values.size(), device());
    return static_cast<double*>(p);
  }
  void read(const double* buffer, std::vector<double>& values) {
    if (!on_device_) return;
    backend_for(Device::cuda(device())).copy_to_host(values.data(), buffer, sizeof(double) * values.size(), device());
  }
  static int device() { return Communicator::world().rank() % std::max(1, kiln::device_count(DeviceKind::CUDA)); }

 private:
  bool on_device_;
  std::vector<void*> owned_;
};

class CommunicatorCalls : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    if (!GetParam()) return;
    // NCCL wants a GPU of its own per rank; every rank sees the same count, so all skip alike.
    const int gpus = kiln::device_count(DeviceKind::CUDA);
    if (gpus < Communicator::world().size())
      GTEST_SKIP() << gpus << " CUDA devices for " << Communicator::world().size() << " ranks";
  }
};

TEST_P(CommunicatorCalls, BroadcastFromEveryRoot) {
  Communicator world = Communicator::world();
  Buffers buffers(GetParam());
  for (int root = 0; root < world.size(); ++root) {
    std::vector<double> v(1000);
    std::iota(v.begin(), v.end(), 1000.0 * world.rank());
    double* b = buffers.make(v);
    world.broadcast(std::span<double>(b, v.size()), root);
    buffers.read(b, v);
    for (std::size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], 1000.0 * root + static_cast<double>(i)) << i;
  }
}

TEST_P(CommunicatorCalls, BroadcastOverEveryTopologyAndSplitPhase) {
  Communicator world = Communicator::world();
  Buffers buffers(GetParam());
  const BroadcastTopology topologies[] = {BroadcastTopology::Ring, BroadcastTopology::RingModified,
                                          BroadcastTopology::TwoRing, BroadcastTopology::TwoRingModified,
                                          BroadcastTopology::Tree};
  for (BroadcastTopology topology : topologies)
    for (bool split_phase : {false, true}) {
      const int root = world.size() - 1;
      std::vector<double> v(777, static_cast<double>(world.rank() + 1));
      double* b = buffers.make(v);
      if (split_phase) {
        PendingBroadcast pending = world.start_broadcast(std::span<double>(b, v.size()), root, topology);
        pending.finish();
      } else {
        world.broadcast(std::span<double>(b, v.size()), root, topology);
      }
      buffers.read(b, v);
      for (double x : v) ASSERT_EQ(x, static_cast<double>(root + 1));
    }
}

TEST_P(CommunicatorCalls, AllReduceSumMaxMin) {
  Communicator world = Communicator::world();
  Buffers buffers(GetParam());
  const int n = world.size();
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
    std::vector<double> v(513);
    for (std::size_t i = 0; i < v.size(); ++i) v[i] = static_cast<double>(i) + world.rank();
    double* b = buffers.make(v);
    world.all_reduce(std::span<double>(b, v.size()), op);
    buffers.read(b, v);
    for (std::size_t i = 0; i < v.size(); ++i) {
      const double first = static_cast<double>(i);
      const double want = op == ReduceOp::Sum   ? n * first + n * (n - 1) / 2.0
                          : op == ReduceOp::Max ? first + (n - 1)
                                                : first;
      ASSERT_EQ(v[i], want) << i;
    }
  }
}

TEST_P(CommunicatorCalls, AllGatherInRankOrder) {
  Communicator world = Communicator::world();
  Buffers buffers(GetParam());
  std::vector<double> mine(64, static_cast<double>(world.rank())), all(64 * world.size(), -1.0);
  const double* m = buffers.make(mine);
  double* a = buffers.make(all);
  world.all_gather(std::span<const double>(m, mine.size()), std::span<double>(a, all.size()));
  buffers.read(a, all);
  for (std::size_t i = 0; i < all.size(); ++i) ASSERT_EQ(all[i], static_cast<double>(i / 64)) << i;
}

TEST_P(CommunicatorCalls, RingOfSendRecvAndPlainSendThenRecv) {
  Communicator world = Communicator::world();
  Buffers buffers(GetParam());
  const int n = world.size(), me = world.rank(), next = (me + 1) % n, prev = (me + n - 1) % n;
  if (GetParam()) world.use_device(Buffers::device());  // point-to-point calls cannot make NCCL's
  std::vector<double> out(300, 10.0 * me), in(300, -1.0);
  const double* o = buffers.make(out);
  double* i = buffers.make(in);
  world.send_recv(std::span<const double>(o, out.size()), next, std::span<double>(i, in.size()), prev, 5);
  buffers.read(i, in);
  for (double x : in) ASSERT_EQ(x, 10.0 * prev);
  if (n < 2) return;
  // Rank 0 sends to rank 1 with plain send / recv.
  std::vector<double> message(50, me == 0 ? 42.0 : 0.0);
  double* msg = buffers.make(message);
  if (me == 0) world.send(std::span<const double>(msg, message.size()), 1, 9);
  if (me == 1) {
    world.recv(std::span<double>(msg, message.size()), 0, 9);
    buffers.read(msg, message);
    for (double x : message) ASSERT_EQ(x, 42.0);
  }
}

// all_to_all_v: rank r sends rank s (r + s) % 3 values (so some blocks are empty), each naming
// its sender, receiver and place; every rank checks what came from each sender, in rank order.
// Counts that do not fit the buffers are refused on every rank before anything moves.
TEST(CommunicatorAllToAllV, MovesUnevenBlocksInRankOrder) {
  Communicator world = Communicator::world();
  const int n = world.size(), me = world.rank();
  std::vector<std::size_t> out_counts(n), in_counts(n);
  std::vector<double> out;
  for (int s = 0; s < n; ++s) {
    out_counts[s] = (me + s) % 3;
    in_counts[s] = (s + me) % 3;
    for (std::size_t k = 0; k < out_counts[s]; ++k) out.push_back(1000.0 * me + 10.0 * s + k);
  }
  std::vector<double> in(std::accumulate(in_counts.begin(), in_counts.end(), std::size_t{0}), -1.0);
  world.all_to_all_v<double>(out, out_counts, in, in_counts);
  std::size_t at = 0;
  for (int r = 0; r < n; ++r)
    for (std::size_t k = 0; k < in_counts[r]; ++k) EXPECT_EQ(in[at++], 1000.0 * r + 10.0 * me + k) << "from " << r;
  std::vector<std::size_t> too_many(n, out.size() + 1);
  try {
    world.all_to_all_v<double>(out, too_many, in, in_counts);
    FAIL() << "counts beyond the send buffer were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Communicator::all_to_all_v: the counts add up to"), std::string::npos)
        << e.what();
  }
}

// Point-to-point on device buffers before the communicator has NCCL is refused, naming the call,
// on every rank and before anything is sent (so no rank is left waiting).
TEST_P(CommunicatorCalls, PointToPointOnDeviceNeedsNcclFirst) {
  if (!GetParam()) GTEST_SKIP() << "host buffers need no NCCL";
  Communicator world = Communicator::world();
  Buffers buffers(true);
  std::vector<double> v(8, 1.0);
  double* b = buffers.make(v);
  try {
    world.send(std::span<const double>(b, v.size()), 0);
    FAIL() << "a send on a device buffer before use_device() was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("Communicator::send on a device buffer"), std::string::npos) << e.what();
  }
}

// Ranks that share a GPU are refused by name on every rank, before NCCL is asked (it would fail
// with a bare "invalid usage"). Needs two or more ranks and a GPU: every rank asks for cuda:0.
TEST(CommunicatorNccl, RanksSharingAGpuAreRefusedByName) {
  Communicator world = Communicator::world();
  if (world.size() < 2 || kiln::device_count(DeviceKind::CUDA) < 1)
    GTEST_SKIP() << "needs two or more ranks (mpirun) and a CUDA device";
  try {
    world.use_device(0);
    FAIL() << "ranks sharing cuda:0 were accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("ranks 0 and 1 are both on the GPU at PCI"), std::string::npos) << e.what();
  }
  // Nothing was made: the communicator still works on host buffers.
  std::vector<double> v(4, static_cast<double>(world.rank()));
  world.all_reduce(std::span<double>(v), ReduceOp::Max);
  for (double x : v) ASSERT_EQ(x, static_cast<double>(world.size() - 1));
}

INSTANTIATE_TEST_SUITE_P(HostAndDevice, CommunicatorCalls, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& info) { return info.param ? "Device" : "Host"; });

}  // namespace communicator_test
}  // namespace kiln::dist
