// The FP8 ops: argument checks (once, for every backend), output allocation, the transposes the
// native GEMM form needs, and the lookup of the FP8 family's kernels in the kernel registry.
#include "kiln/ops/fp8.h"

#include <cmath>

#include "kiln/ops/copy.h"
#include "kiln/ops/fp8_kernels.h"

namespace kiln::ops {

namespace {

// The kernel of an optional FP8 op on `device`, or null where the backend has none.
template <class Sig>
typename KernelOp<Sig>::Fn optional_kernel(KernelOp<Sig> op, Device device) {
  const Kernel* k = kernel_registry().find_kernel(op.id, device.kind);
  return k ? reinterpret_cast<typename KernelOp<Sig>::Fn>(k->fn) : nullptr;
}

bool is_high_precision(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F16; }

void check_cast_input(const char* call, const Tensor& x, const Fp8Tensor& dst, const char* dst_name) {
  KILN_CHECK(x.defined(), "{}: x is missing", call);
  KILN_CHECK(is_high_precision(x.dtype()), "{}: x has dtype {}, expected float32, bfloat16 or float16", call,
             dtype_name(x.dtype()));
  KILN_CHECK(x.dim() == 2, "{}: x must be 2-D (got shape {}); flatten leading dimensions first", call,
             shape_str(x.shape()));
  dst.check(call, dst_name);
  KILN_CHECK(x.shape() == dst.data.shape(), "{}: x has shape {} but {} has shape {}", call, shape_str(x.shape()),
             dst_name, shape_str(dst.data.shape()));
  KILN_CHECK(x.device() == dst.device(), "{}: x is on {} but {} is on {}", call, x.device().str(), dst_name,
             dst.device().str());
}

// An fp8 matrix transposed into a new contiguous Fp8Tensor (per tensor: the scaling carries over).
Fp8Tensor transposed_per_tensor(const Fp8Tensor& t) {
  Fp8Tensor r = t;
  r.data = contiguous(t.data.t());
  return r;
}

}  // namespace

Fp8Ops declare_fp8_ops(KernelRegistry& registry) {
  return {registry.declare<fp8_sig::quantize>(kFp8QuantizeOp),
          registry.declare<fp8_sig::quantize_transpose>(kFp8QuantizeTransposeOp),
          registry.declare<fp8_sig::dequantize>(kFp8DequantizeOp),
          registry.declare<fp8_sig::gemm>(kFp8GemmOp),
          registry.declare<fp8_sig::gemm_unsupported>(kFp8GemmUnsupportedOp),
          registry.declare<fp8_sig::delayed_scaling_update>(kFp8DelayedScalingUpdateOp),
          registry.declare<fp8_sig::delayed_scaling_update_many>(kFp8DelayedScalingUpdateManyOp),
          registry.declare<fp8_sig::piece_amax>(kFp8PieceAmaxOp),
          registry.declare<fp8_sig::piece_quantize>(kFp8PieceQuantizeOp)};
}

void register_fp8_ops(KernelRegistry& registry) {
  const Fp8Ops ops = declare_fp8_ops(registry);
  register_cpu_fp8_kernels(registry, ops);
#if KILN_WITH_CUDA
  register_cuda_fp8_kernels(registry, ops);
#endif
}

const Fp8Ops& fp8_ops() {
  static const Fp8Ops ops = [] {
    register_fp8_ops(kernel_registry());
    return declare_fp8_ops(kernel_registry());
  }();
  return ops;
}

Fp8Tensor fp8_empty(std::int64_t rows, std::int64_t cols, DType fp8_dtype, ScalingLayout layout, Device device) {
  KILN_CHECK(is_fp8(fp8_dtype), "fp8_empty: dtype {} is not an fp8 dtype (float8_e4m3fn or float8_e5m2)",
             dtype_name(fp8_dtype));
  KILN_CHECK(rows >= 0 && cols >= 0, "fp8_empty: negative shape [{}, {}]", rows, cols);
  // fp8_alloc's tensors, given their neutral contents: zero data and amax, unit scales.
  Fp8Tensor t = fp8_alloc(rows, cols, fp8_dtype, layout, device);
  t.data.zero_();
  t.scale.fill_(1.0);
  t.scale_inv.fill_(1.0);
  t.amax.zero_();
  return t;
}

Fp8Tensor fp8_alloc(std::int64_t rows, std::int64_t cols, DType fp8_dtype, ScalingLayout layout, Device device) {
  KILN_CHECK(is_fp8(fp8_dtype), "fp8_alloc: dtype {} is not an fp8 dtype (float8_e4m3fn or float8_e5m2)",
             dtype_name(fp8_dtype));
  KILN_CHECK(rows >= 0 && cols >= 0, "fp8_alloc: negative shape [{}, {}]", rows, cols);
  Fp8Tensor t;
  t.layout = layout;
  t.data = Tensor::empty({rows, cols}, fp8_dtype, device);
  const Shape s = fp8_scale_shape(layout, rows, cols);
  t.scale = Tensor::empty(s, DType::F32, device);
  t.scale_inv = Tensor::empty(s, DType::F32, device);
  t.amax = Tensor::empty(s, DType::F32, device);
  return t;
}

void fp8_quantize_into(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& options) {
  check_cast_input("fp8_quantize", x, dst, "dst");
  KILN_CHECK(!(options.power_of_two_scales && dst.layout == ScalingLayout::PerTensor && !options.current_scaling),
             "fp8_quantize: power_of_two_scales needs a computed scale (current scaling or a block layout); a "
             "delayed per-tensor scale is used as given");
  KILN_CHECK(options.amax_epsilon >= 0.0f, "fp8_quantize: amax_epsilon {} is negative", options.amax_epsilon);
  if (x.numel() == 0) return;
  kernel(fp8_ops().quantize, x.device())(x, dst, options);
}

Fp8Tensor fp8_quantize(const Tensor& x, DType fp8_dtype, ScalingLayout layout, const Fp8CastOptions& options) {
  KILN_CHECK(x.defined() && x.dim() == 2, "fp8_quantize: x must be a 2-D matrix");
  Fp8CastOptions o = options;
  if (layout == ScalingLayout::PerTensor) o.current_scaling = true;  // a fresh tensor has no scale history
  Fp8Tensor q = fp8_empty(x.shape()[0], x.shape()[1], fp8_dtype, layout, x.device());
  fp8_quantize_into(x, q, o);
  return q;
}

void fp8_quantize_transpose_into(const Tensor& x, const Fp8Tensor& rowwise, const Fp8Tensor& columnwise,
                                 const Fp8CastOptions& options) {
  check_cast_input("fp8_quantize_transpose", x, rowwise, "rowwise");
  check_cast_input("fp8_quantize_transpose", x.t(), columnwise, "columnwise");
  const auto fused = optional_kernel(fp8_ops().quantize_transpose, x.device());
  const bool per_tensor = rowwise.layout == ScalingLayout::PerTensor && columnwise.layout == ScalingLayout::PerTensor;
  const bool same_blocks = rowwise.layout != ScalingLayout::PerTensor && rowwise.layout == columnwise.layout;
  if (fused && x.is_contiguous() && (per_tensor || same_blocks) && rowwise.dtype() == columnwise.dtype()) {
    KILN_CHECK(!(per_tensor && options.power_of_two_scales && !options.current_scaling),
               "fp8_quantize_transpose: power_of_two_scales needs a computed scale (current scaling or a block "
               "layout); a delayed per-tensor scale is used as given");
    KILN_CHECK(options.amax_epsilon >= 0.0f, "fp8_quantize_transpose: amax_epsilon {} is negative",
               options.amax_epsilon);
    if (x.numel() > 0) fused(x, rowwise, columnwise, options);
    return;
  }
  fp8_quantize_into(x, rowwise, options);
  // The kernels read x through its strides, so x^T is cast without a high-precision copy.
  fp8_quantize_into(x.t(), columnwise, options);
}

namespace {

void check_piece(const char* call, const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scales,
                 const char* scales_name) {
  KILN_CHECK(x.defined() && x.dim() == 1 && x.is_contiguous() && is_high_precision(x.dtype()),
             "{}: x must be a contiguous 1-D float32, bfloat16 or float16 tensor, got {}", call,
             x.defined() ? x.describe() : "undefined");
  KILN_CHECK(
      piece.rows >= 0 && piece.cols >= 0 && piece.begin >= 0 && piece.begin + x.numel() <= piece.rows * piece.cols,
      "{}: the piece [{}, {}) does not lie in a [{}, {}] matrix", call, piece.begin, piece.begin + x.numel(),
      piece.rows, piece.cols);
  KILN_CHECK(
      scales.defined() && scales.dtype() == DType::F32 && scales.is_contiguous() &&
          scales.shape() == fp8_scale_shape(piece.layout, piece.rows, piece.cols) && scales.device() == x.device(),
      "{}: {} must be a contiguous float32 tensor of shape {} ({} scaling of a [{}, {}] matrix) on {}, got {}", call,
      scales_name, shape_str(fp8_scale_shape(piece.layout, piece.rows, piece.cols)), scaling_layout_name(piece.layout),
      piece.rows, piece.cols, x.device().str(), scales.defined() ? scales.describe() : "undefined");
}

}  // namespace

void fp8_piece_amax_(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& amax) {
  check_piece("fp8_piece_amax_", x, piece, amax, "amax");
  if (x.numel() > 0) kernel(fp8_ops().piece_amax, x.device())(x, piece, amax);
}

void fp8_piece_quantize_into(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scale, const Tensor& dst) {
  check_piece("fp8_piece_quantize_into", x, piece, scale, "scale");
  KILN_CHECK(dst.defined() && is_fp8(dst.dtype()) && dst.dim() == 1 && dst.is_contiguous() &&
                 dst.numel() == x.numel() && dst.device() == x.device(),
             "fp8_piece_quantize_into: dst must be a contiguous 1-D fp8 tensor of {} elements on {}, got {}", x.numel(),
             x.device().str(), dst.defined() ? dst.describe() : "undefined");
  if (x.numel() > 0) kernel(fp8_ops().piece_quantize, x.device())(x, piece, scale, dst);
}

void fp8_dequantize_into(const Fp8Tensor& q, const Tensor& out) {
  q.check("fp8_dequantize", "q");
  KILN_CHECK(out.defined() && out.is_contiguous() && out.shape() == q.data.shape(),
             "fp8_dequantize: out must be a contiguous {} tensor", shape_str(q.data.shape()));
  KILN_CHECK(is_high_precision(out.dtype()) || out.dtype() == DType::F64,
             "fp8_dequantize: out has dtype {}, expected float64, float32, bfloat16 or float16",
             dtype_name(out.dtype()));
  KILN_CHECK(out.device() == q.device(), "fp8_dequantize: out is on {} but q is on {}", out.device().str(),
             q.device().str());
  if (out.numel() == 0) return;
  kernel(fp8_ops().dequantize, q.device())(q, out);
}

Tensor fp8_dequantize(const Fp8Tensor& q, DType dtype) {
  q.check("fp8_dequantize", "q");
  Tensor out = Tensor::empty(q.data.shape(), dtype, q.device());
  fp8_dequantize_into(q, out);
  return out;
}

std::string_view amax_compute_algo_name(AmaxComputeAlgo a) { return a == AmaxComputeAlgo::Max ? "max" : "most_recent"; }

float fp8_scaled_max(DType fp8_dtype, int margin) {
  KILN_CHECK(is_fp8(fp8_dtype), "fp8_scaled_max: dtype {} is not an fp8 dtype", dtype_name(fp8_dtype));
  return fp8_max(fp8_dtype) * std::pow(2.0f, static_cast<float>(-margin));
}

void fp8_delayed_scaling_update(const Tensor& amax_history, const Tensor& scale, const Tensor& scale_inv,
                                AmaxComputeAlgo algo, float scaled_max) {
  constexpr const char* call = "fp8_delayed_scaling_update";
  KILN_CHECK(amax_history.defined() && amax_history.dtype() == DType::F32 && amax_history.dim() == 1 &&
                 amax_history.numel() >= 1 && amax_history.is_contiguous(),
             "{}: amax_history must be a contiguous float32 vector of length >= 1 (got {})", call,
             amax_history.defined() ? amax_history.describe() : "undefined");
  for (const auto& [t, name] : {std::pair{&scale, "scale"}, std::pair{&scale_inv, "scale_inv"}}) {
    KILN_CHECK(t->defined() && t->dtype() == DType::F32 && t->numel() == 1 && t->is_contiguous(),
               "{}: {} must be a float32 tensor of one element (got {})", call, name,
               t->defined() ? t->describe() : "undefined");
    KILN_CHECK(t->device() == amax_history.device(), "{}: {} is on {} but amax_history is on {}", call, name,
               t->device().str(), amax_history.device().str());
  }
  KILN_CHECK(std::isfinite(scaled_max) && scaled_max > 0.0f, "{}: scaled_max {} must be finite and positive", call,
             scaled_max);
  kernel(fp8_ops().delayed_scaling_update, amax_history.device())(amax_history, scale, scale_inv,
                                                                  algo == AmaxComputeAlgo::MostRecent, scaled_max);
}

void fp8_delayed_scaling_update_many(const std::vector<Fp8DelayedScalingRef>& states, AmaxComputeAlgo algo) {
  constexpr const char* call = "fp8_delayed_scaling_update_many";
  if (states.empty()) return;
  const Device device = states.front().amax_history.defined() ? states.front().amax_history.device() : Device::cpu();
  for (std::size_t i = 0; i < states.size(); ++i) {
    const Fp8DelayedScalingRef& s = states[i];
    KILN_CHECK(s.amax_history.defined() && s.amax_history.dtype() == DType::F32 && s.amax_history.dim() == 1 &&
                   s.amax_history.numel() >= 1 && s.amax_history.is_contiguous(),
               "{}: entry {}: amax_history must be a contiguous float32 vector of length >= 1 (got {})", call, i,
               s.amax_history.defined() ? s.amax_history.describe() : "undefined");
    for (const auto& [t, name] : {std::pair{&s.scale, "scale"}, std::pair{&s.scale_inv, "scale_inv"}})
      KILN_CHECK(t->defined() && t->dtype() == DType::F32 && t->numel() == 1 && t->is_contiguous(),
                 "{}: entry {}: {} must be a float32 tensor of one element (got {})", call, i, name,
                 t->defined() ? t->describe() : "undefined");
    for (const Tensor* t : {&s.amax_history, &s.scale, &s.scale_inv})
      KILN_CHECK(t->device() == device, "{}: entry {} is on {} but entry 0 is on {}", call, i, t->device().str(),
                 device.str());
    KILN_CHECK(std::isfinite(s.scaled_max) && s.scaled_max > 0.0f,
               "{}: entry {}: scaled_max {} must be finite and positive", call, i, s.scaled_max);
  }
  kernel(fp8_ops().delayed_scaling_update_many, device)(states, algo == AmaxComputeAlgo::MostRecent);
}

std::string_view fp8_epilogue_name(Fp8Epilogue e) {
  switch (e) {
    case Fp8Epilogue::None: return "none";
    case Fp8Epilogue::Bias: return "bias";
    case Fp8Epilogue::Gelu: return "gelu";
    case Fp8Epilogue::GeluBias: return "gelu_bias";
  }
  return "?";
}

namespace {

// Checks a GEMM, puts both operands into the native form (a [M, K], b [N, K]) and runs it.
void run_gemm(const Fp8Tensor& a_in, const Fp8Tensor& b_in, const Tensor& out, const Fp8Tensor* fp8_out,
              const Fp8GemmOptions& o) {
  constexpr const char* call = "fp8_gemm";
  a_in.check(call, "a");
  b_in.check(call, "b");
  KILN_CHECK(!(a_in.dtype() == DType::F8E5M2 && b_in.dtype() == DType::F8E5M2),
             "fp8_gemm: a and b are both float8_e5m2; e5m2 x e5m2 is not a valid FP8 GEMM (cuBLASLt refuses it): "
             "keep one operand e4m3 (TE's hybrid format: e4m3 activations/weights, e5m2 gradients)");
  KILN_CHECK(a_in.device() == b_in.device(), "fp8_gemm: a is on {} but b is on {}", a_in.device().str(),
             b_in.device().str());
  const bool a_block = a_in.layout != ScalingLayout::PerTensor, b_block = b_in.layout != ScalingLayout::PerTensor;
  KILN_CHECK(a_block == b_block,
             "fp8_gemm: a has {} scaling but b has {} scaling; per-tensor and block scaling do not mix in one GEMM",
             scaling_layout_name(a_in.layout), scaling_layout_name(b_in.layout));
  if (a_block) {
    KILN_CHECK(!o.trans_a,
               "fp8_gemm: a has {} block scaling and trans_a is set; a block-scaled operand must be "
               "stored [M, K] with its blocks along K (cast x^T with fp8_quantize_transpose_into)",
               scaling_layout_name(a_in.layout));
    KILN_CHECK(o.trans_b,
               "fp8_gemm: b has {} block scaling and trans_b is not set; a block-scaled operand must be "
               "stored [N, K] with its blocks along K (cast with fp8_quantize_transpose_into)",
               scaling_layout_name(b_in.layout));
    KILN_CHECK(!o.fast_accum, "fp8_gemm: fast_accum is not available with {} x {} block scaling",
               scaling_layout_name(a_in.layout), scaling_layout_name(b_in.layout));
    KILN_CHECK(o.epilogue == Fp8Epilogue::None || o.epilogue == Fp8Epilogue::Bias,
               "fp8_gemm: epilogue {} is not available with block scaling (none or bias)",
               fp8_epilogue_name(o.epilogue));
    KILN_CHECK(fp8_out == nullptr, "fp8_gemm: fp8 output is only available with per-tensor scaling (a is {})",
               scaling_layout_name(a_in.layout));
  }
  // The native form; per-tensor operands in the other orientation are transposed byte for byte.
  const Fp8Tensor a = o.trans_a ? transposed_per_tensor(a_in) : a_in;
  const Fp8Tensor b = o.trans_b ? b_in : transposed_per_tensor(b_in);
  const std::int64_t M = a.rows(), K = a.cols(), N = b.rows();
  KILN_CHECK(b.cols() == K, "fp8_gemm: inner dimensions differ: op(a) is [{}, {}] and op(b) is [{}, {}]", M, K,
             b.cols(), N);
  // cuBLASLt's FP8 rules (leading dimensions multiples of 16 bytes), enforced on every backend so
  // a shape that works on the CPU works on the GPU.
  KILN_CHECK(K % 16 == 0, "fp8_gemm: K = {} is not a multiple of 16 (FP8 GEMMs need K % 16 == 0; pad a and b)", K);
  KILN_CHECK(N % 16 == 0, "fp8_gemm: N = {} is not a multiple of 16 (FP8 GEMMs need N % 16 == 0; pad b)", N);
  if (a_block) KILN_CHECK(M % 8 == 0, "fp8_gemm: M = {} is not a multiple of 8 (block-scaled FP8 GEMMs; pad a)", M);

  KILN_CHECK(out.defined() && out.dim() == 2 && out.is_contiguous() && out.shape()[0] == M && out.shape()[1] == N,
             "fp8_gemm: out must be a contiguous [{}, {}] matrix", M, N);
  KILN_CHECK(out.device() == a.device(), "fp8_gemm: out is on {} but a is on {}", out.device().str(), a.device().str());
  if (fp8_out != nullptr)
    KILN_CHECK(!(out.dtype() == DType::F8E5M2 && a.dtype() == DType::F8E4M3 && b.dtype() == DType::F8E4M3),
               "fp8_gemm: out is float8_e5m2 but a and b are both float8_e4m3fn; cuBLASLt writes e4m3 x e4m3 as "
               "bfloat16, float32 or float8_e4m3fn (e5m2 output needs an e5m2 operand)");
  if (fp8_out == nullptr)
    KILN_CHECK(out.dtype() == DType::BF16 || out.dtype() == DType::F32,
               "fp8_gemm: output dtype {} is not supported (bfloat16 or float32; fp8 through an Fp8Tensor out)",
               dtype_name(out.dtype()));
  const bool wants_bias = o.epilogue == Fp8Epilogue::Bias || o.epilogue == Fp8Epilogue::GeluBias;
  if (wants_bias) {
    KILN_CHECK(o.bias.defined(), "fp8_gemm: epilogue {} needs a bias", fp8_epilogue_name(o.epilogue));
    KILN_CHECK(o.bias.dtype() == DType::BF16 && o.bias.dim() == 1 && o.bias.shape()[0] == N && o.bias.is_contiguous(),
               "fp8_gemm: bias must be a contiguous bfloat16 [{}] vector (got {} {})", N, dtype_name(o.bias.dtype()),
               shape_str(o.bias.shape()));
    KILN_CHECK(o.bias.device() == a.device(), "fp8_gemm: bias is on {} but a is on {}", o.bias.device().str(),
               a.device().str());
  } else {
    KILN_CHECK(!o.bias.defined(), "fp8_gemm: a bias was given but epilogue {} does not add one",
               fp8_epilogue_name(o.epilogue));
  }

  if (o.accumulate) {
    KILN_CHECK(fp8_out == nullptr && out.dtype() == DType::F32,
               "fp8_gemm: accumulate adds into a float32 out (got {}{})", dtype_name(out.dtype()),
               fp8_out != nullptr ? " through an Fp8Tensor" : "");
    KILN_CHECK(o.epilogue == Fp8Epilogue::None, "fp8_gemm: accumulate takes no epilogue (got {})",
               fp8_epilogue_name(o.epilogue));
  }

  Fp8GemmArgs args;
  args.a = &a;
  args.b = &b;
  args.out = out;
  args.fp8_out = fp8_out;
  args.bias = wants_bias ? o.bias : Tensor();
  args.epilogue = o.epilogue;
  args.fast_accum = o.fast_accum;
  args.accumulate = o.accumulate;
  if (M == 0 || N == 0) return;
  if (const auto unsupported = optional_kernel(fp8_ops().gemm_unsupported, a.device())) {
    const std::string why = unsupported(args);
    KILN_CHECK(why.empty(), "fp8_gemm: a {} {} x b {} {} on {}: {}", dtype_name(a.dtype()),
               scaling_layout_name(a.layout), dtype_name(b.dtype()), scaling_layout_name(b.layout), a.device().str(),
               why);
  }
  kernel(fp8_ops().gemm, a.device())(args);
}

}  // namespace

void fp8_gemm_into(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& out, const Fp8GemmOptions& options) {
  run_gemm(a, b, out, nullptr, options);
}

void fp8_gemm_into(const Fp8Tensor& a, const Fp8Tensor& b, const Fp8Tensor& out, const Fp8GemmOptions& options) {
  out.check("fp8_gemm", "out");
  KILN_CHECK(out.layout == ScalingLayout::PerTensor, "fp8_gemm: an fp8 out must have per-tensor scaling (got {})",
             scaling_layout_name(out.layout));
  run_gemm(a, b, out.data, &out, options);
}

Tensor fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Fp8GemmOptions& options) {
  a.check("fp8_gemm", "a");
  b.check("fp8_gemm", "b");
  const std::int64_t M = options.trans_a ? a.cols() : a.rows();
  const std::int64_t N = options.trans_b ? b.rows() : b.cols();
  KILN_CHECK(options.out_dtype == DType::BF16 || options.out_dtype == DType::F32,
             "fp8_gemm: out_dtype {} is not supported (bfloat16 or float32; fp8 output through fp8_gemm_into)",
             dtype_name(options.out_dtype));
  KILN_CHECK(!options.accumulate, "fp8_gemm: accumulate needs an out to add into: use fp8_gemm_into");
  Tensor out = Tensor::empty({M, N}, options.out_dtype, a.device());
  run_gemm(a, b, out, nullptr, options);
  return out;
}

}  // namespace kiln::ops
