// CUDA FP8 kernels against the CPU reference: casts must give the same bits (the CPU emulates
// the hardware's round-to-nearest-even conversion and computes scales with the same f32 steps),
// dequantisation the same values, and the cuBLASLt GEMMs the float64 result of the quantised
// inputs within f32 accumulation error. Skips without a GPU.
#include <gtest/gtest.h>

#include <cmath>

#include "../fp8/fp8_test_util.h"
#include "kiln/ops/copy.h"
#if KILN_WITH_CUDA
#include "kiln/ops/cuda/fp8_cuda.h"
#include "kiln/runtime/cuda/cuda_graph.h"
#endif
#include "test_util.h"

namespace kiln {
namespace fp8_test {

using namespace fp8test;
using cudatest::gpu;
using ops::Fp8CastOptions;
using ops::Fp8Epilogue;
using ops::Fp8GemmOptions;

constexpr ScalingLayout kLayouts[] = {ScalingLayout::PerTensor, ScalingLayout::Block1x128, ScalingLayout::Block128x128};

void expect_same_fp8(const Fp8Tensor& cuda, const Fp8Tensor& cpu, const std::string& what) {
  EXPECT_EQ(bytes(cuda.data), bytes(cpu.data)) << what << ": data";
  EXPECT_EQ(floats(cuda.scale), floats(cpu.scale)) << what << ": scale";
  EXPECT_EQ(floats(cuda.scale_inv), floats(cpu.scale_inv)) << what << ": scale_inv";
  EXPECT_EQ(floats(cuda.amax), floats(cpu.amax)) << what << ": amax";
}

Fp8Tensor to_gpu(const Fp8Tensor& t) {
  return Fp8Tensor{t.data.to(gpu()), t.scale.to(gpu()), t.scale_inv.to(gpu()), t.amax.to(gpu()), t.layout};
}

// Rows and 128-column groups of very different magnitudes (some reaching fp8's subnormals).
Tensor blocky(std::int64_t rows, std::int64_t cols, std::uint64_t seed) {
  Tensor x = spread_values(rows, cols, seed, -6, 6);
  auto v = x.to_vector<float>();
  for (std::int64_t r = 0; r < rows; ++r)
    for (std::int64_t c = 0; c < cols; ++c)
      v[static_cast<std::size_t>(r * cols + c)] *= std::exp2(static_cast<float>((r * 7 + (c / 128) * 5) % 23 - 11));
  return Tensor::from_vector(v, {rows, cols});
}

TEST(CudaFp8, CastsGiveTheCpuBitsForEveryLayoutDtypeAndMode) {
  KILN_REQUIRE_CUDA();
  const Tensor x = blocky(200, 300, 41);
  for (DType in : {DType::F32, DType::BF16, DType::F16})
    for (DType t : {DType::F8E4M3, DType::F8E5M2})
      for (auto layout : kLayouts)
        for (int mode = 0; mode < 3; ++mode) {  // delayed (per tensor) / computed / computed pow2
          Fp8CastOptions o;
          o.current_scaling = mode > 0;
          o.power_of_two_scales = mode == 2;
          if (layout != ScalingLayout::PerTensor && mode == 0) continue;
          const Tensor xin = x.to(in);
          Fp8Tensor c = ops::fp8_empty(200, 300, t, layout, Device::cpu());
          Fp8Tensor g = ops::fp8_empty(200, 300, t, layout, gpu());
          if (mode == 0) {
            ops::fill(c.scale, 0.37);
            ops::fill(g.scale, 0.37);
          }
          ops::fp8_quantize_into(xin, c, o);
          ops::fp8_quantize_into(xin.to(gpu()), g, o);
          const std::string what = std::string(dtype_name(in)) + " -> " + std::string(dtype_name(t)) + " " +
                                   std::string(scaling_layout_name(layout)) + " mode " + std::to_string(mode);
          expect_same_fp8(g, c, what);
          // The columnwise half of the transpose-cast reads x through transposed strides.
          Fp8Tensor ct = ops::fp8_empty(300, 200, t, layout, Device::cpu());
          Fp8Tensor gt = ops::fp8_empty(300, 200, t, layout, gpu());
          Fp8Tensor cr = ops::fp8_empty(200, 300, t, layout, Device::cpu());
          Fp8Tensor gr = ops::fp8_empty(200, 300, t, layout, gpu());
          if (mode == 0) {
            for (auto* s : {&ct.scale, &gt.scale, &cr.scale, &gr.scale}) ops::fill(*s, 0.37);
          }
          ops::fp8_quantize_transpose_into(xin, cr, ct, o);
          ops::fp8_quantize_transpose_into(xin.to(gpu()), gr, gt, o);
          expect_same_fp8(gt, ct, what + " columnwise");
          expect_same_fp8(gr, cr, what + " rowwise");
        }
}

TEST(CudaFp8, EdgeValuesConvertLikeTheCpu) {
  KILN_REQUIRE_CUDA();
  // Midpoints between every pair of neighbouring codes (ties), values past the maximum, +-inf,
  // signed zeros and subnormals, cast with scale 1.
  for (DType t : {DType::F8E4M3, DType::F8E5M2}) {
    std::vector<float> v = {0.0f, -0.0f, INFINITY, -INFINITY, 1e30f, -1e30f, 1e-30f, -1e-30f};
    for (int c = 0; c < 127; ++c) {
      const double lo = decode(t, static_cast<std::uint8_t>(c)), hi = decode(t, static_cast<std::uint8_t>(c + 1));
      if (!std::isfinite(lo) || !std::isfinite(hi)) continue;
      const auto mid = static_cast<float>((lo + hi) / 2);  // exact: fp8 values have few bits
      for (float f : {mid, static_cast<float>(lo), std::nextafterf(mid, static_cast<float>(hi)),
                      std::nextafterf(mid, static_cast<float>(lo))}) {
        v.push_back(f);
        v.push_back(-f);
      }
    }
    const auto n = static_cast<std::int64_t>(v.size());
    Tensor x = Tensor::from_vector(v, {1, n});
    Fp8Tensor c = ops::fp8_empty(1, n, t, ScalingLayout::PerTensor, Device::cpu());
    Fp8Tensor g = ops::fp8_empty(1, n, t, ScalingLayout::PerTensor, gpu());
    ops::fp8_quantize_into(x, c);
    ops::fp8_quantize_into(x.to(gpu()), g);
    const auto cb = bytes(c.data), gb = bytes(g.data);
    for (std::size_t i = 0; i < cb.size(); ++i) EXPECT_EQ(int(gb[i]), int(cb[i])) << dtype_name(t) << " value " << v[i];
  }
}

TEST(CudaFp8, DequantizeMatchesTheCpu) {
  KILN_REQUIRE_CUDA();
  const Tensor x = blocky(136, 384, 43);
  for (DType t : {DType::F8E4M3, DType::F8E5M2})
    for (auto layout : kLayouts) {
      Fp8Tensor q = ops::fp8_quantize(x, t, layout);
      for (DType out : {DType::F64, DType::F32, DType::BF16, DType::F16}) {
        Tensor c = ops::fp8_dequantize(q, out);
        Tensor g = ops::fp8_dequantize(to_gpu(q), out);
        EXPECT_EQ(bytes(g), bytes(c)) << dtype_name(t) << " " << scaling_layout_name(layout) << " -> "
                                      << dtype_name(out);
      }
    }
}

// Hopper's FP8 tensor cores keep about 14 mantissa bits in the accumulator between cuBLASLt's
// promotions to f32 (DeepSeek-V3's report measured the same on H800), so even without fast_accum
// the error scales with sum |a b| at about 2^-14 (measured on the H200 2026-12-02: up to 2.4e-5 of
// sum |a b|); kFp8Accumulation allows 2^-12. fast_accum promotes less often. bf16 output adds its
// rounding.
constexpr double kFp8Accumulation = 1.0 / 4096;
// cuBLASLt's block-scaled modes on Hopper: up to 5.0e-4 of sum |a b| measured on the H200
// (2026-12-02) with block scales spread over 2^-11..2^11; allowed 2^-10.
constexpr double kFp8BlockAccumulation = 1.0 / 1024;
void expect_gemm_close(const Tensor& got_t, const GemmRef& ref, double acc_rel, const std::string& what) {
  const auto got = got_t.to(Device::cpu()).to_vector<double>();
  const double out_rel = got_t.dtype() == DType::BF16 ? 1.0 / 256 : 1.2e-7;
  int bad = 0;
  double worst = 0;  // the largest error as a fraction of sum |a b|, for the log
  for (std::size_t i = 0; i < got.size(); ++i) {
    const double err = std::fabs(got[i] - ref.value[i]);
    const double tol = out_rel * std::fabs(ref.value[i]) + acc_rel * ref.magnitude[i] + 1e-30;
    if (ref.magnitude[i] > 0)
      worst = std::max(worst, std::max(0.0, err - out_rel * std::fabs(ref.value[i])) / ref.magnitude[i]);
    if (!(err <= tol) && bad++ < 5)
      ADD_FAILURE() << what << ": element " << i << " got " << got[i] << " want " << ref.value[i] << " (sum |a b| "
                    << ref.magnitude[i] << ")";
  }
  if (bad) ADD_FAILURE() << what << ": " << bad << " elements outside; worst error / sum |a b| = " << worst;
}

TEST(CudaFp8, PerTensorGemmsMatchTheFloat64Reference) {
  KILN_REQUIRE_CUDA();
  const std::int64_t M = 96, N = 160, K = 512;
  const Tensor xa = spread_values(M, K, 51, -3, 3), xb = spread_values(N, K, 52, -3, 3);
  const Tensor xat = ops::contiguous(xa.t()), xbt = ops::contiguous(xb.t());
  const Tensor bias = spread_values(1, N, 53, -2, 2).reshape({N}).to(DType::BF16);
  const std::pair<DType, DType> pairs[] = {
      {DType::F8E4M3, DType::F8E4M3}, {DType::F8E4M3, DType::F8E5M2}, {DType::F8E5M2, DType::F8E4M3}};
  for (auto [da, db] : pairs)
    for (DType out : {DType::BF16, DType::F32})
      for (bool fast : {false, true})
        for (auto e : {Fp8Epilogue::None, Fp8Epilogue::Bias, Fp8Epilogue::Gelu, Fp8Epilogue::GeluBias})
          for (int form = 0; form < 2; ++form) {  // 0: native (a [M,K], b [N,K]); 1: a [K,M], b [K,N]
            Fp8Tensor a = ops::fp8_quantize(form ? xat : xa, da, ScalingLayout::PerTensor);
            Fp8Tensor b = ops::fp8_quantize(form ? xbt : xb, db, ScalingLayout::PerTensor);
            Fp8GemmOptions o;
            o.out_dtype = out;
            o.fast_accum = fast;
            o.epilogue = e;
            o.trans_a = form == 1;
            o.trans_b = form == 0;
            if (e == Fp8Epilogue::Bias || e == Fp8Epilogue::GeluBias) o.bias = bias;
            const Tensor want_cpu = ops::fp8_gemm(a, b, o);  // the CPU backend: exact, then rounded
            if (e == Fp8Epilogue::Bias || e == Fp8Epilogue::GeluBias) o.bias = bias.to(gpu());
            const Tensor got = ops::fp8_gemm(to_gpu(a), to_gpu(b), o);
            // Reference from the test's own dequantisation (native form).
            Fp8Tensor an = ops::fp8_quantize(xa, da, ScalingLayout::PerTensor);
            Fp8Tensor bn = ops::fp8_quantize(xb, db, ScalingLayout::PerTensor);
            const GemmRef ref =
                gemm_ref(exact(an), exact(bn), M, N, K,
                         (e == Fp8Epilogue::Bias || e == Fp8Epilogue::GeluBias) ? bias.to_vector<double>()
                                                                                : std::vector<double>{},
                         e == Fp8Epilogue::Gelu || e == Fp8Epilogue::GeluBias);
            const std::string what = std::string(dtype_name(da)) + " x " + std::string(dtype_name(db)) + " -> " +
                                     std::string(dtype_name(out)) + (fast ? " fast" : "") + " " +
                                     std::string(ops::fp8_epilogue_name(e)) + " form " + std::to_string(form);
            expect_gemm_close(got, ref, fast ? 2e-3 : kFp8Accumulation, what);
            expect_gemm_close(want_cpu, ref, 1e-12, what + " (cpu)");
          }
}

TEST(CudaFp8, Fp8OutputGemmMatchesTheCpu) {
  KILN_REQUIRE_CUDA();
  const std::int64_t M = 64, N = 128, K = 256;
  Fp8Tensor a = ops::fp8_quantize(spread_values(M, K, 61, -2, 2), DType::F8E4M3, ScalingLayout::PerTensor);
  for (DType t : {DType::F8E4M3, DType::F8E5M2}) {
    // e5m2 output needs an e5m2 operand (cuBLASLt's table).
    Fp8Tensor b = ops::fp8_quantize(spread_values(N, K, 62, -2, 2), t, ScalingLayout::PerTensor);
    Fp8Tensor yc = ops::fp8_empty(M, N, t, ScalingLayout::PerTensor, Device::cpu());
    Fp8Tensor yg = ops::fp8_empty(M, N, t, ScalingLayout::PerTensor, gpu());
    ops::fill(yc.scale, 0.5);
    ops::fill(yg.scale, 0.5);
    ops::fp8_gemm_into(a, b, yc);
    ops::fp8_gemm_into(to_gpu(a), to_gpu(b), yg);
    // amax is of the f32 result before the cast: the accumulator's rounding shows in it.
    EXPECT_NEAR(floats(yg.amax)[0], floats(yc.amax)[0], 2e-4 * floats(yc.amax)[0]) << dtype_name(t);
    EXPECT_EQ(floats(yg.scale_inv)[0], 2.0f);
    // Accumulation order may move a value across a rounding boundary: at most one code apart.
    const auto gb = bytes(yg.data), cb = bytes(yc.data);
    int off = 0;
    for (std::size_t i = 0; i < gb.size(); ++i) {
      const double g = decode(t, gb[i]), c = decode(t, cb[i]);
      const int steps = std::abs(int(gb[i] & 0x7f) - int(cb[i] & 0x7f));
      if (g != c) ++off;
      ASSERT_TRUE(g == c || ((gb[i] & 0x80) == (cb[i] & 0x80) && steps <= 1)) << i << ": " << g << " vs " << c;
    }
    EXPECT_LT(off, static_cast<int>(gb.size() / 50)) << dtype_name(t);
  }
}

TEST(CudaFp8, BlockScaledGemmsMatchTheFloat64Reference) {
  KILN_REQUIRE_CUDA();
  const std::int64_t M = 256, N = 384, K = 640;
  const Tensor xa = blocky(M, K, 71), xb = blocky(N, K, 72);
  const Tensor bias = spread_values(1, N, 73, -2, 2).reshape({N}).to(DType::BF16);
  const std::pair<ScalingLayout, ScalingLayout> pairs[] = {{ScalingLayout::Block1x128, ScalingLayout::Block128x128},
                                                           {ScalingLayout::Block1x128, ScalingLayout::Block1x128},
                                                           {ScalingLayout::Block128x128, ScalingLayout::Block1x128}};
  for (auto [la, lb] : pairs)
    for (DType out : {DType::BF16, DType::F32})
      for (bool with_bias : {false, true}) {
        Fp8Tensor a = ops::fp8_quantize(xa, DType::F8E4M3, la);
        Fp8Tensor b = ops::fp8_quantize(xb, DType::F8E4M3, lb);
        Fp8GemmOptions o;
        o.out_dtype = out;
        if (with_bias) {
          o.epilogue = Fp8Epilogue::Bias;
          o.bias = bias.to(gpu());
        }
        const Tensor got = ops::fp8_gemm(to_gpu(a), to_gpu(b), o);
        const GemmRef ref =
            gemm_ref(exact(a), exact(b), M, N, K, with_bias ? bias.to_vector<double>() : std::vector<double>{}, false);
        expect_gemm_close(got, ref, kFp8BlockAccumulation,
                          std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)) + " -> " +
                              std::string(dtype_name(out)) + (with_bias ? " + bias" : ""));
      }
  // cuBLASLt has no 128x128 x 128x128: that pair runs on Kiln's own kernel.
  Fp8Tensor a = ops::fp8_quantize(xa, DType::F8E4M3, ScalingLayout::Block128x128);
  Fp8Tensor b = ops::fp8_quantize(xb, DType::F8E4M3, ScalingLayout::Block128x128);
  expect_gemm_close(ops::fp8_gemm(to_gpu(a), to_gpu(b)), gemm_ref(exact(a), exact(b), M, N, K, {}, false),
                    kFp8Accumulation, "128x128 x 128x128 (Kiln's kernel)");
}

