// CPU FP8 kernels: the reference every other backend is compared with. Casts emulate the
// hardware's conversion bit for bit (Float8::from_float: round to nearest even, saturating) and
// compute scales with the same single-precision steps as the CUDA kernels (fp8_scaling.h). The
// GEMM dequantises both operands exactly into float64 (an fp8 value times an f32 scale fits in a
// double), multiplies in float64 and applies the epilogue there; only the final store rounds.
#include <cmath>
#include <vector>

#include "kiln/ops/cpu/parallel.h"
#include "kiln/ops/fp8_kernels.h"
#include "kiln/ops/fp8_scaling.h"

namespace kiln::ops {

namespace cpu {
namespace {

// Every block of the layout as [r0, r1) x [c0, c1) (per tensor: the whole matrix).
struct BlockGrid {
  std::int64_t bh, bw, nbr, nbc;
  BlockGrid(ScalingLayout l, std::int64_t rows, std::int64_t cols) {
    bh = l == ScalingLayout::Block128x128 ? kFp8BlockSize : (l == ScalingLayout::Block1x128 ? 1 : rows);
    bw = l == ScalingLayout::PerTensor ? cols : kFp8BlockSize;
    bh = std::max<std::int64_t>(bh, 1);
    bw = std::max<std::int64_t>(bw, 1);
    nbr = (rows + bh - 1) / bh;
    nbc = (cols + bw - 1) / bw;
  }
};

template <class T, class F8>
void quantize_typed(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o) {
  const std::int64_t R = x.shape()[0], C = x.shape()[1], sr = x.strides()[0], sc = x.strides()[1];
  const T* xp = static_cast<const T*>(x.data_ptr());
  auto* q = static_cast<std::uint8_t*>(dst.data.data_ptr());
  auto* scale = static_cast<float*>(dst.scale.data_ptr());
  auto* scale_inv = static_cast<float*>(dst.scale_inv.data_ptr());
  auto* amax_out = static_cast<float*>(dst.amax.data_ptr());
  const float max_fp8 = F8::max_finite();
  const BlockGrid g(dst.layout, R, C);
  const bool per_tensor = dst.layout == ScalingLayout::PerTensor;

  auto block_amax = [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1) {
    float m = 0.0f;
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c) m = std::fmax(m, fp8::abs_value(static_cast<float>(xp[r * sr + c * sc])));
    return m;
  };
  auto cast_block = [&](std::int64_t r0, std::int64_t r1, std::int64_t c0, std::int64_t c1, float s) {
    for (std::int64_t r = r0; r < r1; ++r)
      for (std::int64_t c = c0; c < c1; ++c)
        q[r * C + c] = F8::from_float(fp8::mul_rn(static_cast<float>(xp[r * sr + c * sc]), s));
  };

  if (per_tensor) {
    // Row-parallel amax, then one scale, then a row-parallel cast.
    std::vector<float> row_amax(static_cast<std::size_t>(R), 0.0f);
    parallel_for(R, 64, [&](std::int64_t b, std::int64_t e) {
      for (std::int64_t r = b; r < e; ++r) row_amax[static_cast<std::size_t>(r)] = block_amax(r, r + 1, 0, C);
    });
    float amax = 0.0f;
    for (float m : row_amax) amax = std::fmax(amax, m);
    const float s =
        o.current_scaling ? fp8::scale_from_amax(amax, max_fp8, o.power_of_two_scales, o.amax_epsilon) : scale[0];
    parallel_for(R, 64, [&](std::int64_t b, std::int64_t e) { cast_block(b, e, 0, C, s); });
    scale[0] = s;
    scale_inv[0] = fp8::reciprocal(s);
    amax_out[0] = amax;
    return;
  }
  parallel_for(g.nbr * g.nbc, 4, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t blk = b; blk < e; ++blk) {
      const std::int64_t r0 = (blk / g.nbc) * g.bh, c0 = (blk % g.nbc) * g.bw;
      const std::int64_t r1 = std::min(R, r0 + g.bh), c1 = std::min(C, c0 + g.bw);
      const float amax = block_amax(r0, r1, c0, c1);
      const float s = fp8::scale_from_amax(amax, max_fp8, o.power_of_two_scales, o.amax_epsilon);
      const std::int64_t i = fp8_scale_index(dst.layout, R, C, r0, c0);
      scale[i] = s;
      scale_inv[i] = fp8::reciprocal(s);
      amax_out[i] = amax;
      cast_block(r0, r1, c0, c1, s);
    }
  });
}

template <class T>
void quantize_from(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o) {
  if (dst.dtype() == DType::F8E4M3)
    quantize_typed<T, Float8E4M3>(x, dst, o);
  else
    quantize_typed<T, Float8E5M2>(x, dst, o);
}

