// CUDA GEMM through cuBLASLt. One handle per device and one 32 MiB workspace per stream
// (cublaslt_device.h); descriptors and the heuristic's algorithm are cached per
// (device, dtype, transposes, m, n, k, batch, alignment), so a steady training step only looks up
// a hash map and calls cublasLtMatmul. Row-major C = op(A) op(B) is computed as the column-major
// C^T = op(B)^T op(A)^T, so no operand is copied.
//
// Precision: f32 uses true FP32 by default; KILN_ALLOW_TF32=1 in the environment (read once)
// allows TF32 tensor cores. bf16/f16 accumulate in f32. f64 is FP64.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <unordered_map>

#include "kiln/ops/cuda/cublaslt_device.h"
#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/ops/elementwise.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/hash_mix.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln::ops::cuda {

namespace {

struct Key {
  int device;
  DType dtype;      // the operands'
  DType out_dtype;  // the output's: the operands' or, for bf16/f16 operands, float32
  bool ta, tb;
  std::int64_t m, n, k, batch;
  int align;
  bool tf32;
  bool bias = false;  // cuBLASLt's BIAS epilogue (gemm_bias)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = static_cast<std::size_t>(k.device) * 1315423911u;
    auto mix = [&h](std::uint64_t v) { hash_mix(h, v); };
    mix(static_cast<std::uint64_t>(k.dtype));
    mix(static_cast<std::uint64_t>(k.out_dtype));
    mix(static_cast<std::uint64_t>(k.ta) | (static_cast<std::uint64_t>(k.tb) << 1) |
        (static_cast<std::uint64_t>(k.tf32) << 2) | (static_cast<std::uint64_t>(k.bias) << 3));
    mix(static_cast<std::uint64_t>(k.m));
    mix(static_cast<std::uint64_t>(k.n));
    mix(static_cast<std::uint64_t>(k.k));
    mix(static_cast<std::uint64_t>(k.batch));
    mix(static_cast<std::uint64_t>(k.align));
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;  // in cuBLASLt's (column-major) roles
  cublasLtMatmulAlgo_t algo{};
  bool double_scale = false;
  bool usable = true;  // false: no algorithm with the bias epilogue (gemm_bias falls back to two passes)
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::F64: return CUDA_R_64F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: KILN_FAIL("matmul: dtype {} is not supported on CUDA", dtype_name(t));
  }
}

cublasLtMatrixLayout_t make_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols, std::int64_t batch) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), rows));
  if (batch > 1) {
    int count = static_cast<int>(batch);
    std::int64_t stride = rows * cols;
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)));
    KILN_CUBLAS_CHECK(
        cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)));
  }
  return l;
}

Plan make_plan(const Key& key, const LtDevice& dev, const void* bias_pointer = nullptr) {
  Plan p;
  const cudaDataType_t type = cuda_type(key.dtype);
  cublasComputeType_t compute = CUBLAS_COMPUTE_32F;
  cudaDataType_t scale = CUDA_R_32F;
  if (key.dtype == DType::F64) {
    compute = CUBLAS_COMPUTE_64F;
    scale = CUDA_R_64F;
    p.double_scale = true;
  } else if (key.dtype == DType::F32 && key.tf32) {
    compute = CUBLAS_COMPUTE_32F_FAST_TF32;
  }
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, scale));
  // Column-major problem: C^T (n x m) = op(B)^T (n x k) * op(A)^T (k x m).
  cublasOperation_t op_first = key.tb ? CUBLAS_OP_T : CUBLAS_OP_N;   // B's role
  cublasOperation_t op_second = key.ta ? CUBLAS_OP_T : CUBLAS_OP_N;  // A's role
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)));
  // Stored (column-major) shapes: B row-major [k, n] (or [n, k] when transposed) is n x k (k x n).
  p.a = key.tb ? make_layout(type, key.k, key.n, key.batch) : make_layout(type, key.n, key.k, key.batch);
  p.b = key.ta ? make_layout(type, key.m, key.k, key.batch) : make_layout(type, key.k, key.m, key.batch);
  p.c = make_layout(cuda_type(key.out_dtype), key.n, key.m, key.batch);
  if (key.bias) {  // bias [n] along C^T's rows (column-major n x m), in the output's dtype
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(
        cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
    const void* bias = bias_pointer;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof(bias)));
  }

  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t ws = kLtWorkspaceBytes;
  std::uint32_t align = static_cast<std::uint32_t>(key.align);
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(dev.handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  if (key.bias && (st != CUBLAS_STATUS_SUCCESS || found == 0)) {
    p.usable = false;
    return p;
  }
  KILN_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
             "matmul: cuBLASLt has no algorithm for {} [{} x {} x {}] batch {} (status {})", dtype_name(key.dtype),
             key.m, key.n, key.k, key.batch, static_cast<int>(st));
  p.algo = result.algo;
  return p;
}

