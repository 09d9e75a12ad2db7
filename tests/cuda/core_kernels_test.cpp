// CUDA vs CPU: copy, fill, arange, random, elementwise, reductions, GEMM.
#include <array>
#include <cstdlib>

#include "test_util.h"

namespace kiln::cudatest {
namespace core_kernels_test {

using ops::BinaryOp;
using ops::ReduceOp;
using ops::UnaryOp;

constexpr std::array<DType, 4> kFloat = {DType::F32, DType::F64, DType::BF16, DType::F16};

TEST(CudaCopy, ConvertsBetweenDtypesContiguousAndStrided) {
  KILN_REQUIRE_CUDA();
  const std::array<DType, 9> types = {DType::F64, DType::F32, DType::BF16, DType::F16, DType::F8E4M3,
                                      DType::I64, DType::I32, DType::U8,   DType::Bool};
  // Non-negative values below 100: every conversion (including to u8) is defined.
  Tensor base = Tensor::rand({33, 47}, 1, DType::F64);
  cpu_kernel(ops::op::binary_scalar)(BinaryOp::Mul, base, 100.0, base);
  for (DType from : types) {
    Tensor src = ops::to(base, Device::cpu(), from);
    for (DType to : types) {
      for (bool strided : {false, true}) {
        Tensor s_cpu = strided ? src.t() : src;
        Tensor s_gpu = strided ? on(src, gpu()).t() : on(src, gpu());
        Tensor want = poisoned(s_cpu.shape(), to, Device::cpu());
        Tensor got = poisoned(s_cpu.shape(), to, gpu());
        cpu_kernel(ops::op::copy)(s_cpu, want);
        cuda_kernel(ops::op::copy)(s_gpu, got);
        expect_close(got, want, 0, 0, "copy " + name(from) + " -> " + name(to) + (strided ? " strided" : ""));
      }
    }
  }
}

// Same-dtype transposes through the tiled kernel: every element size, sizes off the 32-element tile,
// a batch, a source narrowed out of a wider matrix (leading dimension above the rows), an FP8 tensor
// as the FP8 linear transposes its producer-made cast. Raw bits, so equal to the CPU's exactly.
TEST(CudaCopy, TiledTransposesEqualTheCpu) {
  KILN_REQUIRE_CUDA();
  // The tiled kernel is opt-in until it has run on a GPU: switched on here, restored after.
  struct TiledTranspose {
    TiledTranspose() { setenv("KILN_CUDA_TILED_TRANSPOSE", "1", 1); }
    ~TiledTranspose() { unsetenv("KILN_CUDA_TILED_TRANSPOSE"); }
  } tiled;
  Tensor base = Tensor::rand({3, 129, 70}, 5, DType::F64);
  cpu_kernel(ops::op::binary_scalar)(BinaryOp::Mul, base, 100.0, base);
  for (DType t : {DType::F64, DType::F32, DType::BF16, DType::U8, DType::F8E4M3, DType::I64}) {
    const Tensor x = ops::to(base, Device::cpu(), t), xg = on(x, gpu());
    auto check = [&](const Tensor& s_cpu, const Tensor& s_gpu, const std::string& what) {
      Tensor want = poisoned(s_cpu.shape(), t, Device::cpu());
      Tensor got = poisoned(s_cpu.shape(), t, gpu());
      cpu_kernel(ops::op::copy)(s_cpu, want);
      cuda_kernel(ops::op::copy)(s_gpu, got);
      expect_close(got, want, 0, 0, "transpose " + name(t) + " " + what);
    };
    check(x.transpose(1, 2), xg.transpose(1, 2), "batched [3, 70, 129]");
    check(x.select(0, 1).t(), xg.select(0, 1).t(), "2-D [70, 129]");
    check(x.select(0, 2).narrow(1, 3, 40).t(), xg.select(0, 2).narrow(1, 3, 40).t(), "narrowed [40, 129]");
    check(x.narrow(0, 0, 2).narrow(2, 5, 33).transpose(1, 2), xg.narrow(0, 0, 2).narrow(2, 5, 33).transpose(1, 2),
          "batched narrowed [2, 33, 129]");
    check(x.select(0, 0).narrow(0, 0, 1).t(), xg.select(0, 0).narrow(0, 0, 1).t(), "one column [70, 1]");
  }
}

TEST(CudaCopy, LargeVectorisedConversionsAndStridedDestination) {
  KILN_REQUIRE_CUDA();
  Tensor x = randn({1 << 20}, 2, DType::F32);
  for (DType to : {DType::BF16, DType::F16}) {
    Tensor want = poisoned(x.shape(), to, Device::cpu()), got = poisoned(x.shape(), to, gpu());
    cpu_kernel(ops::op::copy)(x, want);
    cuda_kernel(ops::op::copy)(on(x, gpu()), got);
    expect_close(got, want, 0, 0, "f32 -> " + name(to));
    Tensor back_w = poisoned(x.shape(), DType::F32, Device::cpu()), back_g = poisoned(x.shape(), DType::F32, gpu());
    cpu_kernel(ops::op::copy)(want, back_w);
    cuda_kernel(ops::op::copy)(got, back_g);
    expect_close(back_g, back_w, 0, 0, name(to) + " -> f32");
  }
  // Offset (unaligned) views and a strided destination.
  Tensor y = randn({1001, 13}, 3, DType::F32);
  Tensor ys = y.slice(0, 1, 1001);
  Tensor want = poisoned({13, 1000}, DType::BF16, Device::cpu()), got = poisoned({13, 1000}, DType::BF16, gpu());
  cpu_kernel(ops::op::copy)(ys, want.t());
  cuda_kernel(ops::op::copy)(on(y, gpu()).slice(0, 1, 1001), got.t());
  expect_close(got, want, 0, 0, "offset view into transposed bf16");
}

TEST(CudaFill, StridedAndAllDtypes) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32, DType::U8, DType::Bool}) {
    Tensor want = Tensor::zeros({9, 10}, t), got = Tensor::zeros({9, 10}, t, gpu());
    cpu_kernel(ops::op::fill)(want.slice(1, 2, 9, 3), 3.75);
    cuda_kernel(ops::op::fill)(got.slice(1, 2, 9, 3), 3.75);
    cpu_kernel(ops::op::fill)(want.slice(0, 7, 9), -1.5);
    cuda_kernel(ops::op::fill)(got.slice(0, 7, 9), -1.5);
    expect_close(got, want, 0, 0, "fill " + name(t));
  }
}

