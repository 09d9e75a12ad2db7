// Cases of the FP8 family (ops/fp8_kernels.h): casts with every scaling layout, the transpose-cast
// and the GEMM. FP8 takes float32 inputs and has no gradient, so the cases run at their inputs'
// own dtypes; the reference is a float64 computation of the quantised values that shares no code
// with the kernels (tests/fp8's nearest-code rounding), and the outputs are the exact values of
// the fp8 results (dequantised to float64) and the GEMM's products.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "../fp8/fp8_test_util.h"
#include "harness.h"
#include "kiln/ops/fp8.h"
#include "kiln/ops/fp8_kernels.h"
#include "kiln/runtime/error.h"

namespace kiln::backend_ops {

namespace cases_fp8 {

using fp8test::decode;
using fp8test::nearest_code;

double max_finite(DType t) { return t == DType::F8E4M3 ? 448.0 : 57344.0; }

// The float64 value of every element of x (f32 [R, C]) cast with current scaling: each block's
// scale is fp8_max / amax(block) in single precision, the code the nearest to x * scale (a
// single-precision product), the value the code times 1 / scale (single precision).
std::vector<double> quantised_values(const Tensor& x, DType t, ScalingLayout layout) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1];
  const auto v = x.to_vector<float>();
  const std::int64_t bh = layout == ScalingLayout::Block128x128 ? 128 : (layout == ScalingLayout::Block1x128 ? 1 : R);
  const std::int64_t bw = layout == ScalingLayout::PerTensor ? C : 128;
  std::vector<double> out(v.size());
  for (std::int64_t r0 = 0; r0 < R; r0 += bh)
    for (std::int64_t c0 = 0; c0 < C; c0 += bw) {
      const std::int64_t r1 = std::min(R, r0 + bh), c1 = std::min(C, c0 + bw);
      float amax = 0;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) amax = std::max(amax, std::fabs(v[static_cast<std::size_t>(r * C + c)]));
      const float scale = amax == 0.0f ? 1.0f : static_cast<float>(max_finite(t)) / amax;
      const float scale_inv = 1.0f / scale;
      for (std::int64_t r = r0; r < r1; ++r)
        for (std::int64_t c = c0; c < c1; ++c) {
          const std::size_t i = static_cast<std::size_t>(r * C + c);
          out[i] = decode(t, nearest_code(t, v[i] * scale)) * static_cast<double>(scale_inv);
        }
    }
  return out;
}

Tensor f64_matrix(std::vector<double> v, std::int64_t rows, std::int64_t cols) {
  return Tensor::from_vector(v, {rows, cols});
}

// A float32 [rows, cols] matrix of normal values (mean 0, std 2): several binades, both signs.
Tensor f32_matrix(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  return randn({rows, cols}, seed, 2.0).to(DType::F32);
}

std::string layout_label(ScalingLayout l) {
  return l == ScalingLayout::PerTensor ? "per_tensor"
                                       : (l == ScalingLayout::Block1x128 ? "block1x128" : "block128x128");
}

}  // namespace cases_fp8

