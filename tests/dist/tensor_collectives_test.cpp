// The Tensor-level collectives (tensor/collectives.h) on CPU tensors, on any world size: DType to
// element type, rows as all-to-all splits, one tensor per rank for all-gather.
#include <gtest/gtest.h>

#include <vector>

#include "kiln/tensor/collectives.h"
#include "kiln/tensor/tensor.h"

namespace kiln::dist {
namespace tensor_collectives_test {

TEST(TensorCollectives, AllReduceAvgOfBf16RoundsOnce) {
  const Communicator world = Communicator::world();
  // Rank r holds r + 0.5 everywhere: the mean, (n - 1) / 2 + 0.5 = n / 2, is exact in bf16.
  Tensor t = Tensor::full({3, 5}, world.rank() + 0.5, DType::BF16);
  all_reduce(world, t, ReduceOp::Avg).wait();
  for (float v : t.to_vector<float>()) EXPECT_EQ(v, world.size() / 2.0f);
}

TEST(TensorCollectives, AllGatherIntoATensorPerRankAndBroadcast) {
  const Communicator world = Communicator::world();
  Tensor mine = Tensor::full({4}, world.rank(), DType::I64);
  std::vector<Tensor> all;
  for (int r = 0; r < world.size(); ++r) all.push_back(Tensor::zeros({2, 2}, DType::I64));
  all_gather(world, mine, all, Stream::current(Device::cpu())).wait();
  for (int r = 0; r < world.size(); ++r)
    for (std::int64_t v : all[static_cast<std::size_t>(r)].to_vector<std::int64_t>()) EXPECT_EQ(v, r);
  Tensor flat = Tensor::zeros({world.size(), 4}, DType::I64);
  all_gather(world, mine, flat).wait();
  EXPECT_EQ(flat.to_vector<std::int64_t>().back(), world.size() - 1);
  Tensor b = Tensor::full({6}, world.rank() * 10, DType::F16);
  broadcast(world, b, world.size() - 1).wait();
  EXPECT_EQ(b.to_vector<float>().front(), (world.size() - 1) * 10.0f);
}

TEST(TensorCollectives, ReduceScatterAndAllToAllByRows) {
  const Communicator world = Communicator::world();
  const int n = world.size(), me = world.rank();
  Tensor grads = Tensor::full({n, 3}, 1.0, DType::F32);
  Tensor shard = Tensor::zeros({3}, DType::F32);
  reduce_scatter(world, grads, shard).wait();
  for (float v : shard.to_vector<float>()) EXPECT_EQ(v, static_cast<float>(n));
  // Rank a sends a + 1 rows of width 2 to every rank; row values say who sent them.
  std::vector<std::int64_t> send(static_cast<std::size_t>(n), me + 1), receive;
  for (int r = 0; r < n; ++r) receive.push_back(r + 1);
  Tensor in = Tensor::full({n * (me + 1), 2}, me, DType::I32);
  Tensor out = Tensor::zeros({n * (n + 1) / 2, 2}, DType::I32);
  all_to_all(world, in, send, out, receive, Stream::current(Device::cpu())).wait();
  const std::vector<std::int32_t> got = out.to_vector<std::int32_t>();
  std::size_t at = 0;
  for (int r = 0; r < n; ++r)
    for (int row = 0; row < r + 1; ++row, at += 2) EXPECT_EQ(got[at], r) << "row from rank " << r;
}

TEST(TensorCollectives, SendAndReceiveTensorsAroundARing) {
  const Communicator world = Communicator::world();
  const int n = world.size(), me = world.rank();
  Tensor out = Tensor::full({7}, me, DType::F64), in = Tensor::zeros({7}, DType::F64);
  const TensorPointToPoint ops[] = {TensorPointToPoint::send(out, (me + 1) % n),
                                    TensorPointToPoint::recv(in, (me + n - 1) % n)};
  batch_send_recv(world, ops, Stream::current(Device::cpu())).wait();
  EXPECT_EQ(in.to_vector<double>().back(), (me + n - 1) % n);
}

}  // namespace tensor_collectives_test
}  // namespace kiln::dist
