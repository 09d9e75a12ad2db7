// CUDA kernels of linear_bias_gelu. Forward: one cuBLASLt matmul with the GELU_AUX_BIAS epilogue
// (GELU_AUX without a bias): y = gelu_tanh(x w^T + b), and the pre-activation as the epilogue's
// aux output; descriptors and the heuristic's algorithm are cached per shape as ops/cuda/gemm.cpp
// does. Where cuBLASLt offers no epilogue algorithm (the aux leading dimension must be a multiple
// of 8), the product goes through the registry GEMM and one bias + GELU pass. Backward: one pass
// forms dpre = dy * gelu'(pre) with the bias gradient's partial column sums, then the two GEMMs.
// (cuBLASLt's DGELU_BGRAD epilogue applies to a GEMM whose product is dy, i.e. the next layer's
// data-gradient GEMM; a standalone op receives dy already made, so the pass above does its work.)
#include <mutex>
#include <unordered_map>

#include "kiln/ops/cuda/cublaslt_device.h"
#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/linalg.h"
#include "kiln/te/cuda/column_sums.cuh"
#include "kiln/te/fused_ops.h"
#include "kiln/te/gelu_tanh.h"

namespace kiln::te::cuda {

using ops::cuda::load_as;
using ops::cuda::store_as;

namespace {

struct Key {
  int device;
  DType dtype;
  std::int64_t n, o, k;
  bool bias;
  int align;      // of x, w, y (cuBLASLt's A, B, D)
  int align_epi;  // of the bias and the aux output
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = static_cast<std::size_t>(k.device);
    for (std::uint64_t v :
         {static_cast<std::uint64_t>(k.dtype), static_cast<std::uint64_t>(k.n), static_cast<std::uint64_t>(k.o),
          static_cast<std::uint64_t>(k.k), static_cast<std::uint64_t>(k.bias), static_cast<std::uint64_t>(k.align),
          static_cast<std::uint64_t>(k.align_epi)})
      h ^= v + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
    return h;
  }
};

struct Plan {
  bool usable = false;  // false: cuBLASLt has no algorithm with this epilogue
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: KILN_FAIL("linear_bias_gelu: dtype {} is not supported on CUDA", dtype_name(t));
  }
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  for (int a : {16, 8, 4})
    if (v % static_cast<std::uintptr_t>(a) == 0) return a;
  return 2;
}

// Column-major roles: D (o x n, ld o) = op(A) (o x k) op(B) (k x n), A = w stored k x o (so
// transposed), B = x stored k x n; D is y [n, o] row-major, the aux output likewise.
// The heuristic reads the bias and aux pointers' alignment: it sees this call's pointers, and the
// key keeps calls with other alignments apart.
Plan make_plan(const Key& key, const ops::cuda::LtDevice& dev, void* aux, const void* bias) {
  Plan p;
  const cudaDataType_t type = cuda_type(key.dtype);
  const cublasComputeType_t compute =
      key.dtype == DType::F32 && ops::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const cublasLtEpilogue_t epilogue = key.bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  const std::int64_t aux_ld = key.o;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
  if (key.bias)
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, static_cast<std::uint64_t>(key.k),
                                               static_cast<std::uint64_t>(key.o), key.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, static_cast<std::uint64_t>(key.k),
                                               static_cast<std::uint64_t>(key.n), key.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, type, static_cast<std::uint64_t>(key.o),
                                               static_cast<std::uint64_t>(key.n), key.o));
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t ws = ops::cuda::kLtWorkspaceBytes;
  const auto align = static_cast<std::uint32_t>(key.align);
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      key.o % 8 == 0 ? cublasLtMatmulAlgoGetHeuristic(dev.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found)
                     : CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
  p.algo = result.algo;
  return p;
}

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

