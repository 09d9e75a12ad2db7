// dist's stream-ordered collectives (collectives.h) for every element type and reduction, on host
// buffers (MPI) and, where each rank has a GPU of its own, device buffers (NCCL). Each test works
// on any world size: alone and under `mpirun -np 2/4/8` (CTest dist_collectives_mpirun_N). Every
// rank's values are a known function of (rank, index), so each rank computes the whole result by
// itself (the single-process reference) and compares exactly: the host reductions of the 16- and
// 8-bit floats round once, as the reference does (NCCL's, over more than two GPUs, see tolerance()).
#include "kiln/dist/collectives.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <string>
#include <vector>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/scalar_types.h"

namespace kiln::dist {
namespace collectives_test {

using Bytes = std::vector<std::byte>;

void put(Bytes& b, ElementType t, std::size_t i, double v) {
  void* p = b.data() + i * element_size(t);
  const auto f = static_cast<float>(v);
  switch (t) {
    case ElementType::F64: std::memcpy(p, &v, 8); return;
    case ElementType::F32: std::memcpy(p, &f, 4); return;
    case ElementType::BF16: *static_cast<BFloat16*>(p) = BFloat16(f); return;
    case ElementType::F16: *static_cast<Half*>(p) = Half(f); return;
    case ElementType::F8E4M3: *static_cast<Float8E4M3*>(p) = Float8E4M3(f); return;
    case ElementType::F8E5M2: *static_cast<Float8E5M2*>(p) = Float8E5M2(f); return;
    case ElementType::I64: *static_cast<std::int64_t*>(p) = static_cast<std::int64_t>(v); return;
    case ElementType::I32: *static_cast<std::int32_t*>(p) = static_cast<std::int32_t>(v); return;
    case ElementType::U8: *static_cast<std::uint8_t*>(p) = static_cast<std::uint8_t>(v); return;
  }
}

double get(const Bytes& b, ElementType t, std::size_t i) {
  const void* p = b.data() + i * element_size(t);
  switch (t) {
    case ElementType::F64: return *static_cast<const double*>(p);
    case ElementType::F32: return *static_cast<const float*>(p);
    case ElementType::BF16: return static_cast<float>(*static_cast<const BFloat16*>(p));
    case ElementType::F16: return static_cast<float>(*static_cast<const Half*>(p));
    case ElementType::F8E4M3: return static_cast<float>(*static_cast<const Float8E4M3*>(p));
    case ElementType::F8E5M2: return static_cast<float>(*static_cast<const Float8E5M2*>(p));
    case ElementType::I64: return static_cast<double>(*static_cast<const std::int64_t*>(p));
    case ElementType::I32: return *static_cast<const std::int32_t*>(p);
    case ElementType::U8: return *static_cast<const std::uint8_t*>(p);
  }
  return 0;
}

// Rounds v to the type as storing it does.
double rounded(ElementType t, double v) {
  Bytes b(element_size(t));
  put(b, t, 0, v);
  return get(b, t, 0);
}

// Rank r's element i: small integers (exact in every type), negative ones for the signed types.
double value(ElementType t, int rank, std::size_t i) {
  if (t == ElementType::U8) return static_cast<double>((static_cast<std::size_t>(rank) + i) % 5);
  return static_cast<double>((static_cast<std::size_t>(rank) * 7 + i * 3) % 11) - 5.0;
}

// The single-process reference of op over every rank's element i, in the type's arithmetic: f64 in
// double; f32 and the narrower floats in f32, rounded to the type once; integers exactly
// (truncating Avg).
double reference(ElementType t, ReduceOp op, int ranks, std::size_t i) {
  std::vector<double> v;
  for (int r = 0; r < ranks; ++r) v.push_back(value(t, r, i));
  if (op == ReduceOp::Max) return *std::max_element(v.begin(), v.end());
  if (op == ReduceOp::Min) return *std::min_element(v.begin(), v.end());
  const double sum = std::accumulate(v.begin(), v.end(), 0.0);  // exact: small integers
  if (op == ReduceOp::Sum) return rounded(t, sum);
  if (t == ElementType::F64) return sum / ranks;
  if (is_integer(t)) return static_cast<double>(static_cast<std::int64_t>(sum) / ranks);
  return rounded(t, static_cast<double>(static_cast<float>(sum) / static_cast<float>(ranks)));
}

// How far a result may be from the reference. The host reduces the 16- and 8-bit floats in f32 and
// rounds once: exactly the reference. NCCL rounds to the element type after each hop of its ring,
// so over more than two GPUs a sum or average may be off by one spacing of the type (at the
// largest partial sum, |5| per rank) per extra hop; max and min, and every other type, are exact.
double tolerance(ElementType t, ReduceOp op, int ranks, bool on_device) {
  if (!on_device || ranks <= 2 || !is_reduced_precision(t) || op == ReduceOp::Max || op == ReduceOp::Min) return 0;
  const int mantissa_bits = t == ElementType::BF16 ? 7 : t == ElementType::F16 ? 10 : t == ElementType::F8E4M3 ? 3 : 2;
  const double spacing = std::ldexp(1.0, static_cast<int>(std::floor(std::log2(5.0 * ranks))) - mantissa_bits);
  return (ranks - 2) * spacing;
}

Bytes filled(ElementType t, int rank, std::size_t n) {
  Bytes b(n * element_size(t));
  for (std::size_t i = 0; i < n; ++i) put(b, t, i, value(t, rank, i));
  return b;
}

// Where a test's buffers live: host memory, or device memory of Kiln's CUDA allocator filled from
// and read back into host bytes. Device work runs on a side stream, so the ordering against the
// compute stream (where the copies run) is part of what is tested.
class Buffers {
 public:
  explicit Buffers(bool on_device) : device_(on_device ? Device::cuda(gpu_index()) : Device::cpu()) {}
  ~Buffers() {
    for (void* p : owned_) backend_for(device_).deallocate(p, device_.index);
  }
  Buffers(const Buffers&) = delete;
  Buffers& operator=(const Buffers&) = delete;

