// Tensor parallelism's building blocks under `mpirun -np 2` and `-np 4` (tests/models/CMakeLists.txt;
// run alone, a world of one, they skip): a column-parallel linear, an activation and a row-parallel
// linear over a tensor-parallel group of all ranks (Megatron's MLP) compute the output and the
// gradients of the same two layers in one process, each rank holding its slices of the weights;
// gather_output all-gathers the column layer's output; scatter and gather are each other's inverse.
// Under sequence parallelism, --tp-comm-overlap's ring-exchange layers (tensor_parallel_overlap.h)
// give what the blocking ones give, with and without a zero-bubble weight-gradient store.
// Tolerance: each rank's partial products are summed in another order than one matmul's, float32
// rounding: 1e-5 relative.
#include <gtest/gtest.h>

#include <cmath>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/dist/process_groups.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/models/transformer_linear.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {
namespace tensor_parallel_linear_test {

void expect_close(const Tensor& expected, const Tensor& got, const std::string& what) {
  ASSERT_EQ(expected.shape(), got.shape()) << what;
  const auto a = expected.contiguous().to_vector<float>(), b = got.contiguous().to_vector<float>();
  for (std::size_t i = 0; i < a.size(); ++i)
    ASSERT_NEAR(a[i], b[i], 1e-5 * (1 + std::abs(a[i]))) << what << "[" << i << "]";
}

struct Layers {
  std::shared_ptr<ParallelLinear> column, row;
};

// The whole layers' weights, the same on every rank (seeded).
struct Weights {
  Tensor w1 = Tensor::randn({16, 8}, 11), b1 = Tensor::randn({16}, 12), w2 = Tensor::randn({6, 16}, 13),
         b2 = Tensor::randn({6}, 14);
};

Layers tensor_parallel_layers(const LayerContext& context, const Weights& w, int tp, int rank) {
  Layers l;
  l.column = std::make_shared<ParallelLinear>(ParallelLinearKind::Column, 8, 16, true, context);
  l.row = std::make_shared<ParallelLinear>(ParallelLinearKind::Row, 16, 6, true, context);
  NoGradGuard no_grad;
  const std::int64_t part = 16 / tp;
  l.column->weight.copy_(w.w1.narrow(0, rank * part, part));
  l.column->bias.copy_(w.b1.narrow(0, rank * part, part));
  l.row->weight.copy_(w.w2.narrow(1, rank * part, part));
  l.row->bias.copy_(w.b2);
  return l;
}

TEST(TensorParallelLinear, ColumnThenRowEqualsTheWholeLayers) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const int tp = world.size(), rank = world.rank();
  ASSERT_EQ(16 % tp, 0);
  const dist::ProcessGroups groups(world, {.tp = tp});
  ASSERT_EQ(groups.tp().size(), tp);
  const LayerContext context{.groups = &groups};
  const Weights w;
  const Tensor probe = Tensor::randn({5, 6}, 15);  // the loss: sum(y * probe)

  // One process: the whole layers.
  Tensor w1 = w.w1.clone().requires_grad_(), b1 = w.b1.clone().requires_grad_(), w2 = w.w2.clone().requires_grad_(),
         b2 = w.b2.clone().requires_grad_();
  Tensor x_ref = Tensor::randn({5, 8}, 16).requires_grad_();
  Tensor y_ref = linear(gelu(linear(x_ref, w1, b1)), w2, b2);
  sum(mul(y_ref, probe)).backward();

  Layers l = tensor_parallel_layers(context, w, tp, rank);
  EXPECT_EQ(l.column->weight.shape(), (Shape{16 / tp, 8}));
  EXPECT_EQ(l.row->weight.shape(), (Shape{6, 16 / tp}));
  Tensor x = Tensor::randn({5, 8}, 16).requires_grad_();
  Tensor y = l.row->forward(gelu(l.column->forward(x)));
  sum(mul(y, probe)).backward();

  expect_close(y_ref.detach(), y.detach(), "output");
  expect_close(x_ref.grad(), x.grad(), "input gradient (the column layer's all-reduce)");
  const std::int64_t part = 16 / tp;
  expect_close(w1.grad().narrow(0, rank * part, part), l.column->weight.grad(), "column weight gradient");
  expect_close(b1.grad().narrow(0, rank * part, part), l.column->bias.grad(), "column bias gradient");
  expect_close(w2.grad().narrow(1, rank * part, part), l.row->weight.grad(), "row weight gradient");
  expect_close(b2.grad(), l.row->bias.grad(), "row bias gradient");
}

