// Cases of the FP8 producer kernels (te/fused_ops.h's *Fp8Forward: a norm or SwiGLU writing the
// next FP8 linear's input cast), the batched delayed update and the block transpose-cast. The
// references are float64 transcriptions that share no code with the kernels: the norm / SwiGLU in
// float64, its value rounded to float32 and multiplied by the scale in single precision, the
// nearest fp8 code (tests/fp8's rounding) times 1 / scale.
#include <cmath>

#include "../fp8/fp8_test_util.h"
#include "harness.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/fp8.h"
#include "kiln/ops/fp8_kernels.h"
#include "kiln/te/fused_norm.h"
#include "kiln/te/fused_ops.h"
#include "kiln/te/swiglu.h"

namespace kiln::backend_ops {

namespace cases_fp8_producers {

constexpr float kScale = 7.0f;  // a delayed scale: some of the outputs saturate e4m3's 448

double quantised(double y) {
  const float v = static_cast<float>(y) * kScale;
  return fp8test::decode(DType::F8E4M3, fp8test::nearest_code(DType::F8E4M3, v)) * static_cast<double>(1.0f / kScale);
}

Tensor dequantised(const Fp8Tensor& q) { return ops::fp8_dequantize(q, DType::F64); }

Fp8Tensor scaled_output(std::int64_t rows, std::int64_t cols, Device d) {
  Fp8Tensor q = ops::fp8_empty(rows, cols, DType::F8E4M3, ScalingLayout::PerTensor, d);
  ops::fill(q.scale, kScale);
  return q;
}

}  // namespace cases_fp8_producers

void add_fp8_producer_cases(std::vector<OpCase>& cases) {
  using namespace cases_fp8_producers;  // this file's helpers (a named namespace: the tests compile in unity batches)
  {
    OpCase c;
    c.name = "te_fp8_producers/add_norms";
    c.kernels = {te::kAddRmsNormFp8ForwardOp, te::kAddLayerNormFp8ForwardOp, ops::kFp8DequantizeOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      const std::int64_t rows = large ? 8192 : 24, cols = large ? 4096 : 96;
      return std::vector<Tensor>{randn({rows, cols}, 1, 3.0).to(DType::F32), randn({rows, cols}, 2).to(DType::F32),
                                 randn({cols}, 3, 0.5, 1.0).to(DType::F32), randn({cols}, 4, 0.1).to(DType::F32)};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      const std::int64_t rows = in[0].shape()[0], cols = in[0].shape()[1];
      const Fp8Tensor rms = scaled_output(rows, cols, in[0].device()), ln = scaled_output(rows, cols, in[0].device());
      te::add_rms_norm_fp8(in[0], in[1], in[2], 1e-5, rms);
      te::add_layer_norm_fp8(in[0], in[1], in[2], in[3], 1e-5, ln);
      return std::vector<Tensor>{dequantised(rms), dequantised(ln)};
    };
    c.reference = [](const std::vector<Tensor>& in) {
      const std::int64_t rows = in[0].shape()[0], cols = in[0].shape()[1];
      const auto x = in[0].to_vector<double>(), r = in[1].to_vector<double>(), w = in[2].to_vector<double>(),
                 b = in[3].to_vector<double>();
      std::vector<double> rms(x.size()), ln(x.size());
      for (std::int64_t i = 0; i < rows; ++i) {
        std::vector<double> s(static_cast<std::size_t>(cols));
        double mean = 0, sq = 0, ms = 0;
        for (std::int64_t j = 0; j < cols; ++j) {
          const auto k = static_cast<std::size_t>(i * cols + j);
          s[static_cast<std::size_t>(j)] = static_cast<float>(x[k] + r[k]);  // the sum is stored at float32
          mean += s[static_cast<std::size_t>(j)] / static_cast<double>(cols);
        }
        for (double v : s) {
          sq += (v - mean) * (v - mean) / static_cast<double>(cols);
          ms += v * v / static_cast<double>(cols);
        }
        for (std::int64_t j = 0; j < cols; ++j) {
          const auto k = static_cast<std::size_t>(i * cols + j), jj = static_cast<std::size_t>(j);
          rms[k] = quantised(s[jj] / std::sqrt(ms + 1e-5) * w[jj]);
          ln[k] = quantised((s[jj] - mean) / std::sqrt(sq + 1e-5) * w[jj] + b[jj]);
        }
      }
      return std::vector<Tensor>{Tensor::from_vector(rms, {rows, cols}), Tensor::from_vector(ln, {rows, cols})};
    };
    cases.push_back(std::move(c));
  }
  {
    OpCase c;
    c.name = "te_fp8_producers/swiglu";
    c.kernels = {te::kSwigluFp8ForwardOp, ops::kFp8DequantizeOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      return std::vector<Tensor>{randn({large ? 16384 : 40, large ? 8192 : 96}, 5, 2.5).to(DType::F32)};
    };
    c.forward = [](const std::vector<Tensor>& in) {
      const std::int64_t rows = in[0].shape()[0], f = in[0].shape()[1] / 2;
      const Fp8Tensor q = scaled_output(rows, f, in[0].device());
      te::swiglu_fp8(in[0], q);
      return std::vector<Tensor>{dequantised(q)};
    };
    c.reference = [](const std::vector<Tensor>& in) {
      const std::int64_t rows = in[0].shape()[0], f = in[0].shape()[1] / 2;
      const auto x = in[0].to_vector<double>();
      std::vector<double> out(static_cast<std::size_t>(rows * f));
      for (std::int64_t i = 0; i < rows; ++i)
        for (std::int64_t j = 0; j < f; ++j) {
          const double g = x[static_cast<std::size_t>(i * 2 * f + j)],
                       u = x[static_cast<std::size_t>(i * 2 * f + f + j)];
          out[static_cast<std::size_t>(i * f + j)] = quantised(g / (1.0 + std::exp(-g)) * u);
        }
      return std::vector<Tensor>{Tensor::from_vector(out, {rows, f})};
    };
    cases.push_back(std::move(c));
  }
  {
    // The batched update: three histories of different lengths, each against TE's rule.
    constexpr float kScaledMax = 448.0f;
    OpCase c;
    c.name = "fp8/delayed_scaling_update_many";
    c.kernels = {ops::kFp8DelayedScalingUpdateManyOp};
    c.native = true;
    c.dtypes = {};
    c.inputs = [](bool large) {
      std::vector<Tensor> h;
      for (std::int64_t len : {large ? 1024 : 5, 1, 3}) {
        std::vector<float> v(static_cast<std::size_t>(len));
        for (std::size_t i = 0; i < v.size(); ++i) v[i] = 0.5f + static_cast<float>((i * 29 + len) % 13);
        h.push_back(Tensor::from_vector(v, {len}));
      }
      return h;
    };
    c.forward = [](const std::vector<Tensor>& in) {
      std::vector<ops::Fp8DelayedScalingRef> refs;
      std::vector<Tensor> out;
      for (const Tensor& h : in)
        refs.push_back({h.clone(), Tensor::ones({1}, DType::F32, h.device()), Tensor::ones({1}, DType::F32, h.device()),
                        kScaledMax});
      ops::fp8_delayed_scaling_update_many(refs, ops::AmaxComputeAlgo::Max);
      for (const auto& r : refs) out.insert(out.end(), {r.amax_history, r.scale, r.scale_inv});
      return out;
    };
    c.reference = [](const std::vector<Tensor>& in) {
      std::vector<Tensor> out;
      for (const Tensor& t : in) {
        const std::vector<double> h = t.to_vector<double>();
        const std::size_t n = h.size();
        std::vector<double> rolled(n, 0.0);
        for (std::size_t i = 1; i + 1 < n; ++i) rolled[i] = h[i + 1];
        if (n > 1) rolled[n - 1] = h[0];
        double amax = 0;
        for (double v : h) amax = std::max(amax, v);
        const double scale = static_cast<double>(kScaledMax) / amax;
        out.push_back(Tensor::from_vector(rolled, {static_cast<std::int64_t>(n)}));
        out.push_back(Tensor::from_vector(std::vector<double>{scale}, {1}));
        out.push_back(Tensor::from_vector(std::vector<double>{1.0 / scale}, {1}));
      }
      return out;
    };
    cases.push_back(std::move(c));
  }
}

}  // namespace kiln::backend_ops
