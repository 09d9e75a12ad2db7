#pragma once
// Writes an array of device pointers known on the host into device memory, for the cuBLAS calls
// that read their operands' addresses from a device array (te/cuda/grouped_gemm_cublas.cpp). The
// pointers travel as kernel parameters, which CUDA copies at launch: no pinned staging buffer whose
// reuse would have to wait for a copy, no pageable copy, and the write is ordered on the stream
// like any kernel.
#include <cstddef>

#include "kiln/runtime/vendor/cuda.h"

namespace kiln::te::cuda {

// device[i] = host[i] for i < count, on `stream`; device holds count pointers (8-byte aligned).
void write_device_pointer_table(const void* const* host, std::size_t count, void** device, cudaStream_t stream);

}  // namespace kiln::te::cuda
