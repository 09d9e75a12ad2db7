#pragma once
// A minimal parallel_for for CPU kernels: splits [0, n) into contiguous chunks run on a
// persistent pool of worker threads (the caller takes chunks too). KILN_NUM_THREADS caps the
// thread count. Calls from inside a chunk, or while another thread is using the pool, run
// serially. GEMMs stay on the calling thread (OpenBLAS threads them itself); the pool does the
// memory-bound parts (im2col, pooling, normalisation rows, elementwise).
#include <algorithm>
#include <cstdint>
#include <exception>
#include <functional>
#include <vector>

namespace kiln::ops::cpu {

int num_threads();
// Runs fn(c) for every c in [0, chunks), spread over the pool; returns when all are done.
void run_chunks(std::int64_t chunks, const std::function<void(std::int64_t)>& fn);

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
  run_chunks(chunks, [&](std::int64_t c) {
    try {
      const std::int64_t b = c * per, e = std::min(n, b + per);
      if (b < e) body(b, e);
    } catch (...) {
      errors[static_cast<std::size_t>(c)] = std::current_exception();
    }
  });
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace kiln::ops::cpu
