#include "kiln/models/context_parallel_layout.h"

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

namespace {

std::int64_t chunk_size(std::int64_t seq, int cp_size, const char* call) {
  KILN_CHECK(cp_size >= 1 && seq % (2 * cp_size) == 0,
             "{}: a sequence of {} tokens does not cut into 2 x {} equal chunks (--seq-length must be divisible by 2 x "
             "--context-parallel-size)",
             call, seq, cp_size);
  return seq / (2 * cp_size);
}

}  // namespace

std::vector<std::int64_t> context_parallel_positions(std::int64_t seq, int cp_size, int cp_rank) {
  const std::int64_t c = chunk_size(seq, cp_size, "context_parallel_positions");
  std::vector<std::int64_t> positions;
  positions.reserve(static_cast<std::size_t>(2 * c));
  for (const std::int64_t chunk : {std::int64_t{cp_rank}, std::int64_t{2 * cp_size - 1 - cp_rank}})
    for (std::int64_t i = 0; i < c; ++i) positions.push_back(chunk * c + i);
  return positions;
}

Tensor context_parallel_slice(const Tensor& x, int cp_size, int cp_rank, std::int64_t dim) {
  if (cp_size == 1) return x;
  const std::int64_t c = chunk_size(x.size(dim), cp_size, "context_parallel_slice");
  return cat({x.narrow(dim, cp_rank * c, c), x.narrow(dim, (2 * cp_size - 1 - cp_rank) * c, c)}, dim);
}

}  // namespace kiln::models
