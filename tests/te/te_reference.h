#pragma once
// Float64 references of te/'s fused ops, written directly from their definitions (sharing no code
// with the kernels), for tests/te and the test_backend_ops cases. Tensors in, CPU float64 out.
#include <cmath>
#include <cstdint>
#include <numbers>
#include <utility>
#include <vector>

#include "kiln/tensor/tensor.h"

namespace kiln::te_reference {

inline std::vector<double> values(const Tensor& t) {
  return t.defined() ? t.to_vector<double>() : std::vector<double>{};
}

// (norm(x + residual) * w + b, x + residual) over the last dimension; RMS norm when rms.
inline std::pair<Tensor, Tensor> add_norm(const Tensor& x, const Tensor& residual, const Tensor& w, const Tensor& b,
                                          double eps, bool rms) {
  const std::int64_t cols = x.shape().back(), rows = x.numel() / cols;
  std::vector<double> s = values(x), y(s.size());
  const std::vector<double> r = values(residual), wv = values(w), bv = values(b);
  for (std::size_t i = 0; i < r.size(); ++i) s[i] += r[i];
  for (std::int64_t row = 0; row < rows; ++row) {
    const double* p = s.data() + row * cols;
    double mean = 0, var = 0;
    if (!rms) {
      for (std::int64_t i = 0; i < cols; ++i) mean += p[i];
      mean /= static_cast<double>(cols);
    }
    for (std::int64_t i = 0; i < cols; ++i) var += (p[i] - mean) * (p[i] - mean);
    const double rstd = 1 / std::sqrt(var / static_cast<double>(cols) + eps);
    for (std::int64_t i = 0; i < cols; ++i) {
      double v = (p[i] - mean) * rstd;
      if (!wv.empty()) v *= wv[static_cast<std::size_t>(i)];
      if (!bv.empty()) v += bv[static_cast<std::size_t>(i)];
      y[static_cast<std::size_t>(row * cols + i)] = v;
    }
  }
  return {Tensor::from_vector(y, x.shape()), Tensor::from_vector(s, x.shape())};
}

// Hugging Face Llama's inverse frequencies (modeling_rope_utils: _compute_default_rope_parameters
// and _compute_llama3_parameters with low_freq_factor 1, high_freq_factor 4,
// original_max_position_embeddings 8192), re-derived in float64.
inline std::vector<double> hf_inv_freq(std::int64_t dim, double base, bool llama3, double factor) {
  std::vector<double> inv;
  for (std::int64_t i = 0; i < dim; i += 2) inv.push_back(1.0 / std::pow(base, static_cast<double>(i) / dim));
  if (!llama3) return inv;
  const double low_freq_factor = 1, high_freq_factor = 4, old_context_len = 8192;
  const double low_freq_wavelen = old_context_len / low_freq_factor;
  const double high_freq_wavelen = old_context_len / high_freq_factor;
  for (double& f : inv) {
    const double wavelen = 2 * std::numbers::pi / f;
    // inv_freq_llama = where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    const double llama = wavelen > low_freq_wavelen ? f / factor : f;
    const double smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor);
    const double smoothed = (1 - smooth_factor) * llama / factor + smooth_factor * llama;
    const bool is_medium_freq = !(wavelen < high_freq_wavelen) && !(wavelen > low_freq_wavelen);
    f = is_medium_freq ? smoothed : llama;
  }
  return inv;
}

// Rotate-half RoPE of x [B, T, H, D] with the given cos/sin [P, R] tables (their own values).
inline Tensor rope(const Tensor& x, const Tensor& cos, const Tensor& sin, std::int64_t offset, bool inverse = false) {
  const std::int64_t b = x.shape()[0], t = x.shape()[1], h = x.shape()[2], d = x.shape()[3], half = cos.shape()[1];
  const std::vector<double> in = values(x), c = values(cos), s = values(sin);
  std::vector<double> out = in;
  for (std::int64_t row = 0; row < b * t * h; ++row) {
    const std::int64_t pos = offset + (row / h) % t;
    for (std::int64_t i = 0; i < half; ++i) {
      const double x1 = in[static_cast<std::size_t>(row * d + i)],
                   x2 = in[static_cast<std::size_t>(row * d + i + half)];
      const double ci = c[static_cast<std::size_t>(pos * half + i)],
                   si = (inverse ? -1 : 1) * s[static_cast<std::size_t>(pos * half + i)];
      out[static_cast<std::size_t>(row * d + i)] = x1 * ci - x2 * si;
      out[static_cast<std::size_t>(row * d + i + half)] = x2 * ci + x1 * si;
    }
  }
  return Tensor::from_vector(out, x.shape());
}

