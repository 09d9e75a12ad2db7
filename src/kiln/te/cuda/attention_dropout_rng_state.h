#pragma once
// The generator state of cuDNN's fused attention dropout: its RNG operation reads the Philox seed
// and offset from two int64 tensors in device memory (cudnn-frontend's Seed and Offset inputs), so
// that a captured CUDA graph draws a fresh mask at each replay when the offset lives in a device
// counter (nn::Dropout's graph-safe mode). A one-thread kernel writes them on the call's stream:
// state[0] = seed, state[1] = offset + (*counter when counter is set).
#include <cstdint>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::te::cuda {

void write_attention_dropout_rng_state(std::int64_t* state, std::uint64_t seed, std::uint64_t offset,
                                       const std::int64_t* counter, cudaStream_t stream);

}  // namespace kiln::te::cuda
