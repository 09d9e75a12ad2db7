// CUDA FP8 GEMM through cuBLASLt. Kiln's native form out[M, N] = a[M, K] . b[N, K]^T (both
// operands K-contiguous) is exactly the "TN" layout Hopper's FP8 tensor-core kernels require:
// as a column-major problem D^T (N x M) = op_T(b as K x N) * (a as K x M), so cuBLASLt's A is b
// (TRANSA = T) and its B is a (TRANSB = N), with no copy. The scale-inverses are device pointers
// (A/B_SCALE_POINTER), so the GEMM never reads a scale on the host.
//
// Per tensor: e4m3 x e4m3, e4m3 x e5m2, e5m2 x e4m3; bf16 / f32 output, or fp8 output with a D
// scale and amax(D); epilogues bias, GELU (tanh), GELU+bias; fast accumulation optional.
// Block scaling (cuBLAS >= 12.9, Hopper): cuBLASLt's VEC128_32F (1x128) and BLK128x128_32F
// (128x128) modes; 1x128 x 1x128, 1x128 x 128x128 and 128x128 x 1x128, bf16 / f32 output, no
// epilogue but bias, no fast accumulation. What cuBLASLt cannot take (128x128 x 128x128, other
// GPUs, older cuBLASLt) runs on Kiln's own CUDA-core kernel (fp8_block_gemm.cu).
//
// Descriptors, layouts and the heuristic's algorithm are cached per problem; the pointers are set
// on the cached descriptor under a lock just before each cublasLtMatmul.
#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "kiln/ops/cuda/cublaslt_device.h"
#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/cuda/fp8_cuda.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/hash_mix.h"
#include "kiln/runtime/vendor/cuda.h"

namespace kiln::ops::cuda {

namespace {

cudaDataType_t cuda_type(DType t) {
  switch (t) {
    case DType::F8E4M3: return CUDA_R_8F_E4M3;
    case DType::F8E5M2: return CUDA_R_8F_E5M2;
    case DType::BF16: return CUDA_R_16BF;
    case DType::F32: return CUDA_R_32F;
    default: KILN_FAIL("fp8_gemm: dtype {} has no cuBLASLt type here", dtype_name(t));
  }
}

std::int32_t scale_mode(ScalingLayout l) {
  switch (l) {
    case ScalingLayout::PerTensor: return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
    case ScalingLayout::Block1x128: return CUBLASLT_MATMUL_MATRIX_SCALE_VEC128_32F;
    case ScalingLayout::Block128x128: return CUBLASLT_MATMUL_MATRIX_SCALE_BLK128x128_32F;
  }
  return CUBLASLT_MATMUL_MATRIX_SCALE_SCALAR_32F;
}

cublasLtEpilogue_t lt_epilogue(Fp8Epilogue e) {
  switch (e) {
    case Fp8Epilogue::None: return CUBLASLT_EPILOGUE_DEFAULT;
    case Fp8Epilogue::Bias: return CUBLASLT_EPILOGUE_BIAS;
    case Fp8Epilogue::Gelu: return CUBLASLT_EPILOGUE_GELU;
    case Fp8Epilogue::GeluBias: return CUBLASLT_EPILOGUE_GELU_BIAS;
  }
  return CUBLASLT_EPILOGUE_DEFAULT;
}

struct Key {
  int device;
  DType a, b, out;
  ScalingLayout la, lb;
  bool fp8_out;
  Fp8Epilogue epilogue;
  bool fast_accum;
  bool accumulate;  // beta = 1: C (= D, float32) is read
  std::int64_t m, n, k;
  std::uint32_t align;  // bytes all of a, b and out are aligned to (the heuristic assumes it)
  bool operator==(const Key&) const = default;
};

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = static_cast<std::size_t>(k.device) * 1315423911u;
    auto mix = [&h](std::uint64_t v) { hash_mix(h, v); };
    mix(static_cast<std::uint64_t>(k.a) | static_cast<std::uint64_t>(k.b) << 8 |
        static_cast<std::uint64_t>(k.out) << 16 | static_cast<std::uint64_t>(k.la) << 24 |
        static_cast<std::uint64_t>(k.lb) << 32 | static_cast<std::uint64_t>(k.fp8_out) << 40 |
        static_cast<std::uint64_t>(k.epilogue) << 48 | static_cast<std::uint64_t>(k.fast_accum) << 56 |
        static_cast<std::uint64_t>(k.accumulate) << 57);
    mix(static_cast<std::uint64_t>(k.m));
    mix(static_cast<std::uint64_t>(k.n));
    mix(static_cast<std::uint64_t>(k.k));
    mix(k.align);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr, d = nullptr;  // cuBLASLt's roles
  cublasLtMatmulAlgo_t algo{};
};

template <class T>
void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const T& value) {
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, &value, sizeof(value)));
}

cublasLtMatrixLayout_t layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), rows));
  return l;
}

// The call's device pointers on the descriptor: before the heuristic (so it picks an algorithm
// for what is set: amax(D), bias, scales) and again before every launch.
void set_pointers(const Plan& p, const Fp8GemmArgs& g) {
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, g.b->scale_inv.data_ptr());
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, g.a->scale_inv.data_ptr());
  if (g.bias.defined()) set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, g.bias.data_ptr());
  if (g.fp8_out) {
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_D_SCALE_POINTER, g.fp8_out->scale.data_ptr());
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_AMAX_D_POINTER, g.fp8_out->amax.data_ptr());
  }
}