void quantize(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& o) {
  switch (x.dtype()) {
    case DType::F32: return quantize_from<float>(x, dst, o);
    case DType::BF16: return quantize_from<BFloat16>(x, dst, o);
    case DType::F16: return quantize_from<Half>(x, dst, o);
    default: KILN_FAIL("fp8_quantize: dtype {} is not supported on the CPU", dtype_name(x.dtype()));
  }
}

float decode(DType t, std::uint8_t bits) {
  return t == DType::F8E4M3 ? Float8E4M3::to_float(bits) : Float8E5M2::to_float(bits);
}

template <class T>
void dequantize_typed(const Fp8Tensor& q, const Tensor& out) {
  const std::int64_t R = q.rows(), C = q.cols();
  const auto* d = static_cast<const std::uint8_t*>(q.data.data_ptr());
  const auto* si = static_cast<const float*>(q.scale_inv.data_ptr());
  T* o = static_cast<T*>(out.data_ptr());
  const DType t = q.dtype();
  parallel_for(R, 64, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t r = b; r < e; ++r)
      for (std::int64_t c = 0; c < C; ++c) {
        const float v = fp8::mul_rn(decode(t, d[r * C + c]), si[fp8_scale_index(q.layout, R, C, r, c)]);
        o[r * C + c] = static_cast<T>(v);
      }
  });
}

void dequantize(const Fp8Tensor& q, const Tensor& out) {
  switch (out.dtype()) {
    case DType::F64: return dequantize_typed<double>(q, out);
    case DType::F32: return dequantize_typed<float>(q, out);
    case DType::BF16: return dequantize_typed<BFloat16>(q, out);
    case DType::F16: return dequantize_typed<Half>(q, out);
    default: KILN_FAIL("fp8_dequantize: dtype {} is not supported", dtype_name(out.dtype()));
  }
}

// Exact float64 values of an operand: fp8 value times its block's (or the tensor's) scale_inv.
std::vector<double> exact_values(const Fp8Tensor& t) {
  const std::int64_t R = t.rows(), C = t.cols();
  const auto* d = static_cast<const std::uint8_t*>(t.data.data_ptr());
  const auto* si = static_cast<const float*>(t.scale_inv.data_ptr());
  std::vector<double> v(static_cast<std::size_t>(R * C));
  for (std::int64_t r = 0; r < R; ++r)
    for (std::int64_t c = 0; c < C; ++c)
      v[static_cast<std::size_t>(r * C + c)] = static_cast<double>(decode(t.dtype(), d[r * C + c])) *
                                               static_cast<double>(si[fp8_scale_index(t.layout, R, C, r, c)]);
  return v;
}

// cuBLASLt's GELU epilogue is the tanh approximation.
double gelu_tanh(double x) {
  const double k = 0.7978845608028654;  // sqrt(2 / pi)
  return 0.5 * x * (1.0 + std::tanh(k * (x + 0.044715 * x * x * x)));
}

void fp8_gemm(const Fp8GemmArgs& g) {
  const std::int64_t M = g.a->rows(), K = g.a->cols(), N = g.b->rows();
  const std::vector<double> av = exact_values(*g.a), bv = exact_values(*g.b);
  std::vector<double> res(static_cast<std::size_t>(M * N));
  const auto* bias = g.bias.defined() ? static_cast<const BFloat16*>(g.bias.data_ptr()) : nullptr;
  const bool gelu = g.epilogue == Fp8Epilogue::Gelu || g.epilogue == Fp8Epilogue::GeluBias;
  parallel_for(M, 8, [&](std::int64_t b, std::int64_t e) {
    for (std::int64_t m = b; m < e; ++m)
      for (std::int64_t n = 0; n < N; ++n) {
        double s = 0.0;
        const double* ar = av.data() + m * K;
        const double* br = bv.data() + n * K;
        for (std::int64_t k = 0; k < K; ++k) s += ar[k] * br[k];
        if (bias) s += static_cast<double>(static_cast<float>(bias[n]));
        if (gelu) s = gelu_tanh(s);
        res[static_cast<std::size_t>(m * N + n)] = s;
      }
  });
  if (g.fp8_out) {
    const Fp8Tensor& o = *g.fp8_out;
    auto* q = static_cast<std::uint8_t*>(o.data.data_ptr());
    const float s = static_cast<const float*>(o.scale.data_ptr())[0];
    float amax = 0.0f;
    for (std::size_t i = 0; i < res.size(); ++i) {
      const float v = static_cast<float>(res[i]);
      amax = std::fmax(amax, std::fabs(v));
      q[i] = o.dtype() == DType::F8E4M3 ? Float8E4M3::from_float(fp8::mul_rn(v, s))
                                        : Float8E5M2::from_float(fp8::mul_rn(v, s));
    }
    static_cast<float*>(o.amax.data_ptr())[0] = amax;
    static_cast<float*>(o.scale_inv.data_ptr())[0] = fp8::reciprocal(s);
    return;
  }
  if (g.out.dtype() == DType::F32) {
    auto* o = static_cast<float*>(g.out.data_ptr());
    if (g.accumulate) {
      for (std::size_t i = 0; i < res.size(); ++i) o[i] = static_cast<float>(res[i] + static_cast<double>(o[i]));
      return;
    }
    for (std::size_t i = 0; i < res.size(); ++i) o[i] = static_cast<float>(res[i]);
  } else {
    auto* o = static_cast<BFloat16*>(g.out.data_ptr());
    for (std::size_t i = 0; i < res.size(); ++i) o[i] = BFloat16(static_cast<float>(res[i]));
  }
}