// accumulate (beta = 1, a weight gradient into its fp32 main gradient) on cuBLASLt (per-tensor,
// 1x128 pairs) and on Kiln's kernel (128x128 x 128x128): what out held plus the float64 product.
TEST(CudaFp8, AccumulatingGemmsAddIntoTheFloat32Out) {
  KILN_REQUIRE_CUDA();
  const std::int64_t M = 256, N = 384, K = 640;
  // Per-tensor operands on values of one range (as PerTensorGemmsMatchTheFloat64Reference: blocky data
  // spanning 2^22 exceeds what kFp8Accumulation was measured on), block-scaled ones on blocky data.
  const Tensor sa = spread_values(M, K, 84, -3, 3), sb = spread_values(N, K, 85, -3, 3);
  const Tensor xa = blocky(M, K, 81), xb = blocky(N, K, 82);
  const Tensor before = spread_values(M, N, 83, -3, 3);
  const std::vector<double> held = before.to_vector<double>();
  const std::pair<ScalingLayout, ScalingLayout> pairs[] = {{ScalingLayout::PerTensor, ScalingLayout::PerTensor},
                                                           {ScalingLayout::Block1x128, ScalingLayout::Block1x128},
                                                           {ScalingLayout::Block1x128, ScalingLayout::Block128x128},
                                                           {ScalingLayout::Block128x128, ScalingLayout::Block128x128}};
  for (auto [la, lb] : pairs) {
    // The hybrid recipe's wgrad: e5m2 gradients x e4m3 inputs; the blockwise recipe casts both to e4m3.
    const bool per_tensor = la == ScalingLayout::PerTensor;
    const DType da = per_tensor ? DType::F8E5M2 : DType::F8E4M3;
    const Fp8Tensor a = ops::fp8_quantize(per_tensor ? sa : xa, da, la),
                    b = ops::fp8_quantize(per_tensor ? sb : xb, DType::F8E4M3, lb);
    Fp8GemmOptions o;
    o.out_dtype = DType::F32;
    o.accumulate = true;
    Tensor out = before.to(gpu());
    ops::fp8_gemm_into(to_gpu(a), to_gpu(b), out, o);
    GemmRef ref = gemm_ref(exact(a), exact(b), M, N, K, {}, false);
    for (std::size_t i = 0; i < held.size(); ++i) {
      ref.value[i] += held[i];
      ref.magnitude[i] += std::fabs(held[i]);
    }
    expect_gemm_close(
        out, ref, la == ScalingLayout::PerTensor ? kFp8Accumulation : kFp8BlockAccumulation,
        std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)) + " accumulated");
  }
}

