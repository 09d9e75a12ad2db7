// FP8 GEMM on the CPU (the reference backend) against a float64 GEMM of the quantised inputs
// written in the test: every operand dtype pair, output dtype, transpose form, epilogue, fp8
// output, and every block-scaling pair; then the errors bad operands get, each naming the call
// and the operand.
#include <gtest/gtest.h>

#include <cmath>

#include "fp8_test_util.h"
#include "kiln/ops/copy.h"

namespace kiln {
namespace fp8_gemm_test {

using namespace fp8test;
using ops::Fp8Epilogue;
using ops::Fp8GemmOptions;

// Compares a GEMM result with the float64 reference. The CPU backend multiplies exactly in f64,
// so only the final rounding to the output dtype (and f64 summation order) separates them.
void expect_gemm(const Tensor& out, const GemmRef& ref, const std::string& what) {
  const auto got = out.to(Device::cpu()).to_vector<double>();
  const double rel = out.dtype() == DType::BF16 ? 1.0 / 256 : 1.2e-7;
  ASSERT_EQ(got.size(), ref.value.size());
  int bad = 0;
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double tol = rel * std::fabs(ref.value[i]) + 1e-12 * ref.magnitude[i];
    if (!(std::fabs(got[i] - ref.value[i]) <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref.value[i];
  }
}

std::vector<double> transpose(const std::vector<double>& v, std::int64_t rows, std::int64_t cols) {
  std::vector<double> t(v.size());
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      t[static_cast<std::size_t>(c * rows + r)] = v[static_cast<std::size_t>(r * cols + c)];
  return t;
}

TEST(Fp8Gemm, PerTensorEveryDtypePairOutputAndForm) {
  const std::int64_t M = 24, N = 48, K = 80;
  const std::pair<DType, DType> pairs[] = {
      {DType::F8E4M3, DType::F8E4M3}, {DType::F8E4M3, DType::F8E5M2}, {DType::F8E5M2, DType::F8E4M3}};
  for (auto [da, db] : pairs)
    for (DType out : {DType::BF16, DType::F32})
      for (bool ta : {false, true})
        for (bool tb : {true, false}) {
          // Operands stored as op() expects: a [M, K] or [K, M], b [N, K] or [K, N].
          Tensor xa = ta ? spread_values(K, M, 1, -3, 3) : spread_values(M, K, 1, -3, 3);
          Tensor xb = tb ? spread_values(N, K, 2, -3, 3) : spread_values(K, N, 2, -3, 3);
          Fp8Tensor a = ops::fp8_quantize(xa, da, ScalingLayout::PerTensor);
          Fp8Tensor b = ops::fp8_quantize(xb, db, ScalingLayout::PerTensor);
          Fp8GemmOptions o;
          o.trans_a = ta;
          o.trans_b = tb;
          o.out_dtype = out;
          Tensor y = ops::fp8_gemm(a, b, o);
          ASSERT_EQ(y.shape(), (Shape{M, N}));
          auto ea = exact(a), eb = exact(b);
          if (ta) ea = transpose(ea, K, M);
          if (!tb) eb = transpose(eb, K, N);
          expect_gemm(y, gemm_ref(ea, eb, M, N, K, {}, false),
                      std::string(dtype_name(da)) + "x" + std::string(dtype_name(db)) + " -> " +
                          std::string(dtype_name(out)) + (ta ? " ta" : "") + (tb ? " tb" : ""));
        }
}

TEST(Fp8Gemm, BiasGeluAndGeluBiasEpilogues) {
  const std::int64_t M = 16, N = 32, K = 64;
  Fp8Tensor a = ops::fp8_quantize(spread_values(M, K, 3, -2, 1), DType::F8E4M3, ScalingLayout::PerTensor);
  Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 4, -2, 1), DType::F8E4M3, ScalingLayout::PerTensor);
  Tensor bias = spread_values(1, N, 5, -2, 2).reshape({N}).to(DType::BF16);
  const auto bv = bias.to_vector<double>();
  for (auto e : {Fp8Epilogue::Bias, Fp8Epilogue::Gelu, Fp8Epilogue::GeluBias})
    for (DType out : {DType::BF16, DType::F32}) {
      Fp8GemmOptions o;
      o.epilogue = e;
      o.out_dtype = out;
      const bool has_bias = e != Fp8Epilogue::Gelu;
      if (has_bias) o.bias = bias;
      Tensor y = ops::fp8_gemm(a, b, o);
      expect_gemm(y,
                  gemm_ref(exact(a), exact(b), M, N, K, has_bias ? bv : std::vector<double>{}, e != Fp8Epilogue::Bias),
                  std::string(ops::fp8_epilogue_name(e)) + " -> " + std::string(dtype_name(out)));
    }
}

TEST(Fp8Gemm, Fp8OutputWithScaleAndAmax) {
  const std::int64_t M = 16, N = 32, K = 48;
  Fp8Tensor a = ops::fp8_quantize(spread_values(M, K, 6, -2, 2), DType::F8E4M3, ScalingLayout::PerTensor);
  for (DType t : {DType::F8E4M3, DType::F8E5M2}) {
    // cuBLASLt writes e5m2 only when an operand is e5m2 (the gradient side of TE's hybrid format).
    Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 7, -2, 2), t, ScalingLayout::PerTensor);
    const GemmRef ref = gemm_ref(exact(a), exact(b), M, N, K, {}, false);
    Fp8Tensor y = ops::fp8_empty(M, N, t, ScalingLayout::PerTensor, Device::cpu());
    ops::fill(y.scale, 0.25);
    ops::fp8_gemm_into(a, b, y);
    float amax = 0;
    for (double v : ref.value) amax = std::max(amax, std::fabs(static_cast<float>(v)));
    EXPECT_EQ(floats(y.amax)[0], amax) << dtype_name(t);
    EXPECT_EQ(floats(y.scale_inv)[0], 4.0f) << dtype_name(t);
    const auto got = bytes(y.data);
    for (std::size_t i = 0; i < got.size(); ++i)
      ASSERT_EQ(got[i], nearest_code(t, static_cast<float>(ref.value[i]) * 0.25f)) << dtype_name(t) << " " << i;
  }
}

