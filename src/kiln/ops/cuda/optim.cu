// CUDA multi-tensor optimizer steps (Adam/AdamW, SGD with momentum) and sum of squares, each ONE
// launch over every tensor. The steps read f32 or bf16/f16 gradients and may write the model's
// bf16/f16 copy of the updated fp32 master weights in the same pass (mixed precision). The per-tensor table (pointers,
// sizes, chunk offsets) lives in device memory and is cached by content: a training loop that passes the same tensors
// every step reuses the table without any host-to-device copy, which also makes the launch capturable in a CUDA graph.
// A new table is staged in pinned memory (kept with the cache entry) and copied async. No host synchronisation
// anywhere. The learning rate and the Adam step count come from the host (frozen into a captured launch) unless
// AdamParams/SgdParams::lr_ptr/step_ptr are set: then the kernel reads them from device memory when it runs (capturable
// optimizers, CUDA graphs). Tables built or used while the stream is being captured stay cached for good: the graph
// reads them (and re-copies them from their pinned staging) at every replay.
#include <cstring>
#include <mutex>
#include <vector>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/ops/cuda/cuda_kernels.h"
#include "kiln/runtime/pinned_memory.h"

namespace kiln::ops::cuda {

namespace {

constexpr std::int64_t kChunk = 16384;  // elements per block-chunk (a multiple of 4)

struct TensorEntry {
  void* p[5];
  std::int64_t n;
  std::int64_t chunk_begin;  // first global chunk of this tensor
  std::int32_t dtype;
  std::int32_t pad;
};

struct TableCache {
  struct Entry {
    int device;
    std::vector<TensorEntry> host;
    PinnedBuffer staging;
    void* device_table = nullptr;
    bool in_graph = false;  // a captured graph uses it: never evicted
  };
  std::mutex mutex;
  std::vector<Entry> entries;  // small; linear search by content
};

// Returns the device copy of `table` (cached by content), copying it in stream order if new.
const TensorEntry* device_table(const std::vector<TensorEntry>& table, int index, cudaStream_t stream) {
  static TableCache cache;
  std::lock_guard<std::mutex> lock(cache.mutex);
  const std::size_t bytes = table.size() * sizeof(TensorEntry);
  cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
  KILN_CUDA_CHECK(cudaStreamIsCapturing(stream, &status));
  const bool capturing = status != cudaStreamCaptureStatusNone;
  for (auto& e : cache.entries)
    if (e.device == index && e.host.size() == table.size() && std::memcmp(e.host.data(), table.data(), bytes) == 0) {
      e.in_graph = e.in_graph || capturing;
      return static_cast<const TensorEntry*>(e.device_table);
    }
  // Bounded: drop the oldest entry no graph uses (stream-ordered reuse is safe). Never while
  // capturing: freeing pinned memory is not allowed then.
  if (!capturing && cache.entries.size() >= 64) {
    for (auto it = cache.entries.begin(); it != cache.entries.end(); ++it) {
      if (it->in_graph) continue;
      backend_for(Device::cuda(it->device)).deallocate(it->device_table, it->device);
      cache.entries.erase(it);
      break;
    }
  }
  TableCache::Entry e;
  e.device = index;
  e.host = table;
  e.in_graph = capturing;
  if (capturing) {
    RelaxedCaptureMode relaxed;  // cudaHostAlloc is not stream work; capture would refuse it
    e.staging = allocate_pinned(bytes);
  } else {
    e.staging = allocate_pinned(bytes);
  }
  std::memcpy(e.staging.get(), table.data(), bytes);
  e.device_table = backend_for(Device::cuda(index)).allocate(bytes, index);
  KILN_CUDA_CHECK(cudaMemcpyAsync(e.device_table, e.staging.get(), bytes, cudaMemcpyHostToDevice, stream));
  cache.entries.push_back(std::move(e));
  return static_cast<const TensorEntry*>(cache.entries.back().device_table);
}

// Builds the table into a reused thread-local vector (no allocation in steady state).
template <std::size_t N>
std::vector<TensorEntry>& build_table(const std::array<std::span<const Tensor>, N>& lists, std::int64_t& chunks,
                                      const char* op) {
  thread_local std::vector<TensorEntry> table;
  table.clear();
  chunks = 0;
  const std::size_t count = lists[0].size();
  for (std::size_t l = 1; l < N; ++l)
    KILN_CHECK(lists[l].size() == count, "{}: {} tensors in list 0 but {} in list {}", op, count, lists[l].size(), l);
  for (std::size_t i = 0; i < count; ++i) {
    TensorEntry e{};
    const Tensor& t0 = lists[0][i];
    e.n = t0.numel();
    e.dtype = static_cast<std::int32_t>(t0.dtype());
    for (std::size_t l = 0; l < N; ++l) {
      const Tensor& t = lists[l][i];
      KILN_CHECK(t.is_contiguous() && t.numel() == e.n,
                 "{}: tensor {} of list {} is {} (expected contiguous, {} elements)", op, i, l, t.describe(), e.n);
      e.p[l] = t.data_ptr();
    }
    if (e.n == 0) continue;
    e.chunk_begin = chunks;
    chunks += (e.n + kChunk - 1) / kChunk;
    table.push_back(e);
  }
  return table;
}

// The tensor holding global chunk `c`: binary search over chunk_begin.
__device__ __forceinline__ int find_tensor(const TensorEntry* t, int count, std::int64_t c) {
  int lo = 0, hi = count - 1;
  while (lo < hi) {
    int mid = (lo + hi + 1) >> 1;
    if (t[mid].chunk_begin <= c)
      lo = mid;
    else
      hi = mid - 1;
  }
  return lo;
}

// Every derived constant is computed in double on the host and rounded once: 1.f - 0.999f in float
// is 0.00099998713 (1.3e-5 relative error, since beta2 itself was rounded), which moved parameters
// whose second moment is dominated by the new gradient by ~1e-5 relative (the reference, and
// PyTorch, form 1 - beta2 from the double).
struct AdamArgs {
  float beta1, beta2, eps, weight_decay;
  float one_minus_beta1, one_minus_beta2;
  float decay;         // 1 - lr * weight_decay (decoupled)
  float step_size;     // lr / (1 - beta1^step)
  float inv_sqrt_bc2;  // 1 / sqrt(1 - beta2^step)
  bool decoupled;
  // Capturable mode: lr and step are read on the device and the three derived constants above
  // are computed there, with the host path's formulas (double, explicit rounding: no FMA).
  const double* lr_ptr;
  const double* step_ptr;
  double beta1_d, beta2_d, weight_decay_d;
  const float* grad_scale;  // AdamParams::grad_scale_ptr (null: 1)
};

__device__ __forceinline__ void adam_device_scalars(AdamArgs& a) {
  const double lr = *a.lr_ptr, step = *a.step_ptr;
  a.decay = static_cast<float>(__dsub_rn(1.0, __dmul_rn(lr, a.weight_decay_d)));
  a.step_size = static_cast<float>(__ddiv_rn(lr, __dsub_rn(1.0, pow(a.beta1_d, step))));
  a.inv_sqrt_bc2 = static_cast<float>(__ddiv_rn(1.0, __dsqrt_rn(__dsub_rn(1.0, pow(a.beta2_d, step)))));
}

__device__ __forceinline__ void adam_one(float& p, float g, float& m, float& v, const AdamArgs& a) {
  if (a.weight_decay != 0.f) {
    if (a.decoupled)
      p *= a.decay;
    else
      g += a.weight_decay * p;
  }
  m = a.beta1 * m + a.one_minus_beta1 * g;
  v = a.beta2 * v + a.one_minus_beta2 * g * g;
  const float denom = sqrtf(v) * a.inv_sqrt_bc2 + a.eps;
  p -= a.step_size * m / denom;
}

// G: the gradients' element type (float, or BFloat16/Half when accumulated in reduced precision).
// O: the model copy's element type, void when there is none (fp32 parameters updated in place).
template <class O>
__device__ __forceinline__ void store_model(void* out, std::int64_t k, float w) {
  if constexpr (!std::is_void_v<O>) static_cast<O*>(out)[k] = store_as<O>(w);
}

template <class G, class O>
__device__ __forceinline__ bool vector_aligned(const TensorEntry& e) {
  // float4 on the f32 lists; four 16-bit gradients or model elements as one 8-byte access.
  auto at = [&](int l) { return reinterpret_cast<std::uintptr_t>(e.p[l]); };
  std::uintptr_t wide = at(0) | at(2) | at(3), narrow = 0;  // 16-byte and 8-byte accesses
  if constexpr (std::is_same_v<G, float>)
    wide |= at(1);
  else
    narrow |= at(1);
  if constexpr (std::is_same_v<O, float>)
    wide |= at(4);
  else if constexpr (!std::is_void_v<O>)
    narrow |= at(4);
  return (wide & 15) == 0 && (narrow & 7) == 0;
}

// Four consecutive gradients as floats (k: a multiple of 4, the list aligned: vector_aligned).
template <class G>
__device__ __forceinline__ float4 load_grad4(const G* g, std::int64_t k) {
  if constexpr (std::is_same_v<G, float>) {
    return *reinterpret_cast<const float4*>(g + k);
  } else {
    const uint2 raw = *reinterpret_cast<const uint2*>(g + k);
    G v[4];
    memcpy(v, &raw, sizeof(raw));
    return make_float4(load_as<float>(v[0]), load_as<float>(v[1]), load_as<float>(v[2]), load_as<float>(v[3]));
  }
}

// The four updated masters into the model copy in one store (16-bit copies: 8 bytes).
template <class O>
__device__ __forceinline__ void store_model4(void* out, std::int64_t k, const float4& w) {
  if constexpr (std::is_same_v<O, float>) {
    *reinterpret_cast<float4*>(static_cast<float*>(out) + k) = w;
  } else if constexpr (!std::is_void_v<O>) {
    const O v[4] = {store_as<O>(w.x), store_as<O>(w.y), store_as<O>(w.z), store_as<O>(w.w)};
    uint2 raw;
    memcpy(&raw, v, sizeof(raw));
    *reinterpret_cast<uint2*>(static_cast<O*>(out) + k) = raw;
  }
}

template <class G, class O>
__global__ void __launch_bounds__(256)
    adam_kernel(const TensorEntry* table, int count, std::int64_t total_chunks, AdamArgs a) {
  if (a.lr_ptr) adam_device_scalars(a);  // every thread: two pow() per thread, no block sync
  // The clip coefficient, multiplied in float as a scaling pass over f32 gradients would (x * 1 is x).
  const float gs = a.grad_scale ? *a.grad_scale : 1.f;
  for (std::int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const TensorEntry& e = table[find_tensor(table, count, c)];
    const std::int64_t begin = (c - e.chunk_begin) * kChunk;
    const std::int64_t end = begin + kChunk < e.n ? begin + kChunk : e.n;
    float* p = static_cast<float*>(e.p[0]);
    const G* g = static_cast<const G*>(e.p[1]);
    float* m = static_cast<float*>(e.p[2]);
    float* v = static_cast<float*>(e.p[3]);
    void* out = e.p[4];
    std::int64_t i = begin;
    if (vector_aligned<G, O>(e)) {
      const std::int64_t vend = begin + (end - begin) / 4 * 4;
      for (std::int64_t k = begin + threadIdx.x * 4; k < vend; k += blockDim.x * 4) {
        float4 pp = *reinterpret_cast<float4*>(p + k);
        float4 gg = load_grad4(g, k);
        gg = make_float4(__fmul_rn(gg.x, gs), __fmul_rn(gg.y, gs), __fmul_rn(gg.z, gs), __fmul_rn(gg.w, gs));
        float4 mm = *reinterpret_cast<float4*>(m + k);
        float4 vv = *reinterpret_cast<float4*>(v + k);
        adam_one(pp.x, gg.x, mm.x, vv.x, a);
        adam_one(pp.y, gg.y, mm.y, vv.y, a);
        adam_one(pp.z, gg.z, mm.z, vv.z, a);
        adam_one(pp.w, gg.w, mm.w, vv.w, a);
        *reinterpret_cast<float4*>(p + k) = pp;
        *reinterpret_cast<float4*>(m + k) = mm;
        *reinterpret_cast<float4*>(v + k) = vv;
        store_model4<O>(out, k, pp);
      }
      i = vend;
    }
    for (std::int64_t k = i + threadIdx.x; k < end; k += blockDim.x) {
      adam_one(p[k], __fmul_rn(load_as<float>(g[k]), gs), m[k], v[k], a);
      store_model<O>(out, k, p[k]);
    }
  }
}

struct SgdArgs {
  float lr, momentum, dampening, weight_decay;
  bool nesterov, first_step, has_momentum;
  const double* lr_ptr;  // capturable mode: replaces lr (rounded to float as the host does)
};

template <class G, class O>
__global__ void __launch_bounds__(256)
    sgd_kernel(const TensorEntry* table, int count, std::int64_t total_chunks, SgdArgs a) {
  if (a.lr_ptr) a.lr = static_cast<float>(*a.lr_ptr);
  for (std::int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const TensorEntry& e = table[find_tensor(table, count, c)];
    const std::int64_t begin = (c - e.chunk_begin) * kChunk;
    const std::int64_t end = begin + kChunk < e.n ? begin + kChunk : e.n;
    float* p = static_cast<float*>(e.p[0]);
    const G* g = static_cast<const G*>(e.p[1]);
    float* buf = static_cast<float*>(e.p[2]);
    void* out = e.p[3];
    for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
      float d = load_as<float>(g[k]);
      if (a.weight_decay != 0.f) d += a.weight_decay * p[k];
      if (a.has_momentum) {
        float b = a.first_step ? d : a.momentum * buf[k] + (1.f - a.dampening) * d;
        buf[k] = b;
        d = a.nesterov ? d + a.momentum * b : b;
      }
      p[k] -= a.lr * d;
      store_model<O>(out, k, p[k]);
    }
  }
}

__global__ void __launch_bounds__(256)
    sumsq_kernel(const TensorEntry* table, int count, std::int64_t total_chunks, float* partial) {
  __shared__ float sh[32];
  float s = 0;
  for (std::int64_t c = blockIdx.x; c < total_chunks; c += gridDim.x) {
    const TensorEntry& e = table[find_tensor(table, count, c)];
    const std::int64_t begin = (c - e.chunk_begin) * kChunk;
    const std::int64_t end = begin + kChunk < e.n ? begin + kChunk : e.n;
    const DType t = static_cast<DType>(e.dtype);
    if (t == DType::F32) {
      const float* x = static_cast<const float*>(e.p[0]);
      std::int64_t i = begin;
      if (reinterpret_cast<std::uintptr_t>(x) % 16 == 0) {
        // 16-byte loads into four independent sums: one 4-byte load and one dependent add per
        // element ran at a third of the bandwidth (2.6 ms for 620M gradients on an H100).
        const std::int64_t vend = begin + (end - begin) / 4 * 4;
        float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
#pragma unroll 4
        for (std::int64_t k = begin + threadIdx.x * 4; k < vend; k += blockDim.x * 4) {
          const float4 v = *reinterpret_cast<const float4*>(x + k);
          s0 += v.x * v.x;
          s1 += v.y * v.y;
          s2 += v.z * v.z;
          s3 += v.w * v.w;
        }
        s += (s0 + s1) + (s2 + s3);
        i = vend;
      }
      for (std::int64_t k = i + threadIdx.x; k < end; k += blockDim.x) s += x[k] * x[k];
    } else {
      for (std::int64_t k = begin + threadIdx.x; k < end; k += blockDim.x) {
        float v = static_cast<float>(load_dyn(e.p[0], t, k));
        s += v * v;
      }
    }
  }
  s = block_sum(s, sh);
  if (threadIdx.x == 0) partial[blockIdx.x] = s;
}

__global__ void sumsq_finalize_kernel(const float* partial, int n, float* out) {
  __shared__ double sh[32];
  double s = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) s += partial[i];
  s = block_sum(s, sh);
  if (threadIdx.x == 0) *out = static_cast<float>(s);
}

