#include "kiln/te/cuda/grouped_gemm_chunked.h"

#include <array>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "kiln/ops/cuda/cublaslt_device.h"
#include "kiln/ops/cuda/cuda_host.h"
#include "kiln/ops/linalg.h"
#include "kiln/runtime/cuda/cuda_context.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/hash_mix.h"
#include "kiln/te/cuda/device_pointer_table.h"
#include "kiln/te/cuda/grouped_gemm_types.h"
#include "kiln/te/cuda/row_block_copy.h"

namespace kiln::te::cuda {

namespace {

// A plan serves every batch count up to `count_bound` (a power of two): the experts' counts change
// with the routing every training step, and a plan per exact count made each new count pay a
// heuristic query (a training run was slower than `loop` for it while the bench, with fixed counts,
// never paid it). The algorithm is asked for at the bound and serves the smaller counts: its tile
// and reduction scheme do not depend on how many problems the pointer array holds, and any
// workspace it needs grows with the count, so the bound's need covers them. The layouts' batch
// count is set to the actual count at each launch.
struct Key {
  int device;
  DType dtype;
  bool trans_w;
  std::int64_t rows, o, k, count_bound;
  bool operator==(const Key&) const = default;
};

std::int64_t count_bound_of(std::int64_t count) {
  std::int64_t b = 1;
  while (b < count) b *= 2;
  return b;
}

struct KeyHash {
  std::size_t operator()(const Key& k) const {
    std::size_t h = static_cast<std::size_t>(k.device);
    for (std::uint64_t v : {static_cast<std::uint64_t>(k.dtype), static_cast<std::uint64_t>(k.trans_w),
                            static_cast<std::uint64_t>(k.rows), static_cast<std::uint64_t>(k.o),
                            static_cast<std::uint64_t>(k.k), static_cast<std::uint64_t>(k.count_bound)})
      hash_mix(h, v);
    return h;
  }
};

struct Plan {
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
  cublasLtMatmulAlgo_t algo{};
  bool usable = false;  // cuBLASLt offered an algorithm for the pointer-array batch
};

cublasLtMatrixLayout_t pointer_array_layout(cudaDataType_t type, std::int64_t rows, std::int64_t cols,
                                            std::int64_t count) {
  cublasLtMatrixLayout_t l = nullptr;
  KILN_CUBLAS_CHECK(
      cublasLtMatrixLayoutCreate(&l, type, static_cast<std::uint64_t>(rows), static_cast<std::uint64_t>(cols), rows));
  const int n = static_cast<int>(count);
  const std::uint32_t mode = CUBLASLT_BATCH_MODE_POINTER_ARRAY;
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)));
  KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_MODE, &mode, sizeof(mode)));
  return l;
}

// Column-major, per problem: C^T [O, rows] = op(W_e) [O, K] * X^T [K, rows]. W_e row-major [O, K] is
// column-major K x O, used transposed; with trans_w, W_e row-major [K, O] is column-major O x K, used
// as it is. X's block row-major [rows, K] is column-major K x rows; Y's block is O x rows.
Plan make_plan(const Key& key, cublasLtHandle_t handle) {
  Plan p;
  cudaDataType_t type{};
  cublasComputeType_t compute{};
  KILN_CHECK(grouped_gemm_types(key.dtype, &type, &compute), "grouped_gemm_chunked: dtype {}", dtype_name(key.dtype));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&p.desc, compute, CUDA_R_32F));
  const cublasOperation_t op_w = key.trans_w ? CUBLAS_OP_N : CUBLAS_OP_T, op_x = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_w, sizeof(op_w)));
  KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_x, sizeof(op_x)));
  p.a = key.trans_w ? pointer_array_layout(type, key.o, key.k, key.count_bound)
                    : pointer_array_layout(type, key.k, key.o, key.count_bound);
  p.b = pointer_array_layout(type, key.k, key.rows, key.count_bound);
  p.c = pointer_array_layout(type, key.o, key.rows, key.count_bound);
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  std::uint64_t ws = ops::cuda::kLtWorkspaceBytes;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
  // The problems' addresses are 16-byte aligned (checked by the caller), not more.
  const std::uint32_t align = 16;
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &align, sizeof(align)));
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, p.desc, p.a, p.b, p.c, p.c, pref, 1, &result, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  p.usable = st == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.usable) p.algo = result.algo;
  return p;
}

