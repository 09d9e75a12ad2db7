// CUDA kernels of split_qkv_rope: Megatron's grouped QKV rows [B, T, G, (P + 2) D] to contiguous
// q [B, T, G P, D], k, v [B, T, G, D] (q and k rotated, v copied), and the gradients back, one
// launch each way. One block per (b, t) row: its threads walk the row's heads in order, so the
// reads of the row and the writes of its q, k and v heads are coalesced, in 16-byte vectors where
// D, the rotary width and the pointers allow. The rotation is apply_rope's (rope_pair), so the
// results equal split + apply_rope bit for bit.
#include <algorithm>
#include <initializer_list>
#include <type_traits>

#include "kiln/ops/cuda/cuda_common.cuh"
#include "kiln/te/cuda/rope_pair.cuh"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cuda {

namespace {

using ops::cuda::store_as;
using ops::cuda::Vec;

constexpr int kMaxThreads = 256;

struct QkvRopeShape {
  std::int64_t rows, t;  // rows = B T
  int groups, per_group, d, half;
  std::int64_t position_offset;
};

// Every head of a row has (D - R) / V work items: item j < R / V moves the V-wide chunks j and
// j + R / V (the rotated pairs; a value head copies them), item j >= R / V copies chunk j + R / V
// (a channel past the rotary part). In the forward `packed` is the qkv input and q, k, v outputs;
// in the backward `packed` is dqkv, written from dq, dk, dv (a null one contributes zeros). `sign`
// is -1 in the backward (rotation by -theta), as apply_rope's inverse.
template <class T, int V, bool kBackward>
__global__ void __launch_bounds__(kMaxThreads)
    split_qkv_rope_kernel(std::conditional_t<kBackward, T*, const T*> packed,
                          std::conditional_t<kBackward, const T*, T*> q, std::conditional_t<kBackward, const T*, T*> k,
                          std::conditional_t<kBackward, const T*, T*> v, const float* __restrict__ cos,
                          const float* __restrict__ sin, QkvRopeShape s, float sign) {
  using Pack = Vec<T, V>;
  const int slots = s.per_group + 2;
  const int pair_chunks = s.half / V;
  const int items_per_head = (s.d - s.half) / V;
  const int items = s.groups * slots * items_per_head;
  for (std::int64_t row = blockIdx.x; row < s.rows; row += gridDim.x) {
    const std::int64_t pos = s.position_offset + row % s.t;
    const float* c = cos + pos * s.half;
    const float* sn = sin + pos * s.half;
    for (int idx = threadIdx.x; idx < items; idx += blockDim.x) {
      const int head = idx / items_per_head;  // g * slots + slot: the head's place in the row
      const int j = idx - head * items_per_head;
      const int g = head / slots, slot = head - g * slots;
      const std::int64_t group_row = row * s.groups + g;
      auto packed_head = packed + (row * s.groups * slots + head) * s.d;
      auto part_head = slot < s.per_group    ? (q ? q + (group_row * s.per_group + slot) * s.d : nullptr)
                       : slot == s.per_group ? (k ? k + group_row * s.d : nullptr)
                                             : (v ? v + group_row * s.d : nullptr);
      const T* src;
      T* dst;
      if constexpr (kBackward) {
        src = part_head;
        dst = packed_head;
      } else {
        src = packed_head;
        dst = part_head;
      }
      const int first = j < pair_chunks ? j * V : j * V + s.half;  // the item's (first) chunk
      if (src == nullptr) {  // an undefined gradient: zeros, as the split's backward writes them
        Pack zero;
#pragma unroll
        for (int e = 0; e < V; ++e) zero.v[e] = store_as<T>(0.f);
        *reinterpret_cast<Pack*>(dst + first) = zero;
        if (j < pair_chunks) *reinterpret_cast<Pack*>(dst + first + s.half) = zero;
        continue;
      }
      const Pack a = *reinterpret_cast<const Pack*>(src + first);
      if (j >= pair_chunks) {
        *reinterpret_cast<Pack*>(dst + first) = a;
        continue;
      }
      const Pack b = *reinterpret_cast<const Pack*>(src + first + s.half);
      if (slot > s.per_group) {  // the value head: copied
        *reinterpret_cast<Pack*>(dst + first) = a;
        *reinterpret_cast<Pack*>(dst + first + s.half) = b;
        continue;
      }
      Pack o1, o2;
#pragma unroll
      for (int e = 0; e < V; ++e) rope_pair(a.v[e], b.v[e], c[first + e], sign * sn[first + e], o1.v[e], o2.v[e]);
      *reinterpret_cast<Pack*>(dst + first) = o1;
      *reinterpret_cast<Pack*>(dst + first + s.half) = o2;
    }
  }
}

const void* data_or_null(const Tensor& t) { return t.defined() ? t.data_ptr() : nullptr; }

// Launches the kernel with 16-byte vectors when D and R are whole vectors and every pointer is
// 16-byte aligned (the heads then are too: they start at multiples of D), else element by element.
template <class T, bool kBackward>
void launch_split_qkv_rope(const void* packed, const void* q, const void* k, const void* v, const Tensor& cos,
                           const Tensor& sin, const QkvRopeShape& s, const Tensor& like) {
  constexpr int kVec = 16 / sizeof(T);
  bool vectorised = s.d % kVec == 0 && s.half % kVec == 0;
  for (const void* p : std::initializer_list<const void*>{packed, q, k, v, cos.data_ptr(), sin.data_ptr()})
    vectorised = vectorised && (p == nullptr || ops::cuda::aligned16(p));
  const int vec = vectorised ? kVec : 1;
  const int items = s.groups * (s.per_group + 2) * ((s.d - s.half) / vec);
  const int threads = std::min(kMaxThreads, std::max(32, (items + 31) / 32 * 32));
  const ops::cuda::Launch on(like);
  const int blocks = ops::cuda::grid_for(s.rows * threads, threads, on.index);
  using In = std::conditional_t<kBackward, T*, const T*>;
  using Part = std::conditional_t<kBackward, const T*, T*>;
  auto run = [&]<int V>() {
    split_qkv_rope_kernel<T, V, kBackward><<<blocks, threads, 0, on.stream>>>(
        static_cast<In>(const_cast<void*>(packed)), static_cast<Part>(const_cast<void*>(q)),
        static_cast<Part>(const_cast<void*>(k)), static_cast<Part>(const_cast<void*>(v)),
        static_cast<const float*>(cos.data_ptr()), static_cast<const float*>(sin.data_ptr()), s,
        kBackward ? -1.f : 1.f);
  };
  if (vectorised)
    run.template operator()<kVec>();
  else
    run.template operator()<1>();
  KILN_CUDA_CHECK_LAUNCH();
}

// `packed` is qkv [B, T, G, (P + 2) D] (forward) or dqkv (backward); q, k, v the parts' data.
template <bool kBackward>
void launch_for_dtype(const Tensor& packed, const void* q, const void* k, const void* v, const Tensor& cos,
                      const Tensor& sin, std::int64_t position_offset, std::int64_t head_dim) {
  const QkvRopeShape s{packed.shape()[0] * packed.shape()[1],
                       packed.shape()[1],
                       static_cast<int>(packed.shape()[2]),
                       static_cast<int>(packed.shape()[3] / head_dim - 2),
                       static_cast<int>(head_dim),
                       static_cast<int>(cos.shape()[1]),
                       position_offset};
  KILN_DISPATCH_FLOATING(packed.dtype(), "split_qkv_rope", [&]<class T>() {
    if constexpr (std::is_same_v<T, double>) {
      KILN_FAIL("split_qkv_rope: float64 runs on the CPU only");
    } else {
      launch_split_qkv_rope<T, kBackward>(packed.data_ptr(), q, k, v, cos, sin, s, packed);
    }
  });
}

}  // namespace

void split_qkv_rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, std::int64_t position_offset,
                            const Tensor& q, const Tensor& k, const Tensor& v) {
  launch_for_dtype<false>(qkv, q.data_ptr(), k.data_ptr(), v.data_ptr(), cos, sin, position_offset, k.shape()[3]);
}

void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& cos, const Tensor& sin,
                             std::int64_t position_offset, std::int64_t head_dim, const Tensor& dqkv) {
  launch_for_dtype<true>(dqkv, data_or_null(dq), data_or_null(dk), data_or_null(dv), cos, sin, position_offset,
                         head_dim);
}

}  // namespace kiln::te::cuda