// dpre = dy * gelu'(pre) over [n, o]; block (32, 8) covers 32 adjacent columns of a chunk of
// rows and writes the chunk's bias-gradient partial sums.
template <class T>
__global__ void dgelu_bgrad_kernel(const T* __restrict__ dy, const T* __restrict__ pre, std::int64_t n, std::int64_t o,
                                   std::int64_t chunk, T* __restrict__ dpre, float* __restrict__ partial) {
  const std::int64_t j = std::int64_t{blockIdx.x} * 32 + threadIdx.x;
  const std::int64_t begin = std::int64_t{blockIdx.y} * chunk;
  const std::int64_t end = begin + chunk < n ? begin + chunk : n;
  float s = 0;
  if (j < o)
    for (std::int64_t r = begin + threadIdx.y; r < end; r += 8) {
      const float d = load_as<float>(dy[r * o + j]) * gelu_tanh_grad(load_as<float>(pre[r * o + j]));
      const T stored = store_as<T>(d);
      dpre[r * o + j] = stored;
      s += load_as<float>(stored);  // the bias gradient sums what the GEMMs will see
    }
  __shared__ float sh[8][33];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y != 0 || j >= o || !partial) return;
  float t = 0;
  for (int k = 0; k < 8; ++k) t += sh[k][threadIdx.x];
  partial[std::int64_t{blockIdx.y} * o + j] = t;
}

Tensor as_batch(const Tensor& m) { return m.view({1, m.shape()[0], m.shape()[1]}); }

}  // namespace

void linear_bias_gelu_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& y, const Tensor& pre) {
  const std::int64_t n = x.shape()[0], k = x.shape()[1], o = w.shape()[0];
  ops::cuda::Launch launch(x);
  ops::cuda::LtDevice& dev = ops::cuda::lt_device(launch.index);
  const int align = std::min({alignment_of(x.data_ptr()), alignment_of(w.data_ptr()), alignment_of(y.data_ptr())});
  const int align_epi =
      b.defined() ? std::min(alignment_of(pre.data_ptr()), alignment_of(b.data_ptr())) : alignment_of(pre.data_ptr());
  const Key key{launch.index, x.dtype(), n, o, k, b.defined(), align, align_epi};
  static std::mutex mutex;
  static std::unordered_map<Key, Plan, KeyHash> plans;
  std::unique_lock<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end())
    it = plans.emplace(key, make_plan(key, dev, pre.data_ptr(), b.defined() ? b.data_ptr() : nullptr)).first;
  const Plan& plan = it->second;
  if (plan.usable && k > 0) {
    // The pointers are attributes of the shared descriptor: set and used under the lock.
    void* aux = pre.data_ptr();
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &aux, sizeof(aux)));
    if (b.defined()) {
      const void* bias = b.data_ptr();
      KILN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
    }
    const float alpha = 1, beta = 0;
    KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, plan.desc, &alpha, w.data_ptr(), plan.a, x.data_ptr(), plan.b, &beta,
                                     y.data_ptr(), plan.d, y.data_ptr(), plan.d, &plan.algo, dev.workspace,
                                     ops::cuda::kLtWorkspaceBytes, launch.stream));
    return;
  }
  lock.unlock();
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
  const std::int64_t n = dy.shape()[0], o = dy.shape()[1];
  ops::cuda::Launch launch(dy);
  Tensor dpre = Tensor::empty(dy.shape(), dy.dtype(), dy.device());
  const std::int64_t chunk = 256;
  const std::int64_t chunks = (n + chunk - 1) / chunk;
  Tensor partial = db.defined() ? Tensor::empty({chunks, o}, DType::F32, dy.device()) : Tensor();
  const dim3 grid(static_cast<unsigned>((o + 31) / 32), static_cast<unsigned>(chunks)), block(32, 8);
  KILN_DISPATCH_FLOATING(dy.dtype(), "linear_bias_gelu_backward", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("linear_bias_gelu_backward: float64 runs on the CPU only");
    } else {
      dgelu_bgrad_kernel<T><<<grid, block, 0, launch.stream>>>(
          static_cast<const T*>(dy.data_ptr()), static_cast<const T*>(pre.data_ptr()), n, o, chunk,
          static_cast<T*>(dpre.data_ptr()), partial.defined() ? static_cast<float*>(partial.data_ptr()) : nullptr);
      KILN_CUDA_CHECK_LAUNCH();
    }
  });
  if (db.defined()) finish_column_sums(partial, db, launch.stream);
  if (dx.defined()) ops::gemm_into(as_batch(dpre), as_batch(w), as_batch(dx), false, false, 1.0, 0.0);
  if (dw.defined()) ops::gemm_into(as_batch(dpre), as_batch(x), as_batch(dw), true, false, 1.0, 0.0);
}

}  // namespace kiln::te::cuda