TEST(CudaArange, MatchesCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64, DType::I32}) {
    Tensor want = poisoned({1000}, t, Device::cpu()), got = poisoned({1000}, t, gpu());
    cpu_kernel(ops::op::arange)(want, -3.5, 0.25);
    cuda_kernel(ops::op::arange)(got, -3.5, 0.25);
    expect_close(got, want, 0, 0, "arange " + name(t));
  }
}

TEST(CudaRandom, BitIdenticalToCpu) {
  KILN_REQUIRE_CUDA();
  for (DType t : kFloat) {
    for (auto kind : {ops::RandomKind::Uniform, ops::RandomKind::Normal, ops::RandomKind::Bernoulli}) {
      const double a = kind == ops::RandomKind::Bernoulli ? 0.3 : -0.5, b = 2.0;
      Tensor want = poisoned({100003}, t, Device::cpu()), got = poisoned({100003}, t, gpu());
      cpu_kernel(ops::op::random)(want, kind, 1234, 77, a, b);
      cuda_kernel(ops::op::random)(got, kind, 1234, 77, a, b);
      expect_close(got, want, 0, 0, "random " + name(t) + " kind " + std::to_string(static_cast<int>(kind)));
    }
  }
}

// ---- elementwise --------------------------------------------------------------------------------

bool positive_domain(UnaryOp op) {
  return op == UnaryOp::Log || op == UnaryOp::Sqrt || op == UnaryOp::Rsqrt || op == UnaryOp::PowScalar ||
         op == UnaryOp::Reciprocal;
}

TEST(CudaElementwise, UnaryAllOpsAndDtypes) {
  KILN_REQUIRE_CUDA();
  for (int o = 0; o <= static_cast<int>(UnaryOp::LeakyRelu); ++o) {
    auto op = static_cast<UnaryOp>(o);
    for (DType t : kFloat) {
      for (bool strided : {false, true}) {
        Tensor x = positive_domain(op) ? randn({67, 129}, 10 + o, t, 0.3, 2.0) : randn({67, 129}, 10 + o, t);
        Tensor xc = strided ? x.t() : x, xg = strided ? on(x, gpu()).t() : on(x, gpu());
        Tensor want = poisoned(xc.shape(), t, Device::cpu()), got = poisoned(xc.shape(), t, gpu());
        cpu_kernel(ops::op::unary)(op, xc, want, 1.7);
        cuda_kernel(ops::op::unary)(op, xg, got, 1.7);
        expect_close(got, want, "unary " + std::to_string(o) + " " + name(t), 4.0);
      }
    }
  }
}

