#include "kiln/models/transformer_core_ops.h"

#include <cmath>
#include <limits>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"
#include "kiln/te/rope.h"

namespace kiln::models {

namespace {

// 0 where query i may see key j (j <= S - T + i), -inf elsewhere: [T, S] f32, added to the scores.
// The last one made is kept (per thread), so a training step copies it to the device once, not per layer.
Tensor causal_mask(std::int64_t t, std::int64_t s, Device device) {
  thread_local Tensor last;
  if (last.defined() && last.size(0) == t && last.size(1) == s && last.device() == device) return last;
  std::vector<float> mask(static_cast<std::size_t>(t * s), 0.0f);
  for (std::int64_t i = 0; i < t; ++i)
    for (std::int64_t j = s - t + i + 1; j < s; ++j)
      mask[static_cast<std::size_t>(i * s + j)] = -std::numeric_limits<float>::infinity();
  last = Tensor::from_vector(mask, {t, s}, device);
  return last;
}

// softmax(q k^T * scale + mask) v per head, with k and v heads repeated for GQA. The scores and the
// softmax are f32 whatever the inputs' dtype (Megatron's attention_softmax_in_fp32). v's head size
// may differ from q's and k's (MLA).
Tensor local_attention(const Tensor& q, const Tensor& k, const Tensor& v, const CoreAttentionOptions& options) {
  KILN_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.size(0) == v.size(0) && k.size(1) == v.size(1) &&
                 k.size(2) == v.size(2) && q.size(0) == k.size(0) && q.size(3) == k.size(3),
             "attention: expected q [B,T,Hq,D], k [B,S,Hkv,D] and v [B,S,Hkv,Dv], got q {}, k {}, v {}", q.describe(),
             k.describe(), v.describe());
  const std::int64_t b = q.size(0), t = q.size(1), hq = q.size(2), d = q.size(3);
  const std::int64_t s = k.size(1), hkv = k.size(2);
  KILN_CHECK(hkv > 0 && hq % hkv == 0, "attention: {} key/value heads do not divide {} query heads", hkv, hq);
  KILN_CHECK(!options.causal || t <= s, "attention: causal with more queries ({}) than keys ({})", t, s);
  const std::int64_t group = hq / hkv;

  Tensor qh = q.permute({0, 2, 1, 3});  // [B, Hq, T, D]
  Tensor kh = k.permute({0, 2, 1, 3});  // [B, Hkv, S, D]
  Tensor vh = v.permute({0, 2, 1, 3});
  if (group > 1) {  // query head h reads key/value head h / group
    kh = kh.unsqueeze(2).expand({b, hkv, group, s, d}).reshape({b, hq, s, d});
    const std::int64_t dv = v.size(3);
    vh = vh.unsqueeze(2).expand({b, hkv, group, s, dv}).reshape({b, hq, s, dv});
  }
  const double scale = options.softmax_scale > 0 ? options.softmax_scale : 1.0 / std::sqrt(static_cast<double>(d));
  Tensor scores = mul(matmul(qh, kh.transpose(2, 3)), scale).to(DType::F32);  // [B, Hq, T, S]
  if (options.causal) scores = add(scores, causal_mask(t, s, q.device()));
  Tensor probs = softmax(scores, -1).to(q.dtype());
  if (options.probs_dropout) probs = options.probs_dropout(probs);
  return matmul(probs, vh).permute({0, 2, 1, 3});  // [B, T, Hq, Dv]
}

std::pair<Tensor, Tensor> local_add_layer_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                               const Tensor& bias, double eps) {
  Tensor sum = residual.defined() ? add(x, residual) : x;
  return {layer_norm(sum, weight, bias, eps), sum};
}

std::pair<Tensor, Tensor> local_add_rms_norm(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                             double eps) {
  Tensor sum = residual.defined() ? add(x, residual) : x;
  return {rms_norm(sum, weight, eps), sum};
}

RopeTable local_make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double base, bool llama3_scaling,
                                double scaling_factor, Device device) {
  const std::vector<double> inv_freq = te::rope_inv_freq(head_dim, base, llama3_scaling, scaling_factor);
  const std::int64_t half = head_dim / 2;
  std::vector<float> cos(static_cast<std::size_t>(max_positions * half)), sin(cos.size());
  for (std::int64_t p = 0; p < max_positions; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double angle = static_cast<double>(p) * inv_freq[static_cast<std::size_t>(i)];
      cos[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(angle));
      sin[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(angle));
    }
  return {Tensor::from_vector(cos, {max_positions, half}, device),
          Tensor::from_vector(sin, {max_positions, half}, device)};
}

