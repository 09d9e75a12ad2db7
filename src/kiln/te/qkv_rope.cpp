#include "kiln/te/qkv_rope.h"

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

namespace {

std::string describe_or_undefined(const Tensor& t) { return t.defined() ? t.describe() : "undefined"; }

void check_split_qkv_rope(const Tensor& qkv, std::int64_t head_dim, const RopeTable& table,
                          std::int64_t position_offset) {
  KILN_CHECK(qkv.defined() && is_floating(qkv.dtype()) && qkv.dim() == 4,
             "split_qkv_rope: qkv must be a floating tensor [B, T, groups, (per_group + 2) * head_dim], got {}",
             describe_or_undefined(qkv));
  KILN_CHECK(head_dim > 0 && qkv.shape()[3] % head_dim == 0 && qkv.shape()[3] / head_dim >= 3,
             "split_qkv_rope: qkv's last dimension {} is not (per_group + 2) * head_dim with per_group >= 1 and "
             "head_dim {} ({})",
             qkv.shape()[3], head_dim, qkv.describe());
  KILN_CHECK(table.cos.defined() && table.cos.dtype() == DType::F32 && table.cos.dim() == 2,
             "split_qkv_rope: table.cos must be float32 [positions, rotary_dim / 2] (make_rope_table), got {}",
             describe_or_undefined(table.cos));
  KILN_CHECK(table.sin.defined() && table.sin.dtype() == DType::F32 && table.sin.shape() == table.cos.shape(),
             "split_qkv_rope: table.sin must be float32 of table.cos's shape {}, got {}", table.cos.describe(),
             describe_or_undefined(table.sin));
  KILN_CHECK(table.cos.device() == qkv.device() && table.sin.device() == qkv.device(),
             "split_qkv_rope: the table is on {} but qkv on {}", table.cos.device().str(), qkv.device().str());
  KILN_CHECK(2 * table.cos.shape()[1] <= head_dim, "split_qkv_rope: the table rotates {} channels but head_dim is {}",
             2 * table.cos.shape()[1], head_dim);
  const std::int64_t t = qkv.shape()[1];
  KILN_CHECK(position_offset >= 0 && position_offset + t <= table.cos.shape()[0],
             "split_qkv_rope: positions {}..{} are outside the table's {} positions (position_offset {}, T {})",
             position_offset, position_offset + t - 1, table.cos.shape()[0], position_offset, t);
}

// The gradient of qkv from those of q, k, v (undefined ones are zeros), in one kernel.
Tensor grouped_qkv_gradient(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& cos, const Tensor& sin,
                            std::int64_t position_offset, std::int64_t head_dim, const Shape& qkv_shape, DType dtype,
                            Device device) {
  auto contiguous_or_undefined = [](const Tensor& g) { return g.defined() ? ops::contiguous(g) : Tensor(); };
  Tensor dqkv = Tensor::empty(qkv_shape, dtype, device);
  if (dqkv.numel() > 0)
    ops::kernel(fused_ops().split_qkv_rope_backward, device, dtype)(
        contiguous_or_undefined(dq), contiguous_or_undefined(dk), contiguous_or_undefined(dv), cos, sin,
        position_offset, head_dim, dqkv);
  return dqkv;
}

}  // namespace

SplitQkv split_qkv_rope(const Tensor& qkv_in, std::int64_t head_dim, const RopeTable& table,
                        std::int64_t position_offset) {
  check_split_qkv_rope(qkv_in, head_dim, table, position_offset);
  const Tensor qkv = ops::contiguous(qkv_in);
  const std::int64_t b = qkv.shape()[0], t = qkv.shape()[1], groups = qkv.shape()[2];
  const std::int64_t per_group = qkv.shape()[3] / head_dim - 2;
  const Tensor cos = ops::contiguous(table.cos), sin = ops::contiguous(table.sin);
  SplitQkv out{Tensor::empty({b, t, groups * per_group, head_dim}, qkv.dtype(), qkv.device()),
               Tensor::empty({b, t, groups, head_dim}, qkv.dtype(), qkv.device()),
               Tensor::empty({b, t, groups, head_dim}, qkv.dtype(), qkv.device())};
  if (qkv.numel() > 0)
    ops::kernel(fused_ops().split_qkv_rope_forward, qkv.device(), qkv.dtype())(qkv, cos, sin, position_offset, out.q,
                                                                               out.k, out.v);
  if (autograd::needs_grad({qkv_in}))
    autograd::record(
        "SplitQkvRopeBackward", {qkv_in}, {&out.q, &out.k, &out.v},
        [cos, sin, position_offset, head_dim, shape = qkv.shape(), dtype = qkv.dtype(),
         device = qkv.device()](const autograd::Grads& g) -> autograd::Grads {
          if (!g[0].defined() && !g[1].defined() && !g[2].defined()) return {Tensor()};
          return {grouped_qkv_gradient(g[0], g[1], g[2], cos, sin, position_offset, head_dim, shape, dtype, device)};
        });
  return out;
}

}  // namespace kiln::te