  BufferView make(Bytes& host, ElementType t) {
    BufferView v{host.data(), host.size() / element_size(t), t, device_};
    if (device_.is_cpu()) return v;
    Backend& b = backend_for(device_);
    v.data = b.allocate(std::max<std::size_t>(host.size(), 1), device_.index);
    owned_.push_back(v.data);
    b.copy_from_host(v.data, host.data(), host.size(), device_.index);
    return v;
  }
  // Waits for `work` and brings `view`'s contents back into `host`.
  void read(Work& work, const BufferView& view, Bytes& host) {
    work.wait();
    if (device_.is_cpu()) return;
    backend_for(device_).copy_to_host(host.data(), view.data, host.size(), device_.index);
  }
  Stream stream() const { return device_.is_cpu() ? Stream::current(device_) : Stream::from_pool(device_); }
  static int gpu_index() { return Communicator::world().rank() % std::max(1, device_count(DeviceKind::CUDA)); }

 private:
  Device device_;
  std::vector<void*> owned_;
};

constexpr ElementType kTypes[] = {ElementType::F64, ElementType::F32,    ElementType::BF16,
                                  ElementType::F16, ElementType::F8E4M3, ElementType::F8E5M2,
                                  ElementType::I64, ElementType::I32,    ElementType::U8};
constexpr ReduceOp kOps[] = {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min, ReduceOp::Avg};

class Collectives : public ::testing::TestWithParam<std::tuple<ElementType, bool>> {
 protected:
  void SetUp() override {
    if (!on_device()) return;
    const int gpus = device_count(DeviceKind::CUDA);
    if (gpus < Communicator::world().size())
      GTEST_SKIP() << gpus << " CUDA devices for " << Communicator::world().size() << " ranks (NCCL needs one each)";
  }
  ElementType type() const { return std::get<0>(GetParam()); }
  bool on_device() const { return std::get<1>(GetParam()); }
};

TEST_P(Collectives, AllReduceEveryOp) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const std::size_t n = 37;
  for (ReduceOp op : kOps) {
    Buffers buffers(on_device());
    Bytes host = filled(t, world.rank(), n);
    BufferView data = buffers.make(host, t);
    Work work = all_reduce(world, data, op, buffers.stream());
    buffers.read(work, data, host);
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_NEAR(get(host, t, i), reference(t, op, world.size(), i), tolerance(t, op, world.size(), on_device()))
          << reduce_op_name(op) << " element " << i;
  }
}

TEST_P(Collectives, ReduceScatterEveryOp) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const std::size_t block = 13, n = block * static_cast<std::size_t>(world.size());
  for (ReduceOp op : kOps) {
    Buffers buffers(on_device());
    Bytes in = filled(t, world.rank(), n), out(block * element_size(t));
    BufferView input = buffers.make(in, t), output = buffers.make(out, t);
    Work work = reduce_scatter(world, input, output, op, buffers.stream());
    buffers.read(work, output, out);
    for (std::size_t i = 0; i < block; ++i)
      ASSERT_NEAR(get(out, t, i), reference(t, op, world.size(), static_cast<std::size_t>(world.rank()) * block + i),
                  tolerance(t, op, world.size(), on_device()))
          << reduce_op_name(op) << " element " << i;
  }
}

