// Dropout with its Philox offset in a device counter (graph_safe, for CUDA graph replays) draws
// the same masks as the host-offset mode; on the CPU the counter is a CPU tensor.
#include <gtest/gtest.h>

#include "kiln/autograd/functions.h"
#include "kiln/nn/nn.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/graph_capture_state.h"

namespace kiln {
namespace graph_safe_dropout_test {

TEST(GraphSafeDropout, SameMasksAsHostOffsets) {
  nn::Dropout host(0.3, 1234), dev(0.3, 1234);
  auto model = std::make_shared<nn::Sequential>();
  model->push_back(std::make_shared<nn::Dropout>(0.3, 1234));
  nn::set_graph_safe_random(*model);
  Tensor x = Tensor::ones({4, 33}).requires_grad_();
  dev.graph_safe = true;
  for (int call = 0; call < 4; ++call) {
    if (call == 2) {  // assigning the offset restarts the device counter from it
      host.offset = 5000;
      dev.offset = 5000;
    }
    Tensor a = host.forward(x), b = dev.forward(x);
    EXPECT_EQ(a.to_vector<float>(), b.to_vector<float>()) << call;
    if (call < 2) {
      EXPECT_EQ(a.to_vector<float>(), model->forward(x).to_vector<float>()) << call;
    }
    EXPECT_EQ(host.offset, dev.offset);
    // Gradients flow through the same mask.
    sum(b).backward();
    EXPECT_EQ(x.grad().to_vector<float>(), b.detach().to_vector<float>()) << call;
    x.impl()->grad.reset();
  }
  // The counter is authoritative: a stale host mirror is refreshed from it.
  const std::uint64_t at = dev.offset;
  dev.offset = at;  // unchanged: no restart
  dev.sync_offset_from_device();
  EXPECT_EQ(dev.offset, at);
}

TEST(GraphSafeDropout, AdvancingFunctionalMovesTheCounter) {
  Tensor x = Tensor::ones({10});
  Tensor counter = Tensor::scalar(7, DType::I64);
  Tensor y = dropout_advancing(x, 0.5, 99, counter);
  EXPECT_EQ(counter.item(), 17);
  EXPECT_EQ(y.to_vector<float>(), dropout(x, 0.5, true, 99, 7).to_vector<float>());
  EXPECT_THROW(dropout_advancing(x, 0.5, 99, Tensor::scalar(0, DType::F32)), Error);
}

TEST(GraphSafeDropout, CounterMustExistBeforeCapture) {
  nn::Dropout d(0.5, 1);
  d.graph_safe = true;
  Tensor x = Tensor::ones({8});
  set_graph_capture_active(true);
  EXPECT_THROW(d.forward(x), Error);
  set_graph_capture_active(false);
  d.forward(x);
  set_graph_capture_active(true);
  EXPECT_NO_THROW(d.forward(x));
  set_graph_capture_active(false);
}

}  // namespace graph_safe_dropout_test
}  // namespace kiln
