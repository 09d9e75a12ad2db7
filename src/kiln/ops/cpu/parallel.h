#pragma once
// A minimal parallel_for for CPU kernels: splits [0, n) into contiguous chunks run on
// std::threads (the caller runs the first chunk). KILN_NUM_THREADS caps the thread count.
// GEMMs stay on the calling thread (OpenBLAS threads them itself); these threads do the
// memory-bound parts (im2col, pooling, normalisation rows).
#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <exception>
#include <thread>
#include <vector>

namespace kiln::ops::cpu {

inline int num_threads() {
  static const int n = [] {
    int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return std::min(v, hw);
    }
    return hw;
  }();
  return n;
}

// body(begin, end) over chunks of [0, n); `grain` is the smallest chunk worth a thread.
template <class Body>
void parallel_for(std::int64_t n, std::int64_t grain, Body&& body) {
  if (n <= 0) return;
  grain = std::max<std::int64_t>(grain, 1);
  const std::int64_t chunks = std::min<std::int64_t>(num_threads(), (n + grain - 1) / grain);
  if (chunks <= 1) {
    body(std::int64_t{0}, n);
    return;
  }
  const std::int64_t per = (n + chunks - 1) / chunks;
  std::vector<std::exception_ptr> errors(static_cast<std::size_t>(chunks));
  std::vector<std::thread> threads;
  threads.reserve(static_cast<std::size_t>(chunks - 1));
  auto run = [&](std::int64_t c) {
    try {
      std::int64_t b = c * per, e = std::min(n, b + per);
      if (b < e) body(b, e);
    } catch (...) {
      errors[static_cast<std::size_t>(c)] = std::current_exception();
    }
  };
  for (std::int64_t c = 1; c < chunks; ++c) threads.emplace_back(run, c);
  run(0);
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kiln::ops::cpu
