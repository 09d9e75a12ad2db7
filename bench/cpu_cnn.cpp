// CPU SimpleCNN step (forward + backward, no optimizer) for the CIFAR-10 shape, to compare with
// PyTorch on the same machine: bench/cpu_cnn_torch.py runs the same network.
//   bench_cpu_cnn [batch] [iterations]   -> prints a JSON line with the median step time (ms)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kiln/autograd/functions.h"

using namespace kiln;

int main(int argc, char** argv) {
  const std::int64_t batch = argc > 1 ? std::atoll(argv[1]) : 128;
  const int iters = argc > 2 ? std::atoi(argv[2]) : 10;
  auto param = [](Shape s, std::uint64_t seed, double scale) {
    Tensor t = Tensor::randn(std::move(s), seed) * scale;
    return t.detach().requires_grad_();
  };
  // conv(3->32) relu pool, conv(32->64) relu pool, linear(4096->128) relu, linear(128->10)
  Tensor w1 = param({32, 3, 3, 3}, 1, 0.2), b1 = param({32}, 2, 0.01);
  Tensor w2 = param({64, 32, 3, 3}, 3, 0.05), b2 = param({64}, 4, 0.01);
  Tensor w3 = param({128, 64 * 8 * 8}, 5, 0.01), b3 = param({128}, 6, 0.01);
  Tensor w4 = param({10, 128}, 7, 0.1), b4 = param({10}, 8, 0.01);
  Tensor x = Tensor::randn({batch, 3, 32, 32}, 9);
  std::vector<std::int64_t> labels(static_cast<std::size_t>(batch));
  for (std::int64_t i = 0; i < batch; ++i) labels[i] = i % 10;
  Tensor target = Tensor::from_vector(labels);
  ops::Conv2dParams pad1;
  pad1.pad_h = pad1.pad_w = 1;

  std::vector<double> fwd_ms, step_ms;
  for (int it = 0; it < iters + 2; ++it) {
    for (Tensor* p : {&w1, &b1, &w2, &b2, &w3, &b3, &w4, &b4}) p->set_grad(Tensor());
    auto t0 = std::chrono::steady_clock::now();
    Tensor h = max_pool2d(relu(conv2d(x, w1, b1, pad1)), 2);
    h = max_pool2d(relu(conv2d(h, w2, b2, pad1)), 2);
    h = relu(linear(h.flatten(1), w3, b3));
    Tensor loss = cross_entropy(linear(h, w4, b4), target);
    auto t1 = std::chrono::steady_clock::now();
    loss.backward();
    auto t2 = std::chrono::steady_clock::now();
    if (it >= 2) {  // warm-up
      fwd_ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
      step_ms.push_back(std::chrono::duration<double, std::milli>(t2 - t0).count());
    }
  }
  std::sort(fwd_ms.begin(), fwd_ms.end());
  std::sort(step_ms.begin(), step_ms.end());
  std::printf("{\"impl\": \"kiln\", \"batch\": %lld, \"forward_ms\": %.2f, \"step_ms\": %.2f}\n",
              static_cast<long long>(batch), fwd_ms[fwd_ms.size() / 2], step_ms[step_ms.size() / 2]);
  return 0;
}