#if KILN_WITH_CUDA
TEST(CudaFp8, KilnBlockGemmKernelMatchesForEveryLayoutPair) {
  KILN_REQUIRE_CUDA();
  // Kiln's own kernel, called directly (fp8_gemm uses it only where cuBLASLt cannot run), on
  // partial tiles and a partial last K chunk: M = 136, N = 144, K = 336.
  const std::int64_t M = 136, N = 144, K = 336;
  const Tensor xa = blocky(M, K, 91), xb = blocky(N, K, 92);
  const Tensor bias = spread_values(1, N, 93, -2, 2).reshape({N}).to(DType::BF16);
  const ScalingLayout blocks[] = {ScalingLayout::Block1x128, ScalingLayout::Block128x128};
  for (auto la : blocks)
    for (auto lb : blocks)
      for (DType out : {DType::BF16, DType::F32})
        for (bool with_bias : {false, true}) {
          const Fp8Tensor a = ops::fp8_quantize(xa, DType::F8E4M3, la), b = ops::fp8_quantize(xb, DType::F8E5M2, lb);
          const Fp8Tensor ga = to_gpu(a), gb = to_gpu(b);
          ops::Fp8GemmArgs args;
          args.a = &ga;
          args.b = &gb;
          args.out = Tensor::empty({M, N}, out, gpu());
          if (with_bias) {
            args.bias = bias.to(gpu());
            args.epilogue = Fp8Epilogue::Bias;
          }
          ops::cuda::fp8_block_gemm_kiln(args);
          expect_gemm_close(args.out,
                            gemm_ref(exact(a), exact(b), M, N, K,
                                     with_bias ? bias.to_vector<double>() : std::vector<double>{}, false),
                            1e-5,
                            std::string(scaling_layout_name(la)) + " x " + std::string(scaling_layout_name(lb)) +
                                " -> " + std::string(dtype_name(out)) + (with_bias ? " + bias" : ""));
        }
}
#endif