int optim_grid(std::int64_t chunks, int index) {
  return static_cast<int>(std::max<std::int64_t>(1, std::min<std::int64_t>(chunks, device_info(index).sms * 8)));
}

}  // namespace

namespace {

// One launch takes one gradient dtype and one model dtype; the optimizer groups its tensors so.
DType uniform_dtype(std::span<const Tensor> list, const char* op, const char* what) {
  const DType t = list.front().dtype();
  for (const Tensor& x : list)
    KILN_CHECK(x.dtype() == t, "{}: every {} of one call must share a dtype ({} and {})", op, what, dtype_name(t),
               x.describe());
  return t;
}

// Calls fn.template operator()<G, O>() for the gradients' and the model copies' element types.
template <class Fn>
void dispatch_grad_model(std::span<const Tensor> grads, std::span<const Tensor> model_params, const char* op, Fn&& fn) {
  auto with_model = [&]<class G>() {
    if (model_params.empty()) return fn.template operator()<G, void>();
    switch (uniform_dtype(model_params, op, "model parameter")) {
      case DType::BF16: return fn.template operator()<G, BFloat16>();
      case DType::F16: return fn.template operator()<G, Half>();
      case DType::F32: return fn.template operator()<G, float>();
      default:
        KILN_FAIL("{}: model parameters must be bfloat16, float16 or float32, got {}", op,
                  model_params.front().describe());
    }
  };
  switch (uniform_dtype(grads, op, "gradient")) {
    case DType::F32: return with_model.template operator()<float>();
    case DType::BF16: return with_model.template operator()<BFloat16>();
    case DType::F16: return with_model.template operator()<Half>();
    default: KILN_FAIL("{}: gradients must be float32, bfloat16 or float16, got {}", op, grads.front().describe());
  }
}

void check_model_list(const char* op, std::span<const Tensor> params, std::span<const Tensor> model_params) {
  KILN_CHECK(model_params.empty() || model_params.size() == params.size(),
             "{}: {} params but {} model params (expected none or one per param)", op, params.size(),
             model_params.size());
}

}  // namespace