TEST(CudaElementwise, UnaryIntegers) {
  KILN_REQUIRE_CUDA();
  Tensor x = rand_int({1000}, 5, -50, 50);
  for (UnaryOp op : {UnaryOp::Neg, UnaryOp::Abs, UnaryOp::Square, UnaryOp::Relu}) {
    Tensor want = poisoned(x.shape(), DType::I64, Device::cpu()), got = poisoned(x.shape(), DType::I64, gpu());
    cpu_kernel(ops::op::unary)(op, x, want, 0);
    cuda_kernel(ops::op::unary)(op, on(x, gpu()), got, 0);
    expect_close(got, want, 0, 0, "unary int64");
  }
}

TEST(CudaElementwise, UnaryBackwardAllOps) {
  KILN_REQUIRE_CUDA();
  for (int o = 0; o <= static_cast<int>(UnaryOp::LeakyRelu); ++o) {
    auto op = static_cast<UnaryOp>(o);
    for (DType t : kFloat) {
      Tensor x = positive_domain(op) ? randn({1031}, 20 + o, t, 0.3, 2.0) : randn({1031}, 20 + o, t);
      Tensor y = poisoned(x.shape(), t, Device::cpu());
      cpu_kernel(ops::op::unary)(op, x, y, 1.7);
      Tensor go = randn({1031}, 40 + o, t);
      Tensor want = poisoned(x.shape(), t, Device::cpu()), got = poisoned(x.shape(), t, gpu());
      cpu_kernel(ops::op::unary_backward)(op, go, x, y, want, 1.7);
      cuda_kernel(ops::op::unary_backward)(op, on(go, gpu()), on(x, gpu()), on(y, gpu()), got, 1.7);
      expect_close(got, want, "unary_backward " + std::to_string(o) + " " + name(t), 4.0);
    }
  }
}

TEST(CudaElementwise, BinaryBroadcastAllOps) {
  KILN_REQUIRE_CUDA();
  const Shape shape{5, 33, 65};
  for (int o = 0; o <= static_cast<int>(BinaryOp::Ge); ++o) {
    auto op = static_cast<BinaryOp>(o);
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::F16, DType::I64, DType::I32}) {
      const bool ints = !is_floating(t);
      Tensor a = ints ? ops::to(rand_int({5, 33, 65}, 1, -9, 9), Device::cpu(), t)
                      : randn({5, 33, 65}, 30 + o, t, 1.0, op == BinaryOp::Pow ? 2.0 : 0.0);
      Tensor b = ints ? ops::to(rand_int({33, 1}, 2, 1, 5), Device::cpu(), t) : randn({33, 1}, 50 + o, t, 0.5, 1.5);
      if (op == BinaryOp::Pow && ints) continue;
      const DType out_t = o >= static_cast<int>(BinaryOp::Eq) ? DType::Bool : t;
      for (int layout = 0; layout < 3; ++layout) {
        Tensor ac = a, ag = on(a, gpu());
        if (layout == 1) {  // contiguous same shape (vector path)
          b = ints ? ops::to(rand_int(shape, 3, 1, 5), Device::cpu(), t) : randn(shape, 60 + o, t, 0.5, 1.5);
        }
        if (layout == 2) {  // transposed operand
          ac = ops::contiguous(a.transpose(1, 2)).transpose(1, 2);
          ag = on(ac, gpu());
        }
        Tensor bc = ops::broadcast_to(b, shape, "test"), bg = ops::broadcast_to(on(b, gpu()), shape, "test");
        Tensor want = poisoned(shape, out_t, Device::cpu()), got = poisoned(shape, out_t, gpu());
        cpu_kernel(ops::op::binary)(op, ac, bc, want);
        cuda_kernel(ops::op::binary)(op, ag, bg, got);
        expect_close(got, want, "binary " + std::to_string(o) + " " + name(t) + " layout " + std::to_string(layout),
                     4.0);
      }
    }
  }
}

