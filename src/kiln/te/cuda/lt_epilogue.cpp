#include "kiln/te/cuda/lt_epilogue.h"

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kiln/ops/cuda/cublaslt_device.h"
#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/hash_mix.h"

namespace kiln::te::cuda {

namespace {

struct EpilogueKey {
  int device;
  DType dtype;
  std::int64_t m, n, k;
  bool a_transposed;
  int epilogue;
  int align;      // of a, b, d (cuBLASLt's A, B, D)
  int align_epi;  // of the bias and the aux matrix
  bool operator==(const EpilogueKey&) const = default;
};

struct EpilogueKeyHash {
  std::size_t operator()(const EpilogueKey& k) const {
    std::size_t h = static_cast<std::size_t>(k.device);
    for (std::uint64_t v : {static_cast<std::uint64_t>(k.dtype), static_cast<std::uint64_t>(k.m),
                            static_cast<std::uint64_t>(k.n), static_cast<std::uint64_t>(k.k),
                            static_cast<std::uint64_t>(k.a_transposed), static_cast<std::uint64_t>(k.epilogue),
                            static_cast<std::uint64_t>(k.align), static_cast<std::uint64_t>(k.align_epi)})
      hash_mix(h, v);
    return h;
  }
};

struct EpiloguePlan {
  bool usable = false;
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F32: return CUDA_R_32F;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F16: return CUDA_R_16F;
    default: KILN_FAIL("cuBLASLt epilogue matmul: dtype {} is not supported", dtype_name(t));
  }
}

int alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  for (int a : {16, 8, 4})
    if (v % static_cast<std::uintptr_t>(a) == 0) return a;
  return 2;
}

bool has_bias(cublasLtEpilogue_t e) {
  return e == CUBLASLT_EPILOGUE_GELU_AUX_BIAS || e == CUBLASLT_EPILOGUE_DGELU_BGRAD;
}

// Sets the pointer attributes; the heuristic reads their alignment, so they are set before it too.
void set_pointers(cublasLtMatmulDesc_t desc, const LtEpilogueMatmul& c) {
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &c.aux, sizeof(c.aux)));
  if (has_bias(c.epilogue))
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias)));
}

// Column-major roles: D (m x n, ld m) = op(A) (m x k) B (k x n), where A is a stored k x m (ld k,
// transposed) or m x k (ld m), B is b stored k x n (ld k); D is d [n, m] row-major, aux likewise.
EpiloguePlan make_plan(const EpilogueKey& key, const ops::cuda::LtDevice& dev, const LtEpilogueMatmul& c) {
  EpiloguePlan p;
  const cudaDataType_t type = cuda_type(key.dtype);
  const cublasComputeType_t compute =
      key.dtype == DType::F32 && ops::cuda::allow_tf32() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t ta = key.a_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  const auto epilogue = static_cast<cublasLtEpilogue_t>(key.epilogue);
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)));
  const std::int64_t aux_ld = key.m;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof(aux_ld)));
  set_pointers(p.desc, c);
  const auto u = [](std::int64_t v) { return static_cast<std::uint64_t>(v); };
  if (key.a_transposed)
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, u(key.k), u(key.m), key.k));
  else
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, type, u(key.m), u(key.k), key.m));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, type, u(key.k), u(key.n), key.k));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.d, type, u(key.m), u(key.n), key.m));
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
      key.m % 8 == 0 ? cublasLtMatmulAlgoGetHeuristic(dev.handle, p.desc, p.a, p.b, p.d, p.d, pref, 1, &result, &found)
                     : CUBLAS_STATUS_NOT_SUPPORTED;
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
  p.algo = result.algo;
  return p;
}

}  // namespace

bool lt_epilogue_matmul(int device, const LtEpilogueMatmul& c, cudaStream_t stream) {
  if (c.k == 0) return false;  // an empty product: the caller's fallback handles it
  ops::cuda::LtDevice& dev = ops::cuda::lt_device(device);
  const int align = std::min({alignment_of(c.a), alignment_of(c.b), alignment_of(c.d)});
  const int align_epi =
      has_bias(c.epilogue) ? std::min(alignment_of(c.aux), alignment_of(c.bias)) : alignment_of(c.aux);
  const EpilogueKey key{device, c.dtype, c.m, c.n, c.k, c.a_transposed, static_cast<int>(c.epilogue), align, align_epi};
  static std::mutex mutex;
  static std::unordered_map<EpilogueKey, EpiloguePlan, EpilogueKeyHash> plans;
  // The pointers are attributes of the shared descriptor: set and used under the lock.
  std::lock_guard<std::mutex> lock(mutex);
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(key, dev, c)).first;
  const EpiloguePlan& plan = it->second;
  if (!plan.usable) return false;
  set_pointers(plan.desc, c);
  const float alpha = 1, beta = 0;
  KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, plan.desc, &alpha, c.a, plan.a, c.b, plan.b, &beta, c.d, plan.d, c.d,
                                   plan.d, &plan.algo, ops::cuda::lt_workspace(device, stream),
                                   ops::cuda::kLtWorkspaceBytes, stream));
  return true;
}

}  // namespace kiln::te::cuda