void add_fp8_cases(std::vector<OpCase>& cases) {
  using namespace cases_fp8;  // this file's helpers (a named namespace: the tests compile in unity batches)
  {
    // One DelayedScaling step (TransformerEngine's amax_and_scale_update) with each amax algorithm,
    // against a float64 transcription of its rule: the amax is history[0] (most_recent) or the
    // window's largest entry (max); the window rolls (entry i <- i + 1, the last <- the old entry 0)
    // and entry 0 is zeroed; scale = scaled_max / amax, scale_inv = 1 / scale.
    constexpr float kScaledMax = 448.0f / 4.0f;  // e4m3, margin 2
    OpCase c;
    c.name = "fp8/delayed_scaling_update";
    c.kernels = {ops::kFp8DelayedScalingUpdateOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      std::vector<float> h(large ? 1024 : 7);
      for (std::size_t i = 0; i < h.size(); ++i) h[i] = 0.25f + static_cast<float>((i * 37) % 11);
      return std::vector<Tensor>{Tensor::from_vector(h, {static_cast<std::int64_t>(h.size())})};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      std::vector<Tensor> out;
      for (auto algo : {ops::AmaxComputeAlgo::Max, ops::AmaxComputeAlgo::MostRecent}) {
        Tensor h = in[0].clone();
        Tensor scale = Tensor::full({1}, 1.0, DType::F32, h.device());
        Tensor scale_inv = Tensor::full({1}, 1.0, DType::F32, h.device());
        ops::fp8_delayed_scaling_update(h, scale, scale_inv, algo, kScaledMax);
        out.insert(out.end(), {h, scale, scale_inv});
      }
      return out;
    };
    c.reference = [](const std::vector<Tensor>& in) {
      const std::vector<double> h = in[0].to_vector<double>();
      const std::size_t n = h.size();
      std::vector<double> rolled(n, 0.0);
      for (std::size_t i = 1; i + 1 < n; ++i) rolled[i] = h[i + 1];
      if (n > 1) rolled[n - 1] = h[0];
      std::vector<Tensor> out;
      for (bool most_recent : {false, true}) {
        const double amax = most_recent ? h[0] : *std::max_element(h.begin(), h.end());
        const double scale = static_cast<double>(kScaledMax) / amax;
        out.push_back(Tensor::from_vector(rolled, {static_cast<std::int64_t>(n)}));
        out.push_back(Tensor::from_vector(std::vector<double>{scale}, {1}));
        out.push_back(Tensor::from_vector(std::vector<double>{1.0 / scale}, {1}));
      }
      return out;
    };
    cases.push_back(std::move(c));
  }
  // quantize then dequantize: every layout with E4M3, per tensor with E5M2 too.
  const std::pair<DType, ScalingLayout> casts[] = {{DType::F8E4M3, ScalingLayout::PerTensor},
                                                   {DType::F8E5M2, ScalingLayout::PerTensor},
                                                   {DType::F8E4M3, ScalingLayout::Block1x128},
                                                   {DType::F8E4M3, ScalingLayout::Block128x128}};
  for (const auto& [t, layout] : casts) {
    OpCase c;
    c.name = fmt::format("fp8_quantize/{}_{}", t == DType::F8E4M3 ? "e4m3" : "e5m2", layout_label(layout));
    c.kernels = {ops::kFp8QuantizeOp, ops::kFp8DequantizeOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      return std::vector<Tensor>{large ? f32_matrix(4096, 4096, 300) : f32_matrix(137, 300, 300)};
    };
    c.forward = [t, layout](const std::vector<Tensor>& in) {
      ops::Fp8CastOptions o;
      o.current_scaling = true;
      const Fp8Tensor q = ops::fp8_quantize(in[0], t, layout, o);
      return std::vector<Tensor>{ops::fp8_dequantize(q, DType::F64)};
    };
    c.reference = [t, layout](const std::vector<Tensor>& in) {
      return std::vector<Tensor>{f64_matrix(quantised_values(in[0], t, layout), in[0].shape()[0], in[0].shape()[1])};
    };
    cases.push_back(std::move(c));
  }

  // --fp8-param-gather's shard ops: the matrix cut into three pieces at offsets inside rows (and,
  // for 128x128 blocks, inside blocks), each piece's amaxes max-accumulated into one scale-shaped
  // tensor (fp8_piece_amax_: together the whole matrix's amaxes) and each piece cast with the whole
  // matrix's current scales (fp8_piece_quantize_into: together the whole matrix's cast).
  for (ScalingLayout layout : {ScalingLayout::PerTensor, ScalingLayout::Block128x128}) {
    OpCase c;
    c.name = fmt::format("fp8_piece/{}", layout_label(layout));
    c.kernels = {ops::kFp8PieceAmaxOp, ops::kFp8PieceQuantizeOp, ops::kFp8QuantizeOp, ops::kFp8DequantizeOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      return std::vector<Tensor>{large ? f32_matrix(4096, 4096, 320) : f32_matrix(300, 260, 320)};
    };
    c.forward = [layout](const std::vector<Tensor>& in) {
      const std::int64_t R = in[0].shape()[0], C = in[0].shape()[1], n = R * C;
      const Device d = in[0].device();
      const Tensor flat = in[0].contiguous().reshape({n});
      const std::int64_t cuts[] = {0, n / 3 + 77, 2 * n / 3 + 5, n};
      const Tensor amax = Tensor::zeros(fp8_scale_shape(layout, R, C), DType::F32, d);
      ops::Fp8CastOptions o;
      o.current_scaling = true;
      const Fp8Tensor whole = ops::fp8_quantize(in[0], DType::F8E4M3, layout, o);
      const Tensor bytes = Tensor::empty({n}, DType::F8E4M3, d);
      for (int p = 0; p < 3; ++p) {
        const ops::Fp8MatrixPiece piece{.rows = R, .cols = C, .begin = cuts[p], .layout = layout};
        const Tensor x = flat.narrow(0, cuts[p], cuts[p + 1] - cuts[p]);
        ops::fp8_piece_amax_(x, piece, amax);
        ops::fp8_piece_quantize_into(x, piece, whole.scale, bytes.narrow(0, cuts[p], cuts[p + 1] - cuts[p]));
      }
      Fp8Tensor pieces = whole;
      pieces.data = bytes.reshape({R, C});
      return std::vector<Tensor>{amax.to(DType::F64), ops::fp8_dequantize(pieces, DType::F64)};
    };
    c.reference = [layout](const std::vector<Tensor>& in) {
      const std::int64_t R = in[0].shape()[0], C = in[0].shape()[1];
      const auto v = in[0].to_vector<float>();
      const Shape shape = fp8_scale_shape(layout, R, C);
      std::vector<double> amax(static_cast<std::size_t>(numel_of(shape)), 0.0);
      for (std::int64_t r = 0; r < R; ++r)
        for (std::int64_t col = 0; col < C; ++col) {
          double& a = amax[static_cast<std::size_t>(fp8_scale_index(layout, R, C, r, col))];
          a = std::max(a, static_cast<double>(std::fabs(v[static_cast<std::size_t>(r * C + col)])));
        }
      return std::vector<Tensor>{Tensor::from_vector(amax, shape),
                                 f64_matrix(quantised_values(in[0], DType::F8E4M3, layout), R, C)};
    };
    cases.push_back(std::move(c));
  }

  // The transpose-cast: rowwise = cast(x), columnwise = cast(x^T), one current scale from amax(x)
  // (a fused kernel where the backend has one, two casts elsewhere).
  {
    OpCase c;
    c.name = "fp8_quantize_transpose/per_tensor";
    c.kernels = {ops::kFp8QuantizeTransposeOp, ops::kFp8QuantizeOp, ops::kFp8DequantizeOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      return std::vector<Tensor>{large ? f32_matrix(4096, 4096, 310) : f32_matrix(96, 160, 310)};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      const std::int64_t R = in[0].shape()[0], C = in[0].shape()[1];
      const Device d = in[0].device();
      const Fp8Tensor row = ops::fp8_empty(R, C, DType::F8E4M3, ScalingLayout::PerTensor, d);
      const Fp8Tensor col = ops::fp8_empty(C, R, DType::F8E4M3, ScalingLayout::PerTensor, d);
      ops::Fp8CastOptions o;
      o.current_scaling = true;
      ops::fp8_quantize_transpose_into(in[0], row, col, o);
      return std::vector<Tensor>{ops::fp8_dequantize(row, DType::F64), ops::fp8_dequantize(col, DType::F64)};
    };
    c.reference = [](const std::vector<Tensor>& in) {
      const std::int64_t R = in[0].shape()[0], C = in[0].shape()[1];
      const Tensor xt = in[0].t().contiguous();
      return std::vector<Tensor>{f64_matrix(quantised_values(in[0], DType::F8E4M3, ScalingLayout::PerTensor), R, C),
                                 f64_matrix(quantised_values(xt, DType::F8E4M3, ScalingLayout::PerTensor), C, R)};
    };
    cases.push_back(std::move(c));
  }

  // The GEMM in its native form (a [M, K] times b [N, K]^T), float32 out: per-tensor operands, and
  // DeepSeek-V3's 1x128 activations with 128x128 weights.
  const std::pair<ScalingLayout, ScalingLayout> gemms[] = {{ScalingLayout::PerTensor, ScalingLayout::PerTensor},
                                                           {ScalingLayout::Block1x128, ScalingLayout::Block128x128}};
  for (const auto& [la, lb] : gemms) {
    OpCase c;
    c.name = fmt::format("fp8_gemm/{}_{}", layout_label(la), layout_label(lb));
    c.kernels = {ops::kFp8GemmOp, ops::kFp8GemmUnsupportedOp, ops::kFp8QuantizeOp};
    c.native = true;
    c.dtypes = {};
    // Hopper's FP8 tensor cores accumulate with about 14 mantissa bits (DeepSeek-V3 report, section
    // 3.3.2), not float32's 24: over K = 256 products the H200 lands at NMSE 1.7e-8 (2026-12-02), above
    // the float32 bound of 1e-10 and far below what a wrong scale or layout gives (~1).
    c.tol_scale = 1e3;
    c.inputs = [](bool large) {
      const std::int64_t M = large ? 2048 : 40, N = large ? 2048 : 48, K = large ? 2048 : 256;
      return std::vector<Tensor>{f32_matrix(M, K, 320), f32_matrix(N, K, 321)};
    };
    c.forward = [la = la, lb = lb](const std::vector<Tensor>& in) {
      ops::Fp8CastOptions o;
      o.current_scaling = true;
      const Fp8Tensor a = ops::fp8_quantize(in[0], DType::F8E4M3, la, o);
      const Fp8Tensor b = ops::fp8_quantize(in[1], DType::F8E4M3, lb, o);
      ops::Fp8GemmOptions g;
      g.trans_b = true;
      g.out_dtype = DType::F32;
      return std::vector<Tensor>{ops::fp8_gemm(a, b, g)};
    };
    c.reference = [la = la, lb = lb](const std::vector<Tensor>& in) {
      const std::int64_t M = in[0].shape()[0], K = in[0].shape()[1], N = in[1].shape()[0];
      const auto a = quantised_values(in[0], DType::F8E4M3, la);
      const auto b = quantised_values(in[1], DType::F8E4M3, lb);
      return std::vector<Tensor>{f64_matrix(fp8test::gemm_ref(a, b, M, N, K, {}, false).value, M, N)};
    };
    cases.push_back(std::move(c));
  }
}

}  // namespace kiln::backend_ops