// Guards the plan table and the plans' layouts, whose batch count each launch sets.
std::mutex& plans_mutex() {
  static std::mutex mutex;
  return mutex;
}

// Sets the batch count of a plan's layouts (the caller holds plans_mutex()).
void set_batch_count(const Plan& p, std::int64_t count) {
  const int n = static_cast<int>(count);
  for (cublasLtMatrixLayout_t l : {p.a, p.b, p.c})
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutSetAttribute(l, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &n, sizeof(n)));
}

const Plan& plan_for(const Key& key, cublasLtHandle_t handle) {
  static std::unordered_map<Key, Plan, KeyHash> plans;
  std::lock_guard lock(plans_mutex());
  auto it = plans.find(key);
  if (it == plans.end()) it = plans.emplace(key, make_plan(key, handle)).first;
  return it->second;  // unordered_map nodes are stable
}

// The problems of one batched launch: the addresses of W_e, X's block and Y's (or the scratch's) block.
struct Batch {
  std::int64_t rows = 0;
  std::vector<const void*> w, x, y;
};

}  // namespace

bool grouped_gemm_chunked(const Tensor& x, const Tensor& w, std::span<const std::int64_t> offsets, bool trans_w,
                          const Tensor& y) {
  cudaDataType_t type{};
  cublasComputeType_t compute{};
  if (x.dtype() != w.dtype() || x.dtype() != y.dtype() || !grouped_gemm_types(x.dtype(), &type, &compute)) return false;
  const std::int64_t experts = w.size(0), total = x.size(0), kdim = x.size(1), odim = y.size(1);
  const std::size_t elem = x.element_size();
  if ((kdim * static_cast<std::int64_t>(elem)) % 16 != 0 || (odim * static_cast<std::int64_t>(elem)) % 16 != 0)
    return false;
  for (const Tensor* t : {&x, &w, &y})
    if (reinterpret_cast<std::uintptr_t>(t->data_ptr()) % 16 != 0) return false;
  auto at = [elem](const Tensor& t, std::int64_t element) {
    return static_cast<const void*>(static_cast<const char*>(t.data_ptr()) + static_cast<std::size_t>(element) * elem);
  };

  // Batch 0: the large blocks; batch 1: the full blocks; batch 2 + i: the partial blocks padded to
  // (i + 1) * kRemainderStep rows. Batch 2 + i holds at most one block per expert.
  constexpr std::size_t kBatches = kChunkRows / kRemainderStep + 2;
  std::array<Batch, kBatches> batches;
  batches[0].rows = kLargeChunkRows;
  batches[1].rows = kChunkRows;
  for (std::size_t i = 2; i < kBatches; ++i) batches[i].rows = static_cast<std::int64_t>(i - 1) * kRemainderStep;
  struct Partial {
    std::int64_t expert, first_row, rows, slot;
  };
  std::vector<Partial> partials, exact;
  for (std::int64_t e = 0; e < experts; ++e) {
    const std::int64_t lo = offsets[static_cast<std::size_t>(e)], hi = offsets[static_cast<std::size_t>(e) + 1];
    const void* we = at(w, e * w.size(1) * w.size(2));
    std::int64_t r = lo;
    for (Batch* b : {&batches[0], &batches[1]}) {
      for (; r + b->rows <= hi; r += b->rows) {
        b->w.push_back(we);
        b->x.push_back(at(x, r * kdim));
        b->y.push_back(at(y, r * odim));
      }
    }
    if (r == hi) continue;
    const std::int64_t rows = hi - r, padded = (rows + kRemainderStep - 1) / kRemainderStep * kRemainderStep;
    if (r + padded > total) {  // the padding would read past x: this block runs on its exact rows
      exact.push_back({e, r, rows, -1});
    } else {
      partials.push_back({e, r, rows, static_cast<std::int64_t>(partials.size())});
    }
  }

  const int index = y.device().index;
  DeviceGuard guard(index);
  const cudaStream_t stream = kiln::cuda_stream(index);
  // The partial blocks' outputs: kChunkRows rows each in a scratch buffer, copied into y afterwards.
  ops::cuda::Scratch scratch(partials.size() * static_cast<std::size_t>(kChunkRows * odim) * elem, index);
  for (const Partial& p : partials) {
    Batch& b = batches[static_cast<std::size_t>((p.rows + kRemainderStep - 1) / kRemainderStep) + 1];
    b.w.push_back(at(w, p.expert * w.size(1) * w.size(2)));
    b.x.push_back(at(x, p.first_row * kdim));
    b.y.push_back(static_cast<const char*>(scratch.ptr()) +
                  static_cast<std::size_t>(p.slot * kChunkRows * odim) * elem);
  }

  ops::cuda::LtDevice& dev = ops::cuda::lt_device(index);
  // Every batch must have an algorithm before anything is launched, so that a refusal leaves y to
  // the caller's fallback untouched.
  std::array<const Plan*, kBatches> plans{};
  std::size_t pointers = 0;
  for (std::size_t i = 0; i < kBatches; ++i) {
    if (batches[i].w.empty()) continue;
    plans[i] = &plan_for(Key{index, x.dtype(), trans_w, batches[i].rows, odim, kdim,
                             count_bound_of(static_cast<std::int64_t>(batches[i].w.size()))},
                         dev.handle);
    if (!plans[i]->usable) return false;
    pointers += 3 * batches[i].w.size();
  }
  std::vector<const void*> table;
  table.reserve(pointers);
  for (const Batch& b : batches) {
    table.insert(table.end(), b.w.begin(), b.w.end());
    table.insert(table.end(), b.x.begin(), b.x.end());
    table.insert(table.end(), b.y.begin(), b.y.end());
  }
  ops::cuda::Scratch device_table(table.size() * sizeof(void*), index);
  void** dev_table = device_table.as<void*>();
  if (!table.empty()) write_device_pointer_table(table.data(), table.size(), dev_table, stream);

  const float one = 1.0f, zero = 0.0f;
  void* workspace = ops::cuda::lt_workspace(index, stream);
  {
    std::lock_guard lock(plans_mutex());  // the layouts' batch count is set per launch
    std::size_t next = 0;
    for (std::size_t i = 0; i < kBatches; ++i) {
      const std::size_t n = batches[i].w.size();
      if (n == 0) continue;
      void** pw = dev_table + next;
      void** px = pw + n;
      void** py = px + n;
      next += 3 * n;
      const Plan& p = *plans[i];
      set_batch_count(p, static_cast<std::int64_t>(n));
      KILN_CUBLAS_CHECK(cublasLtMatmul(dev.handle, p.desc, &one, pw, p.a, px, p.b, &zero, py, p.c, py, p.c, &p.algo,
                                       workspace, ops::cuda::kLtWorkspaceBytes, stream));
    }
  }
  if (!partials.empty()) {
    std::vector<RowBlockCopy> jobs;
    jobs.reserve(partials.size());
    for (const Partial& p : partials)
      jobs.push_back(
          {static_cast<const char*>(scratch.ptr()) + static_cast<std::size_t>(p.slot * kChunkRows * odim) * elem,
           static_cast<char*>(y.data_ptr()) + static_cast<std::size_t>(p.first_row * odim) * elem, p.rows});
    copy_row_blocks(jobs, odim, elem, stream);
  }
  for (const Partial& p : exact) {
    const Tensor xe = x.narrow(0, p.first_row, p.rows).view({1, p.rows, kdim});
    const Tensor we = w.select(0, p.expert).view({1, w.size(1), w.size(2)});
    ops::gemm_into(xe, we, y.narrow(0, p.first_row, p.rows).view({1, p.rows, odim}), false, !trans_w, 1, 0);
  }
  return true;
}

}  // namespace kiln::te::cuda