// Rotate-half: with x = (x1 | x2) along D, (x1 cos - x2 sin | x2 cos + x1 sin).
Tensor local_apply_rope(const Tensor& x, const RopeTable& table, std::int64_t position_offset) {
  KILN_CHECK(x.dim() == 4, "apply_rope: expected x [B,T,H,D], got {}", x.describe());
  const std::int64_t t = x.size(1), half = x.size(3) / 2;
  KILN_CHECK(table.cos.defined() && table.cos.size(1) == half && x.size(3) == 2 * half,
             "apply_rope: the table is for head size {}, x is {}", table.cos.defined() ? 2 * table.cos.size(1) : 0,
             x.describe());
  KILN_CHECK(position_offset >= 0 && position_offset + t <= table.cos.size(0),
             "apply_rope: positions {} .. {} are beyond the table's {} positions", position_offset, position_offset + t,
             table.cos.size(0));
  Tensor cos = table.cos.narrow(0, position_offset, t).to(x.dtype()).view({1, t, 1, half});
  Tensor sin = table.sin.narrow(0, position_offset, t).to(x.dtype()).view({1, t, 1, half});
  Tensor x1 = x.narrow(3, 0, half), x2 = x.narrow(3, half, half);
  return cat({sub(mul(x1, cos), mul(x2, sin)), add(mul(x2, cos), mul(x1, sin))}, 3);
}

std::tuple<Tensor, Tensor, Tensor> local_split_qkv_rope(const Tensor& qkv, std::int64_t head_dim,
                                                        const RopeTable& table, std::int64_t position_offset) {
  auto [q, k, v] = split_grouped_qkv(qkv, head_dim);
  return {local_apply_rope(q, table, position_offset), local_apply_rope(k, table, position_offset), v};
}

Tensor local_swiglu(const Tensor& x) {
  const std::int64_t last = x.dim() - 1, f = x.size(last) / 2;
  KILN_CHECK(x.size(last) == 2 * f, "swiglu: the last dimension must be even (gate | up), got {}", x.describe());
  return mul(silu(x.narrow(last, 0, f)), x.narrow(last, f, f));
}

Tensor local_linear_bias_gelu(const Tensor& x, const Tensor& weight, const Tensor& bias) {
  return gelu(linear(x, weight, bias), /*tanh_approximation=*/true);
}

Tensor local_linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels,
                                  const Tensor& loss_mask) {
  KILN_CHECK(hidden.dim() == 2 && labels.dim() == 1 && labels.size(0) == hidden.size(0) && labels.dtype() == DType::I64,
             "linear_cross_entropy: expected hidden [N,H] and int64 labels [N], got {} and {}", hidden.describe(),
             labels.describe());
  KILN_CHECK(!loss_mask.defined() || loss_mask.shape() == labels.shape(),
             "linear_cross_entropy: loss_mask {} does not match labels {}", loss_mask.describe(), labels.describe());
  Tensor log_probs = log_softmax(linear(hidden, weight).to(DType::F32), -1);  // [N, V] f32
  Tensor nll = neg(gather(log_probs, 1, labels.unsqueeze(1)).squeeze(1));     // [N]
  if (!loss_mask.defined()) return mean(nll);
  Tensor mask = loss_mask.to(DType::F32);
  return div(sum(mul(nll, mask)), sum(mask));
}

CoreOps make_local_core_ops() {
  CoreOps ops;
  ops.name = "local";
  ops.attention = local_attention;
  ops.add_layer_norm = local_add_layer_norm;
  ops.add_rms_norm = local_add_rms_norm;
  ops.make_rope_table = local_make_rope_table;
  ops.apply_rope = local_apply_rope;
  ops.split_qkv_rope = local_split_qkv_rope;
  ops.swiglu = local_swiglu;
  ops.linear_bias_gelu = local_linear_bias_gelu;
  ops.linear_cross_entropy = local_linear_cross_entropy;
  return ops;
}

}  // namespace

std::tuple<Tensor, Tensor, Tensor> split_grouped_qkv(const Tensor& qkv, std::int64_t head_dim) {
  KILN_CHECK(qkv.dim() == 4 && head_dim > 0 && qkv.size(3) % head_dim == 0 && qkv.size(3) / head_dim >= 3,
             "split_grouped_qkv: expected qkv [B,T,groups,(per_group+2)*{}], got {}", head_dim, qkv.describe());
  const std::int64_t b = qkv.size(0), t = qkv.size(1), groups = qkv.size(2);
  const std::int64_t per_group = qkv.size(3) / head_dim - 2;
  std::vector<Tensor> parts = split_sizes(qkv, {per_group * head_dim, head_dim, head_dim}, 3);
  return {parts[0].reshape({b, t, groups * per_group, head_dim}), parts[1], parts[2]};
}

const CoreOps& local_core_ops() {
  static const CoreOps ops = make_local_core_ops();
  return ops;
}

const CoreOps& core_ops_for(TransformerImpl impl) {
  switch (impl) {
    case TransformerImpl::Local: return local_core_ops();
    case TransformerImpl::TransformerEngine: return te_core_ops();
  }
  KILN_FAIL("core_ops_for: unknown transformer implementation {}", static_cast<int>(impl));
}

}  // namespace kiln::models