#if KILN_WITH_CUDA  // CudaGraph exists only in CUDA builds
TEST(CudaFp8, GemmIsCapturableInACudaGraph) {
  KILN_REQUIRE_CUDA();
  // No host reads: the cast (current scaling) and the GEMM replay from a graph with new inputs.
  const std::int64_t M = 64, N = 64, K = 128;
  Tensor x = spread_values(M, K, 81, -2, 2).to(gpu());
  Tensor w = spread_values(N, K, 82, -2, 2).to(gpu());
  Fp8Tensor qx = ops::fp8_empty(M, K, DType::F8E4M3, ScalingLayout::PerTensor, gpu());
  Fp8Tensor qw = ops::fp8_quantize(w, DType::F8E4M3, ScalingLayout::PerTensor);
  Tensor y = Tensor::empty({M, N}, DType::F32, gpu());
  Fp8CastOptions o;
  o.current_scaling = true;
  Fp8GemmOptions go;
  go.out_dtype = DType::F32;
  auto step = [&] {
    ops::fp8_quantize_into(x, qx, o);
    ops::fp8_gemm_into(qx, qw, y, go);
  };
  step();  // warm-up: plans and workspace exist before capture
  CudaGraph graph;
  graph.capture_begin(gpu());
  step();
  graph.capture_end();
  ops::copy_into(x, spread_values(M, K, 83, -1, 5).to(gpu()));  // new input, a 16x larger range
  graph.replay();
  synchronize(gpu());
  const Tensor got = y.to(Device::cpu());
  const Fp8Tensor replayed{qx.data.clone(), qx.scale.clone(), qx.scale_inv.clone(), qx.amax.clone(), qx.layout};
  step();  // eager on the same input
  EXPECT_EQ(bytes(got), bytes(y));
  expect_same_fp8(replayed, qx, "cast replayed from the graph");
}

#endif  // KILN_WITH_CUDA

}  // namespace fp8_test
}  // namespace kiln
