#include "kiln/te/rope.h"

#include <cmath>
#include <numbers>

#include "kiln/autograd/record.h"
#include "kiln/ops/copy.h"
#include "kiln/te/fused_ops.h"

namespace kiln::te {

std::vector<double> rope_inv_freq(std::int64_t head_dim, double base, bool llama3_scaling, double scaling_factor) {
  KILN_CHECK(head_dim > 0 && head_dim % 2 == 0, "make_rope_table: head_dim must be even and positive, got {}",
             head_dim);
  KILN_CHECK(base > 1, "make_rope_table: base (--rotary-base) must be > 1, got {}", base);
  std::vector<double> inv(static_cast<std::size_t>(head_dim / 2));
  for (std::size_t i = 0; i < inv.size(); ++i)
    inv[i] = 1.0 / std::pow(base, static_cast<double>(2 * i) / static_cast<double>(head_dim));
  if (!llama3_scaling) return inv;
  KILN_CHECK(scaling_factor >= 1, "make_rope_table: the Llama-3 scaling factor must be >= 1, got {}", scaling_factor);
  // Llama-3.1: long wavelengths (past the original context) slow down by `factor`, short ones
  // (under old_context / high_freq_factor) stay, those between blend smoothly.
  const double low_freq_factor = 1, high_freq_factor = 4, old_context = 8192;
  const double low_freq_wavelen = old_context / low_freq_factor, high_freq_wavelen = old_context / high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    const double scaled = wavelen > low_freq_wavelen ? f / scaling_factor : f;
    const double smooth = (old_context / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const bool medium = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = medium ? (1 - smooth) * scaled / scaling_factor + smooth * scaled : scaled;
  }
  return inv;
}

RopeTable make_rope_table(std::int64_t head_dim, std::int64_t max_positions, double base, bool llama3_scaling,
                          double scaling_factor, Device device) {
  KILN_CHECK(max_positions > 0, "make_rope_table: max_positions must be positive, got {}", max_positions);
  const std::vector<double> inv = rope_inv_freq(head_dim, base, llama3_scaling, scaling_factor);
  const auto half = static_cast<std::int64_t>(inv.size());
  std::vector<float> c(static_cast<std::size_t>(max_positions * half)), s(c.size());
  for (std::int64_t p = 0; p < max_positions; ++p)
    for (std::int64_t i = 0; i < half; ++i) {
      const double theta = static_cast<double>(p) * inv[static_cast<std::size_t>(i)];
      c[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::cos(theta));
      s[static_cast<std::size_t>(p * half + i)] = static_cast<float>(std::sin(theta));
    }
  return {Tensor::from_vector(c, {max_positions, half}, device), Tensor::from_vector(s, {max_positions, half}, device)};
}

namespace {

void check_rope(const Tensor& x, const RopeTable& table, std::int64_t offset) {
  KILN_CHECK(x.defined() && is_floating(x.dtype()) && x.dim() == 4,
             "apply_rope: x must be a floating tensor [B, T, H, D], got {}", x.defined() ? x.describe() : "undefined");
  KILN_CHECK(table.cos.defined() && table.sin.defined() && table.cos.dtype() == DType::F32 && table.cos.dim() == 2 &&
                 table.sin.shape() == table.cos.shape() && table.sin.dtype() == DType::F32,
             "apply_rope: the table's cos and sin must be float32 [P, R] (make_rope_table), got {} and {}",
             table.cos.defined() ? table.cos.describe() : "undefined",
             table.sin.defined() ? table.sin.describe() : "undefined");
  KILN_CHECK(table.cos.device() == x.device() && table.sin.device() == x.device(),
             "apply_rope: the table is on {} but x on {}", table.cos.device().str(), x.device().str());
  KILN_CHECK(2 * table.cos.shape()[1] <= x.shape()[3],
             "apply_rope: the table rotates {} channels but x's head dimension is {} ({})", 2 * table.cos.shape()[1],
             x.shape()[3], x.describe());
  KILN_CHECK(offset >= 0 && offset + x.shape()[1] <= table.cos.shape()[0],
             "apply_rope: positions {}..{} are outside the table's {} positions (position_offset {}, T {})", offset,
             offset + x.shape()[1] - 1, table.cos.shape()[0], offset, x.shape()[1]);
}

// The kernels take x with any strides but a unit one along D (a view of q or k in a fused QKV
// projection is read in place); out is contiguous.
Tensor rotate(const Tensor& x_in, const Tensor& cos, const Tensor& sin, std::int64_t offset, bool inverse) {
  const Tensor x = x_in.stride(3) == 1 || x_in.shape()[3] == 1 ? x_in : ops::contiguous(x_in);
  Tensor out = Tensor::empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0)
    ops::kernel(fused_ops().apply_rope, x.device(), x.dtype())(x, ops::contiguous(cos), ops::contiguous(sin), offset,
                                                               inverse, out);
  return out;
}

}  // namespace

Tensor apply_rope(const Tensor& x, const RopeTable& table, std::int64_t position_offset) {
  check_rope(x, table, position_offset);
  Tensor y = rotate(x, table.cos, table.sin, position_offset, false);
  if (autograd::needs_grad({x}))
    autograd::record("ApplyRopeBackward", {x}, {&y},
                     [cos = table.cos, sin = table.sin, position_offset](const autograd::Grads& g) -> autograd::Grads {
                       if (!g[0].defined()) return {Tensor()};
                       return {rotate(g[0], cos, sin, position_offset, true)};
                     });
  return y;
}

}  // namespace kiln::te
