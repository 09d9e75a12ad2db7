// CUDA kernels of linear_bias_gelu and of linear_gelu_linear's backward GEMM. Forward: one
// cuBLASLt matmul with the GELU_AUX_BIAS epilogue (GELU_AUX without a bias): y = gelu_tanh(x w^T +
// b), and the pre-activation as the epilogue's aux output (te/cuda/lt_epilogue.h). Where cuBLASLt
// offers no epilogue algorithm (the aux leading dimension must be a multiple of 8), the product
// goes through the registry GEMM and one bias + GELU pass. linear_bias_gelu's backward: one pass
// forms dpre = dy * gelu'(pre) with the bias gradient's partial column sums, then the two GEMMs
// (dy arrives already made). dgelu_bgrad_gemm is the GEMM that makes dy in an MLP (the next
// layer's data gradient) followed by that pass, which linear_gelu_linear uses. Not cuBLASLt's
// DGELU_BGRAD epilogue: on the H200 (cuBLAS 13) it ran as the GEMM plus a separate
// epilogue::globalKernel of 316 us per GPT-2 fc1 gradient ([16384, 3072] bf16), 3.8 ms a step
// against 1.4 ms for this pass (ncu, `bash tools/gpu-session.sh gptprof`, 2026-12-03).
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/linalg.h"
#include "kiln/te/cuda/column_sums.cuh"
#include "kiln/te/cuda/lt_epilogue.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/gelu_tanh.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

// The fallback's epilogue: pre += b (rounded as the aux output is), y = gelu(pre).
template <class T>
__global__ void bias_gelu_kernel(T* __restrict__ pre, const T* __restrict__ b, std::int64_t total, std::int64_t o,
                                 T* __restrict__ y) {
  for (std::int64_t i = std::int64_t{blockIdx.x} * blockDim.x + threadIdx.x; i < total;
       i += std::int64_t{gridDim.x} * blockDim.x) {
    const T v = store_as<T>(load_as<float>(pre[i]) + (b ? load_as<float>(b[i % o]) : 0.f));
    pre[i] = v;
    y[i] = store_as<T>(gelu_tanh(load_as<float>(v)));
  }
}

// dpre = dy * gelu'(pre) over [n, o]; block (32, 8) covers 32 x V adjacent columns (V per thread,
// one 16-byte load of each operand when V is 8) of a chunk of rows and writes the chunk's
// bias-gradient partial sums.
template <class T, int V>
__global__ void dgelu_bgrad_kernel(const T* __restrict__ dy, const T* __restrict__ pre, std::int64_t n, std::int64_t o,
                                   std::int64_t chunk, T* __restrict__ dpre, float* __restrict__ partial) {
  const std::int64_t j0 = (std::int64_t{blockIdx.x} * 32 + threadIdx.x) * V;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  float s[V] = {};
  if (j0 < o)
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const std::int64_t at = r * o + j0;
      if constexpr (V == 1) {
        const T stored = store_as<T>(load_as<float>(dy[at]) * gelu_tanh_grad(load_as<float>(pre[at])));
        dpre[at] = stored;
        s[0] += load_as<float>(stored);  // the bias gradient sums what the GEMMs will see
      } else {
        struct alignas(sizeof(T) * V) Pack {
          T v[V];
        };
        const Pack d = *reinterpret_cast<const Pack*>(dy + at);
        const Pack p = *reinterpret_cast<const Pack*>(pre + at);
        Pack out;
#pragma unroll
        for (int c = 0; c < V; ++c) {
          out.v[c] = store_as<T>(load_as<float>(d.v[c]) * gelu_tanh_grad(load_as<float>(p.v[c])));
          s[c] += load_as<float>(out.v[c]);
        }
        *reinterpret_cast<Pack*>(dpre + at) = out;
      }
    }
  if (!partial) return;
  __shared__ float sh[8][32 * V + 1];
#pragma unroll
  for (int c = 0; c < V; ++c) sh[threadIdx.y][threadIdx.x * V + c] = s[c];
  __syncthreads();
  // 256 threads sum the 8 rows of the block's 32 x V columns.
  for (int col = threadIdx.y * 32 + threadIdx.x; col < 32 * V; col += 256) {
    const std::int64_t j = std::int64_t{blockIdx.x} * 32 * V + col;
    if (j >= o) continue;
    float t = 0;
    for (int k = 0; k < 8; ++k) t += sh[k][col];
    partial[std::int64_t{blockIdx.y} * o + j] = t;
  }
}

Tensor as_batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

