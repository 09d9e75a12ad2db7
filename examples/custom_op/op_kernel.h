#pragma once
// The CUDA launchers of op_kernel.cu. Plain pointers and no CUDA types, so that op.cpp (host
// compiler) can call them. Each returns nullptr on success, else the CUDA error's text.
#include <cstdint>

namespace bias_gelu::cuda {

enum class Type { F32, F64 };

// y = gelu(x + b[col]); x, y [rows, cols] contiguous, b [cols].
const char* forward(Type type, const void* x, const void* b, void* y, std::int64_t rows, std::int64_t cols, int device,
                    void* stream);
// gx = gy * gelu'(x + b[col]); gb[col] = sum over rows of gx.
const char* backward(Type type, const void* gy, const void* x, const void* b, void* gx, void* gb, std::int64_t rows,
                     std::int64_t cols, int device, void* stream);

}  // namespace bias_gelu::cuda
