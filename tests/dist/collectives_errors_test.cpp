// Bad input to the collectives is refused with a message naming the call and the operands: what
// one rank can see (sizes, types, devices, roots, splits), and, with validation on, arguments the
// ranks disagree on (every rank refuses alike, so none is left waiting in the collective).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kiln/dist/collectives.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {
namespace collectives_errors_test {

// Runs `call` and expects a kiln::Error whose message contains every one of `parts`.
template <class F>
void expect_refused(F&& call, std::initializer_list<std::string> parts) {
  try {
    call();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string message = e.what();
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

const Stream host_stream() { return Stream::current(Device::cpu()); }

TEST(CollectivesRefuse, ReduceScatterOfTheWrongSize) {
  const Communicator world = Communicator::world();
  std::vector<float> in(5 * static_cast<std::size_t>(world.size()) + 1), out(5);
  expect_refused(
      [&] {
        reduce_scatter(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()},
                       BufferView{out.data(), out.size(), ElementType::F32, Device::cpu()}, ReduceOp::Sum,
                       host_stream());
      },
      {"dist::reduce_scatter", "input (", "x f32 on cpu) must hold group size"});
}

TEST(CollectivesRefuse, AllGatherOfMismatchedTypesAndSizes) {
  const Communicator world = Communicator::world();
  std::vector<float> in(4);
  std::vector<std::uint16_t> out(4 * static_cast<std::size_t>(world.size()));
  expect_refused(
      [&] {
        all_gather(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()},
                   BufferView{out.data(), out.size(), ElementType::BF16, Device::cpu()}, host_stream());
      },
      {"dist::all_gather", "input is f32 but output is bf16"});
  std::vector<float> small(3);
  expect_refused(
      [&] {
        all_gather(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()},
                   BufferView{small.data(), small.size(), ElementType::F32, Device::cpu()}, host_stream());
      },
      {"dist::all_gather", "output (3 x f32 on cpu) must hold group size"});
  std::vector<BufferView> too_few;
  expect_refused(
      [&] {
        all_gather(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()},
                   std::span<const BufferView>(too_few), host_stream());
      },
      {"dist::all_gather", "0 output buffers for a group of"});
}

TEST(CollectivesRefuse, BuffersOnDifferentDevicesOrAnotherDevicesStream) {
  const Communicator world = Communicator::world();
  std::vector<float> in(4), out(4 * static_cast<std::size_t>(world.size()));
  // The device is only named, never touched: the check comes first.
  expect_refused(
      [&] {
        all_gather(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()},
                   BufferView{out.data(), out.size(), ElementType::F32, Device::cuda(0)}, host_stream());
      },
      {"dist::all_gather", "input is on cpu but output is on cuda:0"});
  expect_refused(
      [&] {
        all_reduce(world, BufferView{in.data(), in.size(), ElementType::F32, Device::cpu()}, ReduceOp::Sum,
                   Stream{Device::cuda(0), nullptr});
      },
      {"dist::all_reduce", "data is on cpu but the stream is on cuda:0"});
}

TEST(CollectivesRefuse, NullDataRootsAndPeersOutsideTheGroup) {
  const Communicator world = Communicator::world();
  expect_refused(
      [&] {
        all_reduce(world, BufferView{nullptr, 3, ElementType::I64, Device::cpu()}, ReduceOp::Max, host_stream());
      },
      {"dist::all_reduce", "data (3 x i64 on cpu) has no memory"});
  std::vector<double> v(3);
  const BufferView view{v.data(), v.size(), ElementType::F64, Device::cpu()};
  expect_refused([&] { broadcast(world, view, world.size(), host_stream()); },
                 {"dist::broadcast", "root", "is not a rank of the group"});
  const PointToPoint ops[] = {PointToPoint::send(view, -1)};
  expect_refused([&] { batch_send_recv(world, ops, host_stream()); },
                 {"dist::batch_send_recv", "ops[0] (a send of 3 x f64 on cpu to rank -1)'s peer -1 is not a rank"});
}

TEST(CollectivesRefuse, AllToAllSplitsThatDoNotAddUp) {
  const Communicator world = Communicator::world();
  const auto n = static_cast<std::size_t>(world.size());
  std::vector<float> in(n), out(n);
  const ConstBufferView input{in.data(), n, ElementType::F32, Device::cpu()};
  const BufferView output{out.data(), n, ElementType::F32, Device::cpu()};
  std::vector<std::size_t> ones(n, 1), twos(n, 2), short_list(n + 1, 0);
  expect_refused([&] { all_to_all(world, input, twos, output, ones, host_stream()); },
                 {"dist::all_to_all", "input_splits add up to", "but input is"});
  expect_refused([&] { all_to_all(world, input, short_list, output, ones, host_stream()); },
                 {"dist::all_to_all", "input_splits and", "one per rank each"});
}