TEST_P(Collectives, AllGatherIntoAFlatBufferInPlaceAndPerRank) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const auto ranks = static_cast<std::size_t>(world.size());
  const std::size_t n = 11;
  auto check = [&](const Bytes& all, std::size_t at_rank, std::size_t r) {
    for (std::size_t i = 0; i < n; ++i)
      ASSERT_EQ(get(all, t, at_rank * n + i), value(t, static_cast<int>(r), i)) << "block " << r << " element " << i;
  };
  {  // separate input
    Buffers buffers(on_device());
    Bytes in = filled(t, world.rank(), n), out(n * ranks * element_size(t));
    BufferView input = buffers.make(in, t), output = buffers.make(out, t);
    Work work = all_gather(world, input, output, buffers.stream());
    buffers.read(work, output, out);
    for (std::size_t r = 0; r < ranks; ++r) check(out, r, r);
  }
  {  // the input is this rank's block of the output (a flat buffer's shard)
    Buffers buffers(on_device());
    Bytes out(n * ranks * element_size(t));
    const Bytes mine = filled(t, world.rank(), n);
    std::copy(mine.begin(), mine.end(), out.begin() + static_cast<std::ptrdiff_t>(world.rank() * n * element_size(t)));
    BufferView output = buffers.make(out, t);
    ConstBufferView shard{static_cast<std::byte*>(output.data) + world.rank() * n * element_size(t), n, t,
                          output.device};
    Work work = all_gather(world, shard, output, buffers.stream());
    buffers.read(work, output, out);
    for (std::size_t r = 0; r < ranks; ++r) check(out, r, r);
  }
  {  // one output per rank
    Buffers buffers(on_device());
    Bytes in = filled(t, world.rank(), n);
    std::vector<Bytes> outs(ranks, Bytes(n * element_size(t)));
    std::vector<BufferView> views;
    for (auto& o : outs) views.push_back(buffers.make(o, t));
    Work work = all_gather(world, buffers.make(in, t), std::span<const BufferView>(views), buffers.stream());
    for (std::size_t r = 0; r < ranks; ++r) {
      buffers.read(work, views[r], outs[r]);
      check(outs[r], 0, r);
    }
  }
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const std::size_t n = 29;
  for (int root = 0; root < world.size(); ++root) {
    Buffers buffers(on_device());
    Bytes host = filled(t, world.rank(), n);
    BufferView data = buffers.make(host, t);
    Work work = broadcast(world, data, root, buffers.stream());
    buffers.read(work, data, host);
    for (std::size_t i = 0; i < n; ++i) ASSERT_EQ(get(host, t, i), value(t, root, i)) << "root " << root;
  }
}