TEST(Fp8Gemm, BlockScalingEveryLayoutPair) {
  // Partial blocks on every edge: K = 336 (2 full + 80), M = 136, N = 144.
  const std::int64_t M = 136, N = 144, K = 336;
  Tensor xa = spread_values(M, K, 8, -4, 4), xb = spread_values(N, K, 9, -4, 4);
  const ScalingLayout blocks[] = {ScalingLayout::Block1x128, ScalingLayout::Block128x128};
  for (auto la : blocks)
    for (auto lb : blocks)
      for (DType out : {DType::BF16, DType::F32}) {
        Fp8Tensor a = ops::fp8_quantize(xa, DType::F8E4M3, la);
        Fp8Tensor b = ops::fp8_quantize(xb, DType::F8E4M3, lb);
        Fp8GemmOptions o;
        o.out_dtype = out;
        expect_gemm(ops::fp8_gemm(a, b, o), gemm_ref(exact(a), exact(b), M, N, K, {}, false),
                    std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)));
        // With bias.
        Tensor bias = spread_values(1, N, 10, -1, 1).reshape({N}).to(DType::BF16);
        o.epilogue = Fp8Epilogue::Bias;
        o.bias = bias;
        expect_gemm(ops::fp8_gemm(a, b, o), gemm_ref(exact(a), exact(b), M, N, K, bias.to_vector<double>(), false),
                    std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)) + " + bias");
      }
}