TEST(CudaElementwise, BinaryScalarWhereClamp) {
  KILN_REQUIRE_CUDA();
  for (DType t : kFloat) {
    Tensor a = randn({257, 31}, 7, t);
    for (int o = 0; o <= static_cast<int>(BinaryOp::Ge); ++o) {
      auto op = static_cast<BinaryOp>(o);
      Tensor src = op == BinaryOp::Pow ? randn({257, 31}, 8, t, 0.2, 2.0) : a;
      const DType out_t = o >= static_cast<int>(BinaryOp::Eq) ? DType::Bool : t;
      Tensor want = poisoned(a.shape(), out_t, Device::cpu()), got = poisoned(a.shape(), out_t, gpu());
      cpu_kernel(ops::op::binary_scalar)(op, src.t(), 0.75, want.t());
      cuda_kernel(ops::op::binary_scalar)(op, on(src, gpu()).t(), 0.75, got.t());
      expect_close(got, want, "binary_scalar " + std::to_string(o) + " " + name(t), 4.0);
    }
    Tensor want = poisoned(a.shape(), t, Device::cpu()), got = poisoned(a.shape(), t, gpu());
    cpu_kernel(ops::op::clamp)(a, -0.5, 0.7, want);
    cuda_kernel(ops::op::clamp)(on(a, gpu()), -0.5, 0.7, got);
    expect_close(got, want, 0, 0, "clamp " + name(t));

    Tensor cond = poisoned({257, 1}, DType::Bool, Device::cpu());
    cpu_kernel(ops::op::binary_scalar)(BinaryOp::Gt, randn({257, 1}, 9, DType::F32), 0.0, cond);
    Tensor b = randn({31}, 11, t);
    Shape shape{257, 31};
    Tensor wc = poisoned(shape, t, Device::cpu()), wg = poisoned(shape, t, gpu());
    cpu_kernel(ops::op::where)(ops::broadcast_to(cond, shape, "t"), a, ops::broadcast_to(b, shape, "t"), wc);
    cuda_kernel(ops::op::where)(ops::broadcast_to(on(cond, gpu()), shape, "t"), on(a, gpu()),
                                ops::broadcast_to(on(b, gpu()), shape, "t"), wg);
    expect_close(wg, wc, 0, 0, "where " + name(t));
  }
}

// ---- reductions ---------------------------------------------------------------------------------

struct ReduceCase {
  Shape shape;
  std::vector<int> dims;
  bool transpose;  // reduce a transposed (strided) view
};

std::vector<ReduceCase> reduce_cases() {
  return {{{7, 33, 129}, {2}, false},    {{7, 33, 129}, {1}, false},       {{7, 33, 129}, {0}, false},
          {{7, 33, 129}, {0, 2}, false}, {{7, 33, 129}, {0, 1, 2}, false}, {{7, 33, 129}, {1}, true},
          {{7, 33, 129}, {2}, true},     {{3, 5000}, {1}, false},          {{5000, 3}, {0}, false},
          {{1 << 21}, {0}, false},       {{64, 2, 300}, {0, 2}, false},    {{4, 1, 3}, {1}, false}};
}

Tensor view_for(const Tensor& x, bool transpose) { return transpose ? x.transpose(1, 2) : x; }

Shape keep_shape(const Shape& s, const std::vector<int>& dims) {
  Shape out = s;
  for (int d : dims) out[d] = 1;
  return out;
}

TEST(CudaReduce, AllOpsLayoutsAndDtypes) {
  KILN_REQUIRE_CUDA();
  for (const auto& c : reduce_cases()) {
    for (DType t : {DType::F32, DType::F64, DType::BF16, DType::I64}) {
      Tensor x =
          is_floating(t) ? randn(c.shape, 70, t, 1.0, 0.1) : ops::to(rand_int(c.shape, 71, -5, 6), Device::cpu(), t);
      Tensor xc = view_for(x, c.transpose), xg = view_for(on(x, gpu()), c.transpose);
      Shape out_shape = keep_shape(xc.shape(), c.dims);
      for (int o = 0; o <= static_cast<int>(ReduceOp::Prod); ++o) {
        auto op = static_cast<ReduceOp>(o);
        if (op == ReduceOp::Prod && (numel_of(c.shape) > 100000 || !is_floating(t))) continue;  // overflow is UB
        Tensor src_c = xc, src_g = xg;
        if (op == ReduceOp::Prod && is_floating(t)) {  // keep products finite
          src_c = randn(xc.shape(), 72, t, 0.05, 1.0);
          src_g = on(src_c, gpu());
        }
        Tensor want = poisoned(out_shape, t, Device::cpu()), got = poisoned(out_shape, t, gpu());
        cpu_kernel(ops::op::reduce)(op, src_c, c.dims, want);
        cuda_kernel(ops::op::reduce)(op, src_g, c.dims, got);
        double scale = t == DType::F32 ? 20.0 : (t == DType::BF16 ? 2.0 : 4.0);  // f64: 4e-9, which f32 fails
        std::string what = "reduce " + std::to_string(o) + " " + name(t) + " " + shape_str(c.shape) + " dims[0] " +
                           std::to_string(c.dims[0]) + (c.transpose ? " T" : "");
        if (is_floating(t))
          expect_close(got, want, what, scale);
        else
          expect_close(got, want, 0, 0, what);
      }
    }
  }
}

