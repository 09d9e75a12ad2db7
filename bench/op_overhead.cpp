// Host cost of one small op, including the autograd record: N launches of a tiny add (with and
// without requires_grad), timed on the host, divided by N. Prints JSON lines.
//
//   bench_op_overhead [--device cuda|cpu] [--rounds R]
//
// cuda (the default) is the measurement compared with PyTorch. cpu is a proxy for machines without
// a GPU: the 16-element kernel is trivial there, so the time is dispatch, allocation and the
// autograd record. With R > 1 each configuration is timed R times and the median is printed
// (`us_per_op_host_min` too), which steadies the figure on a noisy machine.
//
// Two host figures: `us_per_op_host` times 20,000 back-to-back launches, so once the device's
// launch queue is full it measures the GPU's rate of tiny kernels, not the host (Kiln's launches
// then wait for queue slots); `us_per_op_host_burst` times bursts of 256 launches, synchronising
// (untimed) between bursts so the queue never fills: the host's own cost of an op. PyTorch's peer
// (bench/torch_peers.py) reports both the same way.
#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "bench_util.h"
#include "kiln/autograd/functions.h"
#include "kiln/tensor/grad_mode.h"

int main(int argc, char** argv) {
  using namespace kiln;
  Device d = Device::cuda(0);
  int rounds = 1;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--device") == 0 && i + 1 < argc) {
      d = Device::parse(argv[++i]);
    } else if (std::strcmp(argv[i], "--rounds") == 0 && i + 1 < argc) {
      rounds = std::max(1, std::atoi(argv[++i]));
    } else {
      std::fprintf(stderr, "usage: %s [--device cuda|cpu] [--rounds R]\n", argv[0]);
      return 2;
    }
  }
  if (d.is_cuda() && !bench::have_cuda()) return 0;
  constexpr int kN = 20000;
  for (bool grad : {false, true}) {
    Tensor a = Tensor::ones({16}, DType::F32, d), b = Tensor::ones({16}, DType::F32, d);
    if (grad) a.requires_grad_();
    for (int i = 0; i < 1000; ++i) (void)add(a, b);
    synchronize(d);
    std::vector<double> host, total;
    for (int r = 0; r < rounds; ++r) {
      auto t0 = std::chrono::steady_clock::now();
      for (int i = 0; i < kN; ++i) (void)add(a, b);
      auto t1 = std::chrono::steady_clock::now();
      synchronize(d);
      auto t2 = std::chrono::steady_clock::now();
      host.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count() / kN);
      total.push_back(std::chrono::duration<double, std::micro>(t2 - t0).count() / kN);
    }
    // Bursts shorter than the launch queue, with an untimed synchronisation after each.
    constexpr int kBurst = 256, kBursts = 64;
    std::vector<double> burst;
    for (int r = 0; r < rounds; ++r) {
      double us = 0;
      for (int k = 0; k < kBursts; ++k) {
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < kBurst; ++i) (void)add(a, b);
        auto t1 = std::chrono::steady_clock::now();
        synchronize(d);
        us += std::chrono::duration<double, std::micro>(t1 - t0).count();
      }
      burst.push_back(us / (kBurst * kBursts));
    }
    std::sort(host.begin(), host.end());
    std::sort(total.begin(), total.end());
    std::sort(burst.begin(), burst.end());
    nlohmann::json row = {{"bench", "op_overhead"},
                          {"op", grad ? "add_autograd" : "add"},
                          {"dtype", "float32"},
                          {"shape", "16"},
                          {"device", d.str()},
                          {"us_per_op_host", host[host.size() / 2]},
                          {"us_per_op_host_burst", burst[burst.size() / 2]},
                          {"us_per_op", total[total.size() / 2]}};
    if (rounds > 1) row["us_per_op_host_min"] = host.front();
    bench::emit(row);
  }
  return 0;
}