void delayed_scaling_update(const Tensor& history, const Tensor& scale, const Tensor& scale_inv, bool most_recent,
                            float scaled_max) {
  fp8::delayed_scaling_step(static_cast<float*>(history.data_ptr()), history.numel(),
                            static_cast<float*>(scale.data_ptr()), static_cast<float*>(scale_inv.data_ptr()),
                            most_recent, scaled_max);
}

// The reference of the batched update: the single updates in order (each entry's own state).
void delayed_scaling_update_many(const std::vector<Fp8DelayedScalingRef>& states, bool most_recent) {
  for (const Fp8DelayedScalingRef& s : states)
    delayed_scaling_update(s.amax_history, s.scale, s.scale_inv, most_recent, s.scaled_max);
}

// The pieces of a shard (fp8.h's Fp8MatrixPiece): element i of x is element begin + i of the matrix.
template <class F>
void for_piece_elements(const Tensor& x, const Fp8MatrixPiece& p, F&& f) {
  const bool per_tensor = p.layout == ScalingLayout::PerTensor, square = p.layout == ScalingLayout::Block128x128;
  auto run = [&]<class T>() {
    const T* xp = static_cast<const T*>(x.data_ptr());
    for (std::int64_t i = 0; i < x.numel(); ++i) {
      const std::int64_t e = p.begin + i, r = e / p.cols, c = e % p.cols;
      f(i, static_cast<float>(xp[i]), fp8::scale_entry(per_tensor, square, p.rows, p.cols, r, c));
    }
  };
  switch (x.dtype()) {
    case DType::F32: return run.template operator()<float>();
    case DType::BF16: return run.template operator()<BFloat16>();
    case DType::F16: return run.template operator()<Half>();
    default: KILN_FAIL("fp8 piece ops: dtype {} is not supported on the CPU", dtype_name(x.dtype()));
  }
}

void piece_amax(const Tensor& x, const Fp8MatrixPiece& p, const Tensor& amax) {
  auto* a = static_cast<float*>(amax.data_ptr());
  for_piece_elements(x, p, [&](std::int64_t, float v, std::int64_t k) { a[k] = std::fmax(a[k], fp8::abs_value(v)); });
}

template <class F8>
void piece_quantize_typed(const Tensor& x, const Fp8MatrixPiece& p, const Tensor& scale, const Tensor& dst) {
  const auto* s = static_cast<const float*>(scale.data_ptr());
  auto* q = static_cast<std::uint8_t*>(dst.data_ptr());
  for_piece_elements(x, p,
                     [&](std::int64_t i, float v, std::int64_t k) { q[i] = F8::from_float(fp8::mul_rn(v, s[k])); });
}

void piece_quantize(const Tensor& x, const Fp8MatrixPiece& p, const Tensor& scale, const Tensor& dst) {
  if (dst.dtype() == DType::F8E4M3)
    piece_quantize_typed<Float8E4M3>(x, p, scale, dst);
  else
    piece_quantize_typed<Float8E5M2>(x, p, scale, dst);
}

}  // namespace
}  // namespace cpu

void register_cpu_fp8_kernels(KernelRegistry& r, const Fp8Ops& ops) {
  const DeviceKind d = DeviceKind::CPU;
  r.add(ops.quantize, d, cpu::quantize);
  r.add(ops.dequantize, d, cpu::dequantize);
  r.add(ops.gemm, d, cpu::fp8_gemm);
  r.add(ops.delayed_scaling_update, d, cpu::delayed_scaling_update);
  r.add(ops.delayed_scaling_update_many, d, cpu::delayed_scaling_update_many);
  r.add(ops.piece_amax, d, cpu::piece_amax);
  r.add(ops.piece_quantize, d, cpu::piece_quantize);
}

}  // namespace kiln::ops