TEST(CollectivesRefuse, TensorsThatAreNotContiguousOrBoolReductions) {
  const Communicator world = Communicator::world();
  Tensor m = Tensor::zeros({4, 6}, DType::F32);
  expect_refused([&] { all_reduce(world, m.t(), ReduceOp::Sum); },
                 {"dist::all_reduce", "tensor (", "must be contiguous"});
  Tensor flags = Tensor::zeros({4}, DType::Bool);
  expect_refused([&] { all_reduce(world, flags, ReduceOp::Sum); },
                 {"dist::all_reduce", "bool tensors cannot be reduced"});
}

// ---- across ranks (validation mode) ---------------------------------------------------------

class ValidationOn : public ::testing::Test {
 protected:
  void SetUp() override {
    if (Communicator::world().size() < 2) GTEST_SKIP() << "ranks can disagree only in a world of 2 or more";
    set_validation(true);
  }
  void TearDown() override { set_validation(false); }
};

TEST_F(ValidationOn, CountsThatDifferAcrossRanks) {
  const Communicator world = Communicator::world();
  std::vector<float> v(world.rank() == 0 ? 4 : 5);
  expect_refused(
      [&] {
        all_reduce(world, BufferView{v.data(), v.size(), ElementType::F32, Device::cpu()}, ReduceOp::Sum,
                   host_stream());
      },
      {"dist::all_reduce: ranks disagree on the count: rank 0 passes 4 elements but rank 1 passes 5"});
}

TEST_F(ValidationOn, TypesOpsAndRootsThatDifferAcrossRanks) {
  const Communicator world = Communicator::world();
  std::vector<std::int64_t> v(4);
  const ElementType type = world.rank() == 0 ? ElementType::I64 : ElementType::F64;
  expect_refused(
      [&] {
        broadcast(world, BufferView{v.data(), 4, type, Device::cpu()}, 0, host_stream());
      },
      {"dist::broadcast: ranks disagree on the element type: rank 0 passes i64 but rank 1 passes f64"});
  const ReduceOp op = world.rank() == 0 ? ReduceOp::Sum : ReduceOp::Max;
  expect_refused(
      [&] {
        all_reduce(world, BufferView{v.data(), 4, ElementType::I64, Device::cpu()}, op, host_stream());
      },
      {"dist::all_reduce: ranks disagree on the reduction: rank 0 passes sum but rank 1 passes max"});
  expect_refused(
      [&] {
        broadcast(world, BufferView{v.data(), 4, ElementType::I64, Device::cpu()}, world.rank() == 0 ? 0 : 1,
                  host_stream());
      },
      {"dist::broadcast: ranks disagree on the root: rank 0 passes 0 but rank 1 passes 1"});
}

TEST_F(ValidationOn, AllToAllSplitsThatDoNotMatchTheirPeers) {
  const Communicator world = Communicator::world();
  const auto n = static_cast<std::size_t>(world.size());
  // Every rank sends one element to every rank, but rank 0 expects two from rank 1.
  std::vector<std::size_t> send(n, 1), receive(n, 1);
  if (world.rank() == 0) receive[1] = 2;
  std::vector<float> in(n), out(n + (world.rank() == 0 ? 1 : 0));
  expect_refused(
      [&] {
        all_to_all(world, ConstBufferView{in.data(), in.size(), ElementType::F32, Device::cpu()}, send,
                   BufferView{out.data(), out.size(), ElementType::F32, Device::cpu()}, receive, host_stream());
      },
      {"dist::all_to_all: rank 1 sends 1 elements to rank 0 (input_splits[0]) but rank 0 expects 2 from it"});
}

TEST_F(ValidationOn, AgreeingCallsPass) {
  const Communicator world = Communicator::world();
  std::vector<float> v(8, 1.0f);
  Work work =
      all_reduce(world, BufferView{v.data(), v.size(), ElementType::F32, Device::cpu()}, ReduceOp::Avg, host_stream());
  work.wait();
  EXPECT_EQ(v[7], 1.0f);
}

}  // namespace collectives_errors_test
}  // namespace kiln::dist
