#include "kiln/runtime/error.h"
#include "kiln/te/cuda/attention_dropout_rng_state.h"

namespace kiln::te::cuda {

namespace {

__global__ void write_rng_state_kernel(std::int64_t* state, std::uint64_t seed, std::uint64_t offset,
                                       const std::int64_t* counter) {
  state[0] = static_cast<std::int64_t>(seed);
  state[1] = static_cast<std::int64_t>(offset + (counter != nullptr ? static_cast<std::uint64_t>(*counter) : 0));
}

}  // namespace

void write_attention_dropout_rng_state(std::int64_t* state, std::uint64_t seed, std::uint64_t offset,
                                       const std::int64_t* counter, cudaStream_t stream) {
  write_rng_state_kernel<<<1, 1, 0, stream>>>(state, seed, offset, counter);
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::te::cuda
