// The CUDA kernels of bias_gelu, compiled by nvcc. Only CUDA and the C++ standard library here:
// op.cpp wraps the launchers into Kiln kernels.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "op_kernel.h"

namespace bias_gelu::cuda {

namespace {

constexpr double kSqrtHalf = 0.70710678118654752440;    // 1 / sqrt(2)
constexpr double kInvSqrt2Pi = 0.39894228040143267794;  // 1 / sqrt(2 pi)

template <class T>
__device__ __forceinline__ T gelu(T v) {
  return T(0.5) * v * (T(1) + erf(v * T(kSqrtHalf)));
}

template <class T>
__device__ __forceinline__ T gelu_grad(T v) {
  const T cdf = T(0.5) * (T(1) + erf(v * T(kSqrtHalf)));
  const T pdf = exp(T(-0.5) * v * v) * T(kInvSqrt2Pi);
  return cdf + v * pdf;
}

template <class T>
__global__ void forward_kernel(const T* __restrict__ x, const T* __restrict__ b, T* __restrict__ y, std::int64_t n,
                               std::int64_t cols) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x)
    y[i] = gelu(x[i] + b[i % cols]);
}

// float, four at a time (cols % 4 == 0, 16-byte aligned pointers).
__global__ void forward_kernel_vec4(const float4* __restrict__ x, const float4* __restrict__ b, float4* __restrict__ y,
                                    std::int64_t n4, std::int64_t cols4) {
  for (std::int64_t i = blockIdx.x * static_cast<std::int64_t>(blockDim.x) + threadIdx.x; i < n4;
       i += static_cast<std::int64_t>(gridDim.x) * blockDim.x) {
    const float4 v = x[i], c = b[i % cols4];
    y[i] = make_float4(gelu(v.x + c.x), gelu(v.y + c.y), gelu(v.z + c.z), gelu(v.w + c.w));
  }
}

// Block (32, 8): each block owns 32 columns and a band of rows; threads keep per-column partial
// sums of gx, reduce them over the block's 8 row lanes, and add one value per column to gb.
constexpr int kCols = 32, kRowLanes = 8;

template <class T>
__global__ void backward_kernel(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ b,
                                T* __restrict__ gx, T* __restrict__ gb, std::int64_t rows, std::int64_t cols,
                                std::int64_t rows_per_block) {
  __shared__ T partial[kRowLanes][kCols];
  const std::int64_t col = blockIdx.x * static_cast<std::int64_t>(kCols) + threadIdx.x;
  const std::int64_t row_begin = blockIdx.y * rows_per_block;
  const std::int64_t row_end = min(rows, row_begin + rows_per_block);
  T sum = 0;
  if (col < cols) {
    const T bias = b[col];
    for (std::int64_t r = row_begin + threadIdx.y; r < row_end; r += kRowLanes) {
      const std::int64_t i = r * cols + col;
      const T g = gy[i] * gelu_grad(x[i] + bias);
      gx[i] = g;
      sum += g;
    }
  }
  partial[threadIdx.y][threadIdx.x] = sum;
  __syncthreads();
  if (threadIdx.y == 0 && col < cols) {
    for (int k = 1; k < kRowLanes; ++k) sum += partial[k][threadIdx.x];
    atomicAdd(&gb[col], sum);
  }
}

class DeviceGuard {
 public:
  explicit DeviceGuard(int device) {
    cudaGetDevice(&previous_);
    if (previous_ != device) cudaSetDevice(device);
  }
  ~DeviceGuard() { cudaSetDevice(previous_); }

 private:
  int previous_ = 0;
};

int grid_for(std::int64_t n, int block) {
  int sms = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const std::int64_t blocks = (n + block - 1) / block;
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(blocks, std::int64_t(sms) * 16)));
}

const char* status() {
  cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? nullptr : cudaGetErrorString(err);
}

template <class T>
void launch_forward(const T* x, const T* b, T* y, std::int64_t rows, std::int64_t cols, cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  constexpr int block = 256;
  forward_kernel<T><<<grid_for(n, block), block, 0, stream>>>(x, b, y, n, cols);
}

template <>
void launch_forward<float>(const float* x, const float* b, float* y, std::int64_t rows, std::int64_t cols,
                           cudaStream_t stream) {
  const std::int64_t n = rows * cols;
  constexpr int block = 256;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(x) | reinterpret_cast<std::uintptr_t>(b) |
                        reinterpret_cast<std::uintptr_t>(y)) %
                           16 ==
                       0;
  if (cols % 4 == 0 && aligned)
    forward_kernel_vec4<<<grid_for(n / 4, block), block, 0, stream>>>(reinterpret_cast<const float4*>(x),
                                                                      reinterpret_cast<const float4*>(b),
                                                                      reinterpret_cast<float4*>(y), n / 4, cols / 4);
  else
    forward_kernel<float><<<grid_for(n, block), block, 0, stream>>>(x, b, y, n, cols);
}

template <class T>
const char* backward_typed(const T* gy, const T* x, const T* b, T* gx, T* gb, std::int64_t rows, std::int64_t cols,
                           cudaStream_t stream) {
  if (cudaMemsetAsync(gb, 0, sizeof(T) * cols, stream) != cudaSuccess) return status();
  if (rows == 0 || cols == 0) return nullptr;
  int sms = 0, device = 0;
  cudaGetDevice(&device);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
  const std::int64_t col_blocks = (cols + kCols - 1) / kCols;
  // Enough row bands to fill the GPU a few times over, each at least 64 rows tall.
  std::int64_t bands = std::max<std::int64_t>(1, std::int64_t(sms) * 8 / col_blocks);
  bands = std::min<std::int64_t>(bands, (rows + 63) / 64);
  const std::int64_t rows_per_block = (rows + bands - 1) / bands;
  dim3 grid(static_cast<unsigned>(col_blocks), static_cast<unsigned>(bands));
  backward_kernel<T><<<grid, dim3(kCols, kRowLanes), 0, stream>>>(gy, x, b, gx, gb, rows, cols, rows_per_block);
  return status();
}

}  // namespace

const char* forward(Type type, const void* x, const void* b, void* y, std::int64_t rows, std::int64_t cols, int device,
                    void* stream) {
  if (rows == 0 || cols == 0) return nullptr;
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == Type::F32)
    launch_forward(static_cast<const float*>(x), static_cast<const float*>(b), static_cast<float*>(y), rows, cols, s);
  else
    launch_forward(static_cast<const double*>(x), static_cast<const double*>(b), static_cast<double*>(y), rows, cols,
                   s);
  return status();
}

const char* backward(Type type, const void* gy, const void* x, const void* b, void* gx, void* gb, std::int64_t rows,
                     std::int64_t cols, int device, void* stream) {
  DeviceGuard guard(device);
  auto s = static_cast<cudaStream_t>(stream);
  if (type == Type::F32)
    return backward_typed(static_cast<const float*>(gy), static_cast<const float*>(x), static_cast<const float*>(b),
                          static_cast<float*>(gx), static_cast<float*>(gb), rows, cols, s);
  return backward_typed(static_cast<const double*>(gy), static_cast<const double*>(x), static_cast<const double*>(b),
                        static_cast<double*>(gx), static_cast<double*>(gb), rows, cols, s);
}

}  // namespace bias_gelu::cuda