// Rank a sends (a + b) % 3 elements to rank b (some pairs send nothing); element j of that message
// is value(b, 100 * a + j): it says who sent it and where it belongs.
TEST_P(Collectives, AllToAllWithUnevenSplits) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const int me = world.rank(), ranks = world.size();
  auto split = [](int from, int to) { return static_cast<std::size_t>((from + to) % 3); };
  std::vector<std::size_t> send(static_cast<std::size_t>(ranks)), receive(static_cast<std::size_t>(ranks));
  for (int r = 0; r < ranks; ++r) {
    send[static_cast<std::size_t>(r)] = split(me, r);
    receive[static_cast<std::size_t>(r)] = split(r, me);
  }
  const std::size_t sent = std::accumulate(send.begin(), send.end(), std::size_t{0});
  const std::size_t received = std::accumulate(receive.begin(), receive.end(), std::size_t{0});
  Bytes in(sent * element_size(t)), out(received * element_size(t));
  std::size_t at = 0;
  for (int r = 0; r < ranks; ++r)
    for (std::size_t j = 0; j < split(me, r); ++j)
      put(in, t, at++, value(t, r, static_cast<std::size_t>(100 * me) + j));
  Buffers buffers(on_device());
  BufferView input = buffers.make(in, t), output = buffers.make(out, t);
  Work work = all_to_all(world, input, send, output, receive, buffers.stream());
  buffers.read(work, output, out);
  at = 0;
  for (int r = 0; r < ranks; ++r)
    for (std::size_t j = 0; j < split(r, me); ++j)
      ASSERT_EQ(get(out, t, at++), value(t, me, static_cast<std::size_t>(100 * r) + j)) << "from rank " << r;
}

// A ring as a pipeline uses it: each rank sends two messages to the next and receives two from the
// previous, all in one batch.
TEST_P(Collectives, BatchedSendRecvAroundARing) {
  const Communicator world = Communicator::world();
  const ElementType t = type();
  const int me = world.rank(), ranks = world.size();
  const int next = (me + 1) % ranks, previous = (me + ranks - 1) % ranks;
  // Point-to-point calls cannot make NCCL's communicator (every rank must join that), so a group
  // opts in first; without it they are refused (CommunicatorCalls.PointToPointOnDeviceNeedsNcclFirst).
  if (on_device()) world.use_device(Buffers::gpu_index());
  const std::size_t n = 17;
  Bytes first = filled(t, me, n), second = filled(t, me + 1, n);
  Bytes got_first(n * element_size(t)), got_second(n * element_size(t));
  Buffers buffers(on_device());
  BufferView a = buffers.make(first, t), b = buffers.make(second, t);
  BufferView ra = buffers.make(got_first, t), rb = buffers.make(got_second, t);
  const PointToPoint ops[] = {PointToPoint::send(a, next, 1), PointToPoint::send(b, next, 2),
                              PointToPoint::recv(ra, previous, 1), PointToPoint::recv(rb, previous, 2)};
  Work work = batch_send_recv(world, ops, buffers.stream());
  buffers.read(work, ra, got_first);
  buffers.read(work, rb, got_second);
  for (std::size_t i = 0; i < n; ++i) {
    ASSERT_EQ(get(got_first, t, i), value(t, previous, i));
    ASSERT_EQ(get(got_second, t, i), value(t, previous + 1, i));
  }
}

std::string case_name(const ::testing::TestParamInfo<std::tuple<ElementType, bool>>& info) {
  return std::string(element_type_name(std::get<0>(info.param))) + (std::get<1>(info.param) ? "_device" : "_host");
}

INSTANTIATE_TEST_SUITE_P(AllTypes, Collectives, ::testing::Combine(::testing::ValuesIn(kTypes), ::testing::Bool()),
                         case_name);

TEST(CollectivesWork, CompletesAndThenHasItsEvent) {
  const Communicator world = Communicator::world();
  std::vector<double> v(1000, 1.0);
  Work work = all_reduce(world, BufferView{v.data(), v.size(), ElementType::F64, Device::cpu()}, ReduceOp::Sum,
                         Stream::current(Device::cpu()));
  while (!work.is_completed()) {
  }
  EXPECT_TRUE(work.event().query());
  work.wait();  // again: nothing left to do
  EXPECT_EQ(v[999], world.size());
  Work done;  // a default Work is complete
  EXPECT_TRUE(done.is_completed());
}

}  // namespace collectives_test
}  // namespace kiln::dist