int alignment_of(const void* p) {
  auto v = reinterpret_cast<std::uintptr_t>(p);
  for (int a : {16, 8, 4}) {
    if (v % static_cast<std::uintptr_t>(a) == 0) return a;
  }
  return 2;
}

// The plan's key of the row-major product out [batch, m, n] = op(a) op(b).
Key key_of(const Tensor& a, const Tensor& b, const Tensor& out, bool ta, bool tb) {
  return Key{out.device().index,
             a.dtype(),
             out.dtype(),
             ta,
             tb,
             out.shape()[1],
             out.shape()[2],
             ta ? a.shape()[1] : a.shape()[2],
             a.shape()[0],
             std::min({alignment_of(a.data_ptr()), alignment_of(b.data_ptr()), alignment_of(out.data_ptr())}),
             a.dtype() == DType::F32 && allow_tf32()};
}

}  // namespace

void gemm(const Tensor& a, const Tensor& b, const Tensor& out, bool ta, bool tb, double alpha, double beta) {
  const int index = out.device().index;
  DeviceGuard guard(index);
  LtDevice& dev = lt_device(index);
  const Key key = key_of(a, b, out, ta, tb);
  if (key.m == 0 || key.n == 0) return;
  if (key.k == 0) {  // an empty product: out = beta * out
    if (beta == 0)
      KILN_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, out.nbytes(), cuda_stream(index)));
    else
      binary_scalar(BinaryOp::Mul, out, beta, out);
    return;
  }

  static std::mutex mutex;
  static std::unordered_map<Key, Plan, KeyHash> plans;
  const Plan* plan = nullptr;
  {
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(key, dev)).first;
    plan = &it->second;  // unordered_map nodes are stable
  }
  float af = static_cast<float>(alpha), bf = static_cast<float>(beta);
  const cudaStream_t stream = cuda_stream(index);
  const void* pa = plan->double_scale ? static_cast<const void*>(&alpha) : static_cast<const void*>(&af);
  const void* pb = plan->double_scale ? static_cast<const void*>(&beta) : static_cast<const void*>(&bf);
  KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, plan->desc, pa, b.data_ptr(), plan->a, a.data_ptr(), plan->b, pb,
                                   out.data_ptr(), plan->c, out.data_ptr(), plan->c, &plan->algo,
                                   lt_workspace(index, stream), kLtWorkspaceBytes, stream));
}

void gemm_bias(const Tensor& a, const Tensor& b, const Tensor& bias, const Tensor& out, bool ta, bool tb) {
  const int index = out.device().index;
  Key key = key_of(a, b, out, ta, tb);
  key.align = std::min(key.align, alignment_of(bias.data_ptr()));
  key.bias = true;
  // The epilogue adds one bias to a single matrix; float64 and batches take the two passes.
  if (key.batch == 1 && key.k > 0 && a.dtype() != DType::F64) {
    DeviceGuard guard(index);
    LtDevice& dev = lt_device(index);
    static std::mutex mutex;
    static std::unordered_map<Key, Plan, KeyHash> plans;
    // The bias pointer is an attribute of the shared descriptor: set and used under the lock.
    std::lock_guard<std::mutex> lock(mutex);
    auto it = plans.find(key);
    if (it == plans.end()) it = plans.emplace(key, make_plan(key, dev, bias.data_ptr())).first;
    const Plan& plan = it->second;
    if (plan.usable) {
      const void* pointer = bias.data_ptr();
      KILN_CUBLAS_CHECK(
          cublasLtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &pointer, sizeof(pointer)));
      const float one = 1.0f, zero = 0.0f;
      KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, plan.desc, &one, b.data_ptr(), plan.a, a.data_ptr(), plan.b, &zero,
                                       out.data_ptr(), plan.c, out.data_ptr(), plan.c, &plan.algo,
                                       lt_workspace(index, cuda_stream(index)), kLtWorkspaceBytes, cuda_stream(index)));
      return;
    }
  }
  gemm(a, b, out, ta, tb, 1.0, 0.0);
  binary_(BinaryOp::Add, out, bias);
}

}  // namespace kiln::ops::cuda