TEST(TensorParallelLinear, GatherOutputAndScatterAreInverse) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const int tp = world.size(), rank = world.rank();
  const dist::ProcessGroups groups(world, {.tp = tp});
  const LayerContext context{.groups = &groups};
  const Weights w;
  const Tensor probe = Tensor::randn({3, 16}, 17);

  Tensor w1 = w.w1.clone().requires_grad_(), b1 = w.b1.clone().requires_grad_();
  Tensor x_ref = Tensor::randn({3, 8}, 18).requires_grad_();
  Tensor y_ref = linear(x_ref, w1, b1);
  sum(mul(y_ref, probe)).backward();

  Layers l = tensor_parallel_layers(context, w, tp, rank);
  l.column->gather_output = true;
  Tensor x = Tensor::randn({3, 8}, 18).requires_grad_();
  Tensor y = l.column->forward(x);
  sum(mul(y, probe)).backward();
  expect_close(y_ref.detach(), y.detach(), "gathered output");
  expect_close(x_ref.grad(), x.grad(), "input gradient");
  const std::int64_t part = 16 / tp;
  expect_close(w1.grad().narrow(0, rank * part, part), l.column->weight.grad(), "column weight gradient");

  // scatter then gather: the identity, and so is its gradient.
  Tensor z = Tensor::randn({3, 16}, 19).requires_grad_();
  Tensor mine = scatter_to_tensor_parallel_region(z, groups.tp());
  expect_close(z.detach().narrow(1, rank * part, part), mine.detach(), "scattered part");
  Tensor back = gather_from_tensor_parallel_region(mine, groups.tp());
  sum(mul(back, probe)).backward();
  expect_close(z.detach(), back.detach(), "gathered back");
  expect_close(probe, z.grad(), "gradient through scatter and gather");
}

// Sequence parallelism with --tp-comm-overlap: the column layer's gather and the row layer's
// reduce-scatter run as rings under the GEMMs; output, input gradient and every weight and bias
// gradient equal the blocking sequence-parallel layers', and the output the one-process layers'.
// Then the same backward inside a zero-bubble weight-gradient store: the weight gradients arrive at
// the store's flush, equal.
TEST(TensorParallelLinear, SequenceParallelOverlapEqualsTheBlockingLayers) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const int tp = world.size(), rank = world.rank();
  const dist::ProcessGroups groups(world, {.tp = tp});
  const Weights w;
  const std::int64_t batch = 2, seq = 3 * tp, slice = seq / tp;
  const Tensor x_whole = Tensor::randn({batch, seq, 8}, 21);
  const Tensor probe = Tensor::randn({batch, slice, 6}, 22 + rank);  // the loss: sum(y * probe) on this rank's slice
  const Tensor y_whole = linear(gelu(linear(x_whole, w.w1, w.b1)), w.w2, w.b2);

  struct Run {
    Tensor y, x_grad;
    Layers layers;
  };
  auto run = [&](bool overlap, autograd::WeightGradStore* store) {
    const LayerContext context{.groups = &groups, .sequence_parallel = true, .tp_comm_overlap = overlap};
    Run r;
    r.layers = tensor_parallel_layers(context, w, tp, rank);
    EXPECT_EQ(r.layers.column->tp_comm_overlap, overlap);
    Tensor x = x_whole.narrow(1, rank * slice, slice).contiguous().requires_grad_();
    r.y = r.layers.row->forward(gelu(r.layers.column->forward(x)));
    {
      autograd::WeightGradStoreScope defer(store);
      sum(mul(r.y, probe)).backward();
    }
    if (store != nullptr) {
      EXPECT_FALSE(r.layers.column->weight.grad().defined()) << "deferred into the store";
      EXPECT_FALSE(store->empty());
      store->flush();
    }
    r.x_grad = x.grad();
    return r;
  };
  const Run blocking = run(false, nullptr);
  expect_close(y_whole.narrow(1, rank * slice, slice), blocking.y.detach(), "blocking output vs one process");
  autograd::WeightGradStore store;
  for (autograd::WeightGradStore* s : {static_cast<autograd::WeightGradStore*>(nullptr), &store}) {
    const std::string how = s == nullptr ? " (overlapped)" : " (overlapped, deferred weight gradients)";
    const Run overlapped = run(true, s);
    expect_close(blocking.y.detach(), overlapped.y.detach(), "output" + how);
    expect_close(blocking.x_grad, overlapped.x_grad, "input gradient" + how);
    expect_close(blocking.layers.column->weight.grad(), overlapped.layers.column->weight.grad(),
                 "column weight gradient" + how);
    expect_close(blocking.layers.column->bias.grad(), overlapped.layers.column->bias.grad(),
                 "column bias gradient" + how);
    expect_close(blocking.layers.row->weight.grad(), overlapped.layers.row->weight.grad(), "row weight gradient" + how);
    expect_close(blocking.layers.row->bias.grad(), overlapped.layers.row->bias.grad(), "row bias gradient" + how);
  }
}

TEST(TensorParallelLinear, ASizeTheGroupCannotSplitIsRefused) {
  dist::Communicator world = dist::Communicator::world();
  if (world.size() < 2) GTEST_SKIP() << "needs mpirun -np 2 or 4 (ctest: models_tp_mpirun_2/4)";
  const dist::ProcessGroups groups(world, {.tp = world.size()});
  const LayerContext context{.groups = &groups};
  std::string error;
  try {
    ParallelLinear(ParallelLinearKind::Column, 8, 4 * world.size() + 1, false, context);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("is not divisible by --tensor-model-parallel-size"), std::string::npos) << error;
}

}  // namespace tensor_parallel_linear_test
}  // namespace kiln::models
