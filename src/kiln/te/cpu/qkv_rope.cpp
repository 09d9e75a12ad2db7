// CPU kernels of split_qkv_rope: Megatron's grouped QKV rows [B, T, G, (P + 2) D] to contiguous
// q [B, T, G P, D], k, v [B, T, G, D] (q and k rotated, v copied) and back for the gradients.
// The rotation is apply_rope's (rope_head), so the results equal split + apply_rope bit for bit.
#include <algorithm>

#include "kiln/ops/cpu/accumulate_type.h"
#include "kiln/ops/cpu/parallel.h"
#include "kiln/te/cpu/rope_head.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te::cpu {

namespace qkv_rope_cpu {  // named: the library compiles in unity batches

// The shape of a grouped QKV tensor: G groups of P query heads, a key and a value head, D wide.
struct QkvShape {
  std::int64_t rows, t, groups, per_group, d, half;
};

// Of `packed`, qkv [B, T, G, (P + 2) D] (forward) or dqkv (backward).
inline QkvShape qkv_shape(const Tensor& packed, std::int64_t head_dim, const Tensor& cos) {
  return {packed.shape()[0] * packed.shape()[1], packed.shape()[1], packed.shape()[2],
          packed.shape()[3] / head_dim - 2,      head_dim,          cos.shape()[1]};
}

// For each (b, t) row and each head of it: `head(row, group, slot)` with slot < P a query head, P
// the key head, P + 1 the value head.
template <class F>
void for_each_head(const QkvShape& s, F&& head) {
  const std::int64_t row_elems = s.groups * (s.per_group + 2) * s.d;
  ops::cpu::parallel_for(s.rows, std::max<std::int64_t>(1, 4096 / std::max<std::int64_t>(row_elems, 1)),
                         [&](std::int64_t lo, std::int64_t hi) {
                           for (std::int64_t row = lo; row < hi; ++row)
                             for (std::int64_t g = 0; g < s.groups; ++g)
                               for (std::int64_t slot = 0; slot < s.per_group + 2; ++slot) head(row, g, slot);
                         });
}

}  // namespace qkv_rope_cpu

using qkv_rope_cpu::QkvShape;

void split_qkv_rope_forward(const Tensor& qkv, const Tensor& cos, const Tensor& sin, std::int64_t position_offset,
                            const Tensor& q, const Tensor& k, const Tensor& v) {
  const QkvShape s = qkv_rope_cpu::qkv_shape(qkv, k.shape()[3], cos);
  const float* cp = static_cast<const float*>(cos.data_ptr());
  const float* sp = static_cast<const float*>(sin.data_ptr());
  KILN_DISPATCH_FLOATING(qkv.dtype(), "split_qkv_rope", [&]<class T>() {
    using A = ops::cpu::acc_t<T>;
    const T* in = static_cast<const T*>(qkv.data_ptr());
    T* qp = static_cast<T*>(q.data_ptr());
    T* kp = static_cast<T*>(k.data_ptr());
    T* vp = static_cast<T*>(v.data_ptr());
    qkv_rope_cpu::for_each_head(s, [&](std::int64_t row, std::int64_t g, std::int64_t slot) {
      const T* src = in + ((row * s.groups + g) * (s.per_group + 2) + slot) * s.d;
      const std::int64_t pos = position_offset + row % s.t;
      if (slot < s.per_group)
        rope_head(src, cp + pos * s.half, sp + pos * s.half, s.half, s.d, A(1),
                  qp + ((row * s.groups + g) * s.per_group + slot) * s.d);
      else if (slot == s.per_group)
        rope_head(src, cp + pos * s.half, sp + pos * s.half, s.half, s.d, A(1), kp + (row * s.groups + g) * s.d);
      else
        std::copy(src, src + s.d, vp + (row * s.groups + g) * s.d);
    });
  });
}

void split_qkv_rope_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& cos, const Tensor& sin,
                             std::int64_t position_offset, std::int64_t head_dim, const Tensor& dqkv) {
  const QkvShape s = qkv_rope_cpu::qkv_shape(dqkv, head_dim, cos);
  const float* cp = static_cast<const float*>(cos.data_ptr());
  const float* sp = static_cast<const float*>(sin.data_ptr());
  KILN_DISPATCH_FLOATING(dqkv.dtype(), "split_qkv_rope", [&]<class T>() {
    using A = ops::cpu::acc_t<T>;
    T* out = static_cast<T*>(dqkv.data_ptr());
    const T* qp = dq.defined() ? static_cast<const T*>(dq.data_ptr()) : nullptr;
    const T* kp = dk.defined() ? static_cast<const T*>(dk.data_ptr()) : nullptr;
    const T* vp = dv.defined() ? static_cast<const T*>(dv.data_ptr()) : nullptr;
    qkv_rope_cpu::for_each_head(s, [&](std::int64_t row, std::int64_t g, std::int64_t slot) {
      T* dst = out + ((row * s.groups + g) * (s.per_group + 2) + slot) * s.d;
      const std::int64_t pos = position_offset + row % s.t;
      // An undefined gradient is zeros (as the split's backward fills them), written, not rotated.
      const T* src = slot < s.per_group    ? (qp ? qp + ((row * s.groups + g) * s.per_group + slot) * s.d : nullptr)
                     : slot == s.per_group ? (kp ? kp + (row * s.groups + g) * s.d : nullptr)
                                           : (vp ? vp + (row * s.groups + g) * s.d : nullptr);
      if (src == nullptr)
        std::fill(dst, dst + s.d, ops::cpu::from_acc<T>(A(0)));
      else if (slot <= s.per_group)
        rope_head(src, cp + pos * s.half, sp + pos * s.half, s.half, s.d, A(-1), dst);
      else
        std::copy(src, src + s.d, dst);
    });
  });
}

}  // namespace kiln::te::cpu