Plan make_plan(const Key& key, const LtDevice& dev, const Fp8GemmArgs& g) {
  Plan p;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  // cuBLASLt's A is Kiln's b ([N, K] row-major = K x N column-major, transposed), its B is a.
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, scale_mode(key.lb));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, scale_mode(key.la));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_FAST_ACCUM, static_cast<std::int8_t>(key.fast_accum ? 1 : 0));
  set_attr(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, lt_epilogue(key.epilogue));
  if (key.epilogue == Fp8Epilogue::Bias || key.epilogue == Fp8Epilogue::GeluBias)
    set_attr(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, static_cast<std::int32_t>(CUDA_R_16BF));
  p.a = layout(cuda_type(key.b), key.k, key.n);
  p.b = layout(cuda_type(key.a), key.k, key.m);
  p.d = layout(cuda_type(key.out), key.n, key.m);
  // With fp8 output cuBLASLt takes C as bf16 (C is not read: beta = 0); otherwise C is D's type
  // (read when accumulating).
  p.c = key.fp8_out ? layout(CUDA_R_16BF, key.n, key.m) : layout(cuda_type(key.out), key.n, key.m);

  set_pointers(p, g);

  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t ws = kLtWorkspaceBytes;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &key.align, sizeof(key.align)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(dev.handle, p.desc, p.a, p.b, p.c, p.d, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  KILN_CHECK(st == CUBLAS_STATUS_SUCCESS && found > 0,
             "fp8_gemm: cuBLASLt {} has no algorithm on sm_{}{} for a {} {} [{} x {}] x b {} {} [{} x {}] -> {}{} "
             "epilogue {}{} (status {})",
             cublasLtGetVersion(), dev.cc_major, dev.cc_minor, dtype_name(key.a), scaling_layout_name(key.la), key.m,
             key.k, dtype_name(key.b), scaling_layout_name(key.lb), key.n, key.k, dtype_name(key.out),
             key.fp8_out ? " (fp8 out)" : "", fp8_epilogue_name(key.epilogue), key.fast_accum ? ", fast accum" : "",
             static_cast<int>(st));
  p.algo = result.algo;
  return p;
}

bool aligned16(const void* p) { return (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0; }

std::uint32_t alignment_of(const void* p) {
  const auto v = reinterpret_cast<std::uintptr_t>(p);
  for (std::uint32_t a : {256u, 128u, 64u, 32u}) {
    if (v % a == 0) return a;
  }
  return 16;
}

// Block-scaled problems cuBLASLt runs: Hopper, cuBLASLt >= 12.9, not 128x128 x 128x128, pointers
// 16-byte aligned. Others go to Kiln's own kernel (fp8_block_gemm.cu).
bool cublaslt_takes_block(const LtDevice& dev, const Fp8GemmArgs& g) {
  return dev.cc_major == 9 && cublasLtGetVersion() >= 120900 &&
         !(g.a->layout == ScalingLayout::Block128x128 && g.b->layout == ScalingLayout::Block128x128) &&
         aligned16(g.a->data.data_ptr()) && aligned16(g.b->data.data_ptr()) && aligned16(g.out.data_ptr());
}

}  // namespace

std::string fp8_gemm_unsupported(const Fp8GemmArgs& g) {
  if (g.a->layout != ScalingLayout::PerTensor) return {};  // cuBLASLt, or Kiln's own kernel
  const LtDevice& dev = lt_device(g.a->device().index);
  if (dev.cc_major * 10 + dev.cc_minor < 89)
    return fmt::format(
        "per-tensor FP8 GEMMs run on FP8 tensor cores, which need compute capability 8.9 or newer "
        "(this GPU is {}.{})",
        dev.cc_major, dev.cc_minor);
  for (const auto& [p, name] : {std::pair{g.a->data.data_ptr(), "a.data"}, std::pair{g.b->data.data_ptr(), "b.data"},
                                std::pair{g.out.data_ptr(), "out"}})
    if (!aligned16(p)) return fmt::format("{} is not 16-byte aligned (cuBLASLt's FP8 kernels need it)", name);
  return {};
}

void fp8_gemm(const Fp8GemmArgs& g) {
  const int index = g.a->device().index;
  DeviceGuard guard(index);
  LtDevice& dev = lt_device(index);
  if (g.a->layout != ScalingLayout::PerTensor && !cublaslt_takes_block(dev, g)) {
    fp8_block_gemm_kiln(g);
    return;
  }
  const std::uint32_t align = std::min(
      {alignment_of(g.a->data.data_ptr()), alignment_of(g.b->data.data_ptr()), alignment_of(g.out.data_ptr())});
  const Key key{index,      g.a->dtype(), g.b->dtype(), g.out.dtype(), g.a->layout, g.b->layout, g.fp8_out != nullptr,
                g.epilogue, g.fast_accum, g.accumulate, g.a->rows(),   g.b->rows(), g.a->cols(), align};
  static std::mutex mutex;
  static std::unordered_map<Key, Plan, KeyHash> plans;
  std::lock_guard<std::mutex> lock(mutex);  // held over the attribute writes and the launch
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(key, dev, g)).first;
  const Plan& p = it->second;
  set_pointers(p, g);
  // accumulate: D = A B + C with C = D, the float32 out (a main gradient adding a weight gradient).
  const float alpha = 1.0f, beta = g.accumulate ? 1.0f : 0.0f;
  void* c = g.fp8_out ? nullptr : g.out.data_ptr();
  const cudaStream_t stream = cuda_stream(index);
  KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, p.desc, &alpha, g.b->data.data_ptr(), p.a, g.a->data.data_ptr(), p.b,
                                   &beta, c, p.c, g.out.data_ptr(), p.d, &p.algo, lt_workspace(index, stream),
                                   kLtWorkspaceBytes, stream));
  if (g.fp8_out) fp8_reciprocal(g.fp8_out->scale, g.fp8_out->scale_inv);
}

}  // namespace kiln::ops::cuda
