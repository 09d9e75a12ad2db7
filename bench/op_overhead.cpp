// Host cost of one small op on CUDA, including the autograd record: N launches of a tiny add
// (with and without requires_grad), timed on the host, divided by N. Prints JSON lines.
#include <chrono>

#include "bench_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/tensor/grad_mode.h"

int main() {
  using namespace kiln;
  if (!bench::have_cuda()) return 0;
  Device d = Device::cuda(0);
  constexpr int kN = 20000;
  for (bool grad : {false, true}) {
    Tensor a = Tensor::ones({16}, DType::F32, d), b = Tensor::ones({16}, DType::F32, d);
    if (grad) a.requires_grad_();
    for (int i = 0; i < 1000; ++i) (void)add(a, b);
    synchronize(d);
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < kN; ++i) (void)add(a, b);
    auto t1 = std::chrono::steady_clock::now();
    synchronize(d);
    auto t2 = std::chrono::steady_clock::now();
    double host_us = std::chrono::duration<double, std::micro>(t1 - t0).count() / kN;
    double total_us = std::chrono::duration<double, std::micro>(t2 - t0).count() / kN;
    bench::emit({{"bench", "op_overhead"},
                 {"op", grad ? "add_autograd" : "add"},
                 {"dtype", "float32"},
                 {"shape", "16"},
                 {"us_per_op_host", host_us},
                 {"us_per_op", total_us}});
  }
  return 0;
}