void adam_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> exp_avg,
               std::span<const Tensor> exp_avg_sq, std::span<const Tensor> model_params, const AdamParams& p) {
  if (params.empty()) return;
  for (const Tensor& t : params)
    KILN_CHECK(t.dtype() == DType::F32, "adam_step: parameters must be float32, got {}", t.describe());
  for (std::span<const Tensor> state : {exp_avg, exp_avg_sq})
    for (const Tensor& t : state)
      KILN_CHECK(t.dtype() == DType::F32, "adam_step: optimizer state must be float32, got {}", t.describe());
  check_model_list("adam_step", params, model_params);
  Launch l(params[0]);
  std::int64_t chunks = 0;
  auto& table = model_params.empty()
                    ? build_table<4>({params, grads, exp_avg, exp_avg_sq}, chunks, "adam_step")
                    : build_table<5>({params, grads, exp_avg, exp_avg_sq, model_params}, chunks, "adam_step");
  if (chunks == 0) return;
  const TensorEntry* dt = device_table(table, l.index, l.stream);
  AdamArgs a;
  a.beta1 = static_cast<float>(p.beta1);
  a.beta2 = static_cast<float>(p.beta2);
  a.eps = static_cast<float>(p.eps);
  a.weight_decay = static_cast<float>(p.weight_decay);
  a.one_minus_beta1 = static_cast<float>(1.0 - p.beta1);
  a.one_minus_beta2 = static_cast<float>(1.0 - p.beta2);
  a.decay = static_cast<float>(1.0 - p.lr * p.weight_decay);
  const double step = static_cast<double>(p.step);
  a.step_size = static_cast<float>(p.lr / (1.0 - std::pow(p.beta1, step)));
  a.inv_sqrt_bc2 = static_cast<float>(1.0 / std::sqrt(1.0 - std::pow(p.beta2, step)));
  a.decoupled = p.decoupled_weight_decay;
  KILN_CHECK((p.lr_ptr == nullptr) == (p.step_ptr == nullptr), "adam_step: lr_ptr and step_ptr go together");
  a.lr_ptr = p.lr_ptr;
  a.step_ptr = p.step_ptr;
  a.beta1_d = p.beta1;
  a.beta2_d = p.beta2;
  a.weight_decay_d = p.weight_decay;
  a.grad_scale = p.grad_scale_ptr;
  const int grid = optim_grid(chunks, l.index);
  dispatch_grad_model(grads, model_params, "adam_step", [&]<class G, class O>() {
    adam_kernel<G, O><<<grid, 256, 0, l.stream>>>(dt, static_cast<int>(table.size()), chunks, a);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void sgd_step(std::span<const Tensor> params, std::span<const Tensor> grads, std::span<const Tensor> momentum_buffers,
              std::span<const Tensor> model_params, const SgdParams& p) {
  if (params.empty()) return;
  for (const Tensor& t : params)
    KILN_CHECK(t.dtype() == DType::F32, "sgd_step: parameters must be float32, got {}", t.describe());
  check_model_list("sgd_step", params, model_params);
  Launch l(params[0]);
  const bool has_momentum = p.momentum != 0 && !momentum_buffers.empty();
  for (const Tensor& t : momentum_buffers)
    KILN_CHECK(!has_momentum || t.dtype() == DType::F32, "sgd_step: momentum buffers must be float32, got {}",
               t.describe());
  // The table's lists are (params, grads, momentum or params again, model copies): fixed slots,
  // so the kernel finds each list at one index. The stand-in list is never read.
  std::span<const Tensor> third = has_momentum ? momentum_buffers : params;
  std::int64_t chunks = 0;
  auto& table = model_params.empty() ? build_table<3>({params, grads, third}, chunks, "sgd_step")
                                     : build_table<4>({params, grads, third, model_params}, chunks, "sgd_step");
  if (chunks == 0) return;
  const TensorEntry* dt = device_table(table, l.index, l.stream);
  SgdArgs a{static_cast<float>(p.lr),
            static_cast<float>(p.momentum),
            static_cast<float>(p.dampening),
            static_cast<float>(p.weight_decay),
            p.nesterov,
            p.first_step,
            has_momentum,
            p.lr_ptr};
  const int grid = optim_grid(chunks, l.index);
  dispatch_grad_model(grads, model_params, "sgd_step", [&]<class G, class O>() {
    sgd_kernel<G, O><<<grid, 256, 0, l.stream>>>(dt, static_cast<int>(table.size()), chunks, a);
  });
  KILN_CUDA_CHECK_LAUNCH();
}

void sum_of_squares(std::span<const Tensor> tensors, const Tensor& out) {
  KILN_CHECK(out.dtype() == DType::F32 && out.numel() == 1, "sum_of_squares: out must be a float32 scalar, got {}",
             out.describe());
  Launch l(out);
  std::int64_t chunks = 0;
  auto& table = build_table<1>({tensors}, chunks, "sum_of_squares");
  if (chunks == 0) {
    KILN_CUDA_CHECK(cudaMemsetAsync(out.data_ptr(), 0, sizeof(float), l.stream));
    return;
  }
  const TensorEntry* dt = device_table(table, l.index, l.stream);
  const int grid = optim_grid(chunks, l.index);
  Scratch partial(sizeof(float) * grid, l.index);
  sumsq_kernel<<<grid, 256, 0, l.stream>>>(dt, static_cast<int>(table.size()), chunks, partial.as<float>());
  KILN_CUDA_CHECK_LAUNCH();
  sumsq_finalize_kernel<<<1, 256, 0, l.stream>>>(partial.as<float>(), grid, static_cast<float*>(out.data_ptr()));
  KILN_CUDA_CHECK_LAUNCH();
}

}  // namespace kiln::ops::cuda