TEST(Fp8Gemm, BlockScalingBeatsPerTensorOnBlockyData) {
  // Why block scaling exists: rows of very different magnitudes lose their small rows to a
  // per-tensor scale (subnormals / zero), while 1x128 blocks keep every row's relative precision.
  const std::int64_t M = 32, N = 32, K = 256;
  Tensor xa = spread_values(M, K, 12, -1, 1);
  auto v = xa.to_vector<float>();
  for (std::int64_t r = 0; r < M; ++r)
    for (std::int64_t k = 0; k < K; ++k) v[static_cast<std::size_t>(r * K + k)] *= std::exp2(-static_cast<float>(r));
  xa = Tensor::from_vector(v, {M, K});
  Tensor xb = spread_values(N, K, 13, -1, 1);
  std::vector<double> av(v.begin(), v.end());
  const auto bv = xb.to_vector<double>();
  const GemmRef truth = gemm_ref(av, bv, M, N, K, {}, false);
  auto rel_error_last_row = [&](const Tensor& y) {
    const auto g = y.to_vector<double>();
    double e = 0, n = 0;
    for (std::int64_t c = 0; c < N; ++c) {
      const auto i = static_cast<std::size_t>((M - 1) * N + c);
      e += std::fabs(g[i] - truth.value[i]);
      n += std::fabs(truth.value[i]);
    }
    return e / n;
  };
  Fp8GemmOptions o;
  o.out_dtype = DType::F32;
  const double blockwise =
      rel_error_last_row(ops::fp8_gemm(ops::fp8_quantize(xa, DType::F8E4M3, ScalingLayout::Block1x128),
                                       ops::fp8_quantize(xb, DType::F8E4M3, ScalingLayout::Block1x128), o));
  const double tensorwise =
      rel_error_last_row(ops::fp8_gemm(ops::fp8_quantize(xa, DType::F8E4M3, ScalingLayout::PerTensor),
                                       ops::fp8_quantize(xb, DType::F8E4M3, ScalingLayout::PerTensor), o));
  EXPECT_LT(blockwise, 0.15);  // fp8 rounding of both operands: a few percent
  EXPECT_GT(tensorwise, 0.5);  // the row fell below e4m3's smallest subnormal
}

// accumulate (a weight gradient into its fp32 main gradient): out = what out held + a b^T, for
// per-tensor operands in the transposed forms the wrapper rewrites and for every block pair; the
// output must be float32 and take no epilogue, and fp8_gemm (which makes its own out) refuses it.
TEST(Fp8Gemm, AccumulateAddsTheProductIntoAFloat32Out) {
  const std::int64_t M = 136, N = 144, K = 336;
  const Tensor before = spread_values(M, N, 11, -2, 2);
  auto expect_accumulated = [&](const Fp8Tensor& a, const Fp8Tensor& b, const Fp8GemmOptions& o, std::vector<double> ea,
                                std::vector<double> eb, const std::string& what) {
    Tensor out = before.clone();
    ops::fp8_gemm_into(a, b, out, o);
    GemmRef ref = gemm_ref(ea, eb, M, N, K, {}, false);
    const std::vector<double> held = before.to_vector<double>();
    for (std::size_t i = 0; i < held.size(); ++i) {
      ref.value[i] += held[i];
      ref.magnitude[i] += std::fabs(held[i]);
    }
    expect_gemm(out, ref, what);
  };
  Fp8GemmOptions o;
  o.out_dtype = DType::F32;
  o.accumulate = true;
  for (bool ta : {false, true}) {
    const Tensor xa = ta ? spread_values(K, M, 12, -3, 3) : spread_values(M, K, 12, -3, 3);
    const Fp8Tensor a = ops::fp8_quantize(xa, DType::F8E5M2, ScalingLayout::PerTensor);
    const Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 13, -3, 3), DType::F8E4M3, ScalingLayout::PerTensor);
    Fp8GemmOptions ot = o;
    ot.trans_a = ta;
    expect_accumulated(a, b, ot, ta ? transpose(exact(a), K, M) : exact(a), exact(b),
                       ta ? "per-tensor, trans_a" : "per-tensor");
  }
  const ScalingLayout blocks[] = {ScalingLayout::Block1x128, ScalingLayout::Block128x128};
  for (auto la : blocks)
    for (auto lb : blocks) {
      const Fp8Tensor a = ops::fp8_quantize(spread_values(M, K, 14, -4, 4), DType::F8E4M3, la);
      const Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 15, -4, 4), DType::F8E4M3, lb);
      expect_accumulated(a, b, o, exact(a), exact(b),
                         std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)));
    }
  const Fp8Tensor a = ops::fp8_quantize(spread_values(M, K, 16, -1, 1), DType::F8E4M3, ScalingLayout::PerTensor);
  const Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 17, -1, 1), DType::F8E4M3, ScalingLayout::PerTensor);
  auto refused = [&](const Tensor& out, const Fp8GemmOptions& opts, const std::string& expected) {
    try {
      ops::fp8_gemm_into(a, b, out, opts);
      ADD_FAILURE() << "accepted: " << expected;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(expected), std::string::npos) << e.what();
    }
  };
  refused(Tensor::zeros({M, N}, DType::BF16), o, "accumulate adds into a float32 out (got bfloat16)");
  Fp8GemmOptions gelu = o;
  gelu.epilogue = Fp8Epilogue::Gelu;
  refused(Tensor::zeros({M, N}), gelu, "accumulate takes no epilogue");
  try {
    (void)ops::fp8_gemm(a, b, o);
    ADD_FAILURE() << "fp8_gemm accepted accumulate without an out";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("accumulate needs an out to add into"), std::string::npos) << e.what();
  }
}