TEST(CudaReduce, VarianceAndArgReduce) {
  KILN_REQUIRE_CUDA();
  for (const auto& c : reduce_cases()) {
    for (DType t : {DType::F32, DType::F64, DType::BF16}) {
      Tensor x = randn(c.shape, 80, t, 2.0, 3.0);
      Tensor xc = view_for(x, c.transpose), xg = view_for(on(x, gpu()), c.transpose);
      Shape out_shape = keep_shape(xc.shape(), c.dims);
      for (int corr : {0, 1}) {
        Tensor want = poisoned(out_shape, t, Device::cpu()), got = poisoned(out_shape, t, gpu());
        cpu_kernel(ops::op::variance)(xc, c.dims, corr, want);
        cuda_kernel(ops::op::variance)(xg, c.dims, corr, got);
        expect_close(got, want, "var " + name(t) + " " + shape_str(c.shape), 50.0);
      }
      if (c.dims.size() == 1) {
        for (bool is_max : {true, false}) {
          Tensor want = poisoned(out_shape, DType::I64, Device::cpu()), got = poisoned(out_shape, DType::I64, gpu());
          cpu_kernel(ops::op::arg_reduce)(is_max, xc, c.dims[0], want);
          cuda_kernel(ops::op::arg_reduce)(is_max, xg, c.dims[0], got);
          // bf16 has ties: compare the selected values instead of positions there.
          if (t != DType::BF16) expect_close(got, want, 0, 0, "argmax " + name(t) + " " + shape_str(c.shape));
        }
      }
    }
  }
}

// ---- GEMM ---------------------------------------------------------------------------------------

TEST(CudaGemm, AllDtypesTransposesBatches) {
  KILN_REQUIRE_CUDA();
  const std::int64_t batch = 3, m = 37, n = 53, k = 29;
  for (DType t : kFloat) {
    for (int tr = 0; tr < 4; ++tr) {
      const bool ta = tr & 1, tb = tr & 2;
      Tensor a = ta ? randn({batch, k, m}, 90, t) : randn({batch, m, k}, 90, t);
      Tensor b = tb ? randn({batch, n, k}, 91, t) : randn({batch, k, n}, 91, t);
      Tensor c0 = randn({batch, m, n}, 92, t);
      Tensor want = ops::contiguous(c0.clone()), got = on(c0, gpu());
      cpu_kernel(ops::op::gemm)(a, b, want, ta, tb, 0.5, 0.25);
      cuda_kernel(ops::op::gemm)(on(a, gpu()), on(b, gpu()), got, ta, tb, 0.5, 0.25);
      // bf16/f16 inputs: both accumulate in f32; outputs round once.
      expect_close(got, want, "gemm " + name(t) + " ta " + std::to_string(ta) + " tb " + std::to_string(tb),
                   t == DType::F32 ? 10.0 : 2.0);
    }
  }
}

TEST(CudaGemm, LargeSquareF32AndBf16) {
  KILN_REQUIRE_CUDA();
  for (DType t : {DType::F32, DType::BF16}) {
    Tensor a = randn({1, 512, 384}, 93, t), b = randn({1, 384, 640}, 94, t);
    Tensor want = poisoned({1, 512, 640}, t, Device::cpu()), got = poisoned({1, 512, 640}, t, gpu());
    cpu_kernel(ops::op::gemm)(a, b, want, false, false, 1.0, 0.0);
    cuda_kernel(ops::op::gemm)(on(a, gpu()), on(b, gpu()), got, false, false, 1.0, 0.0);
    expect_close(got, want, "gemm 512x640x384 " + name(t), t == DType::F32 ? 20.0 : 2.0);
  }
}

}  // namespace core_kernels_test
}  // namespace kiln::cudatest