// dpre = dy * gelu'(pre) and, when db is defined, db = its column sums.
void dgelu_pass(const Tensor& dy, const Tensor& pre, const Tensor& dpre, const Tensor& db,
                const ops::cuda::Launch& launch) {
  const std::int64_t n = dy.shape()[0], o = dy.shape()[1];
  const std::int64_t chunk = 256;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  Tensor partial = db.defined() ? Tensor::empty({chunks, o}, DType::F32, dy.device()) : Tensor();
  // Eight columns a thread where every row starts 16-byte aligned (bf16/f16 rows of a multiple of 8).
  const bool wide = dy.element_size() == 2 && o % 8 == 0 && reinterpret_cast<std::uintptr_t>(dy.data_ptr()) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(pre.data_ptr()) % 16 == 0 &&
                    reinterpret_cast<std::uintptr_t>(dpre.data_ptr()) % 16 == 0;
  const std::int64_t per_block = wide ? 32 * 8 : 32;
  const dim3 grid(static_cast<unsigned>((o + per_block - 1) / per_block), static_cast<unsigned>(chunks)), block(32, 8);
  KILN_DISPATCH_FLOATING(dy.dtype(), "linear_bias_gelu_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("linear_bias_gelu_backward: float64 runs on the CPU only");
    } else {
      const auto run = [&]<int V>() {
        dgelu_bgrad_kernel<T, V><<<grid, block, 0, launch.stream>>>(
            static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(pre.data_ptr()), n, o, chunk,
            static_cast<T*>(dpre.data_ptr()), partial.defined() ? static_cast<float*>(partial.data_ptr()) : nullptr);
      };
      if constexpr (sizeof(T) == 2) {
        if (wide)
          run.template operator()<8>();
        else
          run.template operator()<1>();
      } else {
        run.template operator()<1>();
      }
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
  if (db.defined()) finish_column_sums(partial, db, launch.stream);
}

}  // namespace

void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& pre) {
  const std::int64_t n = x.shape()[0], k = x.shape()[1], o = w.shape()[0];
  ops::cuda::Launch launch(x);
  LtEpilogueMatmul call;
  call.dtype = x.dtype();
  call.m = o;
  call.n = n;
  call.k = k;
  call.a_transposed = true;
  call.epilogue = b.defined() ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  call.a = w.data_ptr();
  call.b = x.data_ptr();
  call.d = y.data_ptr();
  call.aux = pre.data_ptr();
  call.bias = b.defined() ? b.data_ptr() : nullptr;
  if (lt_epilogue_matmul(launch.index, call, launch.stream)) return;
  ops::gemm_into(as_batch(x), as_batch(w), as_batch(pre), false, true, 1.0, 0.0);
  const std::int64_t total = n * o;
  const int threads = 256, blocks = ops::cuda::grid_for(total, threads, launch.index);
  KILN_DISPATCH_FLOATING(x.dtype(), "linear_bias_gelu", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("linear_bias_gelu: float64 runs on the CPU only");
    } else {
      bias_gelu_kernel<T><<<blocks, threads, 0, launch.stream>>>(
          static_cast<T*>(pre.data_ptr()), b.defined() ? static_cast<const T*>(b.data_ptr()) : nullptr, total, o,
          static_cast<T*>(y.data_ptr()));
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
}

void linear_bias_gelu_backward(const Tensor& dy, const Tensor& pre, const Tensor& x, const Tensor& w, const Tensor& dx,
                               const Tensor& dw, const Tensor& db) {
  ops::cuda::Launch launch(dy);
  Tensor dpre = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  dgelu_pass(dy, pre, dpre, db, launch);
  if (dx.defined()) ops::gemm_into(as_batch(dpre), as_batch(w), as_batch(dx), false, false, 1.0, 0.0);
  if (dw.defined()) ops::gemm_into(as_batch(dpre), as_batch(x), as_batch(dw), true, false, 1.0, 0.0);
}

// The next layer's data-gradient GEMM, then the GELU backward pass (dpre and the bias gradient).
void dgelu_bgrad_gemm(const Tensor& dout, const Tensor& w2, const Tensor& pre, const Tensor& dpre, const Tensor& db) {
  const std::int64_t n = dout.shape()[0], f = w2.shape()[1];
  ops::cuda::Launch launch(dout);
  Tensor dh = Tensor::empty({n, f}, dout.dtype(), dout.device());
  ops::gemm_into(as_batch(dout), as_batch(w2), as_batch(dh), false, false, 1.0, 0.0);
  dgelu_pass(dh, pre, dpre, db, launch);
}

}  // namespace kiln::te::cuda