TEST(Fp8Gemm, RefusesBadOperandsNamingTheCallAndOperand) {
  const auto cpu = Device::cpu();
  Fp8Tensor a = ops::fp8_quantize(Tensor::randn({16, 32}, 1), DType::F8E4M3, ScalingLayout::PerTensor);
  Fp8Tensor b = ops::fp8_quantize(Tensor::randn({16, 32}, 2), DType::F8E4M3, ScalingLayout::PerTensor);
  // Without scales.
  Fp8Tensor no_scale = a;
  no_scale.scale_inv = Tensor();
  expect_error([&] { (void)ops::fp8_gemm(no_scale, b); }, {"fp8_gemm", "a.scale_inv is missing"});
  Fp8Tensor b_no_scale = b;
  b_no_scale.scale_inv = Tensor();
  expect_error([&] { (void)ops::fp8_gemm(a, b_no_scale); }, {"fp8_gemm", "b.scale_inv is missing"});
  // Wrong dtypes.
  Fp8Tensor bf = a;
  bf.data = Tensor::zeros({16, 32}, DType::BF16);
  expect_error([&] { (void)ops::fp8_gemm(bf, b); }, {"fp8_gemm", "a.data has dtype bfloat16"});
  Fp8Tensor f64_scale = b;
  f64_scale.scale_inv = Tensor::ones({1}, DType::F64);
  expect_error([&] { (void)ops::fp8_gemm(a, f64_scale); }, {"fp8_gemm", "b.scale_inv has dtype float64"});
  Fp8GemmOptions f16_out;
  f16_out.out_dtype = DType::F16;
  expect_error([&] { (void)ops::fp8_gemm(a, b, f16_out); }, {"fp8_gemm", "out_dtype float16"});
  // e5m2 x e5m2.
  Fp8Tensor a52 = ops::fp8_quantize(Tensor::randn({16, 32}, 1), DType::F8E5M2, ScalingLayout::PerTensor);
  Fp8Tensor b52 = ops::fp8_quantize(Tensor::randn({16, 32}, 2), DType::F8E5M2, ScalingLayout::PerTensor);
  expect_error([&] { (void)ops::fp8_gemm(a52, b52); }, {"fp8_gemm", "a and b are both float8_e5m2"});
  // Shapes cuBLASLt cannot take.
  Fp8Tensor k24 = ops::fp8_quantize(Tensor::randn({16, 24}, 3), DType::F8E4M3, ScalingLayout::PerTensor);
  expect_error([&] { (void)ops::fp8_gemm(k24, k24); }, {"fp8_gemm", "K = 24", "multiple of 16"});
  Fp8Tensor n8 = ops::fp8_quantize(Tensor::randn({8, 32}, 4), DType::F8E4M3, ScalingLayout::PerTensor);
  expect_error([&] { (void)ops::fp8_gemm(a, n8); }, {"fp8_gemm", "N = 8", "multiple of 16"});
  Fp8Tensor k48 = ops::fp8_quantize(Tensor::randn({16, 48}, 5), DType::F8E4M3, ScalingLayout::PerTensor);
  expect_error([&] { (void)ops::fp8_gemm(a, k48); }, {"fp8_gemm", "inner dimensions differ"});
  // A block layout that does not match the shape.
  Fp8Tensor a_blk = ops::fp8_quantize(Tensor::randn({16, 256}, 6), DType::F8E4M3, ScalingLayout::Block1x128);
  Fp8Tensor b_blk = ops::fp8_quantize(Tensor::randn({16, 256}, 7), DType::F8E4M3, ScalingLayout::Block128x128);
  Fp8Tensor mislabeled = a_blk;
  mislabeled.layout = ScalingLayout::Block128x128;
  expect_error([&] { (void)ops::fp8_gemm(mislabeled, b_blk); }, {"fp8_gemm", "a.scale", "128x128", "[1, 4]"});
  Fp8Tensor wrong_shape = b_blk;
  wrong_shape.data = Tensor::zeros({256, 256}, DType::F8E4M3);
  expect_error([&] { (void)ops::fp8_gemm(a_blk, wrong_shape); }, {"fp8_gemm", "b.scale", "[256, 256]", "[2, 4]"});
  // Block scaling with what it cannot do.
  expect_error([&] { (void)ops::fp8_gemm(a_blk, b); }, {"fp8_gemm", "1x128", "per_tensor", "do not mix"});
  Fp8GemmOptions gelu;
  gelu.epilogue = Fp8Epilogue::Gelu;
  expect_error([&] { (void)ops::fp8_gemm(a_blk, b_blk, gelu); }, {"fp8_gemm", "epilogue gelu", "block scaling"});
  Fp8GemmOptions ta;
  ta.trans_a = true;
  expect_error([&] { (void)ops::fp8_gemm(a_blk, b_blk, ta); }, {"fp8_gemm", "trans_a", "fp8_quantize_transpose_into"});
  Fp8GemmOptions fast;
  fast.fast_accum = true;
  expect_error([&] { (void)ops::fp8_gemm(a_blk, b_blk, fast); }, {"fp8_gemm", "fast_accum"});
  // Bias problems.
  Fp8GemmOptions bias;
  bias.epilogue = Fp8Epilogue::Bias;
  expect_error([&] { (void)ops::fp8_gemm(a, b, bias); }, {"fp8_gemm", "epilogue bias needs a bias"});
  bias.bias = Tensor::zeros({16}, DType::F32);
  expect_error([&] { (void)ops::fp8_gemm(a, b, bias); }, {"fp8_gemm", "bias must be a contiguous bfloat16 [16]"});
  Fp8GemmOptions stray;
  stray.bias = Tensor::zeros({16}, DType::BF16);
  expect_error([&] { (void)ops::fp8_gemm(a, b, stray); }, {"fp8_gemm", "does not add one"});
  // fp8 output needs per-tensor scaling on both sides.
  Fp8Tensor y = ops::fp8_empty(16, 16, DType::F8E4M3, ScalingLayout::PerTensor, cpu);
  Fp8Tensor a_blk16 = ops::fp8_quantize(Tensor::randn({16, 128}, 8), DType::F8E4M3, ScalingLayout::Block1x128);
  Fp8Tensor b_blk16 = ops::fp8_quantize(Tensor::randn({16, 128}, 9), DType::F8E4M3, ScalingLayout::Block1x128);
  expect_error([&] { ops::fp8_gemm_into(a_blk16, b_blk16, y); }, {"fp8_gemm", "fp8 output", "per-tensor"});
  Fp8Tensor y52 = ops::fp8_empty(16, 16, DType::F8E5M2, ScalingLayout::PerTensor, cpu);
  expect_error([&] { ops::fp8_gemm_into(a, b, y52); }, {"fp8_gemm", "out is float8_e5m2", "e4m3"});
}

}  // namespace fp8_gemm_test
}  // namespace kiln