// Megatron's grouped QKV qkv [B, T, G, (P + 2) D] (per group: P query heads, a key head, a value
// head) split into q [B, T, G P, D], k, v [B, T, G, D], q and k rotated as rope() rotates them.
struct SplitQkv {
  Tensor q, k, v;
};
inline SplitQkv split_qkv_rope(const Tensor& qkv, std::int64_t d, const Tensor& cos, const Tensor& sin,
                               std::int64_t offset) {
  const std::int64_t b = qkv.shape()[0], t = qkv.shape()[1], g = qkv.shape()[2], p = qkv.shape()[3] / d - 2;
  const std::vector<double> in = values(qkv);
  std::vector<double> q, k, v;
  for (std::int64_t row = 0; row < b * t * g; ++row)
    for (std::int64_t slot = 0; slot < p + 2; ++slot) {
      std::vector<double>& out = slot < p ? q : slot == p ? k : v;
      const auto first = in.begin() + (row * (p + 2) + slot) * d;
      out.insert(out.end(), first, first + d);
    }
  return {rope(Tensor::from_vector(q, {b, t, g * p, d}), cos, sin, offset),
          rope(Tensor::from_vector(k, {b, t, g, d}), cos, sin, offset), Tensor::from_vector(v, {b, t, g, d})};
}

inline Tensor swiglu(const Tensor& x) {
  const std::int64_t f = x.shape().back() / 2, rows = x.numel() / (2 * f);
  const std::vector<double> in = values(x);
  std::vector<double> out(static_cast<std::size_t>(rows * f));
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t i = 0; i < f; ++i) {
      const double g = in[static_cast<std::size_t>(r * 2 * f + i)], u = in[static_cast<std::size_t>(r * 2 * f + f + i)];
      out[static_cast<std::size_t>(r * f + i)] = g / (1 + std::exp(-g)) * u;
    }
  Shape s = x.shape();
  s.back() = f;
  return Tensor::from_vector(out, s);
}

// sum_i CE(hidden_i W^T, label_i) * m_i / sum_i m_i, m_i = mask_i (1 if no mask), 0 where
// label_i == ignore_index.
inline Tensor linear_cross_entropy(const Tensor& hidden, const Tensor& weight, const Tensor& labels, const Tensor& mask,
                                   std::int64_t ignore_index = -100) {
  const std::int64_t n = hidden.shape()[0], k = hidden.shape()[1], v = weight.shape()[0];
  const std::vector<double> h = values(hidden), w = values(weight), m = values(mask);
  const std::vector<std::int64_t> lab = labels.to_vector<std::int64_t>();
  double num = 0, den = 0;
  for (std::int64_t i = 0; i < n; ++i) {
    const double mi =
        lab[static_cast<std::size_t>(i)] == ignore_index ? 0 : (m.empty() ? 1 : m[static_cast<std::size_t>(i)]);
    if (mi == 0) continue;
    std::vector<double> z(static_cast<std::size_t>(v));
    double mx = -INFINITY;
    for (std::int64_t j = 0; j < v; ++j) {
      double acc = 0;
      for (std::int64_t c = 0; c < k; ++c)
        acc += h[static_cast<std::size_t>(i * k + c)] * w[static_cast<std::size_t>(j * k + c)];
      z[static_cast<std::size_t>(j)] = acc;
      mx = std::max(mx, acc);
    }
    double s = 0;
    for (double zj : z) s += std::exp(zj - mx);
    num += (mx + std::log(s) - z[static_cast<std::size_t>(lab[static_cast<std::size_t>(i)])]) * mi;
    den += mi;
  }
  return Tensor::scalar(num / den, DType::F64);
}

inline double gelu_tanh(double x) {
  return 0.5 * x * (1 + std::tanh(std::sqrt(2 / std::numbers::pi) * (x + 0.044715 * x * x * x)));
}

// gelu_tanh(x w^T + b) for x [..., K].
inline Tensor linear_bias_gelu(const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::int64_t k = x.shape().back(), n = x.numel() / k, o = w.shape()[0];
  const std::vector<double> xv = values(x), wv = values(w), bv = values(b);
  std::vector<double> out(static_cast<std::size_t>(n * o));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < o; ++j) {
      double acc = bv.empty() ? 0 : bv[static_cast<std::size_t>(j)];
      for (std::int64_t c = 0; c < k; ++c)
        acc += xv[static_cast<std::size_t>(r * k + c)] * wv[static_cast<std::size_t>(j * k + c)];
      out[static_cast<std::size_t>(r * o + j)] = gelu_tanh(acc);
    }
  Shape s = x.shape();
  s.back() = o;
  return Tensor::from_vector(out, s);
}

// gelu_tanh(x w1^T + b1) w2^T + b2 for x [..., K].
inline Tensor linear_gelu_linear(const Tensor& x, const Tensor& w1, const Tensor& b1, const Tensor& w2,
                                 const Tensor& b2) {
  const Tensor act = linear_bias_gelu(x, w1, b1);
  const std::int64_t f = act.shape().back(), n = act.numel() / f, h = w2.shape()[0];
  const std::vector<double> av = values(act), wv = values(w2), bv = values(b2);
  std::vector<double> out(static_cast<std::size_t>(n * h));
  for (std::int64_t r = 0; r < n; ++r)
    for (std::int64_t j = 0; j < h; ++j) {
      double acc = bv.empty() ? 0 : bv[static_cast<std::size_t>(j)];
      for (std::int64_t c = 0; c < f; ++c)
        acc += av[static_cast<std::size_t>(r * f + c)] * wv[static_cast<std::size_t>(j * f + c)];
      out[static_cast<std::size_t>(r * h + j)] = acc;
    }
  Shape s = x.shape();
  s.back() = h;
  return Tensor::from_vector(out, s);
}

}  // namespace kiln::te_reference
