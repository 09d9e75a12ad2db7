#pragma once
// FP8 ops: casts between high precision and Fp8Tensor (producing amax and scales as they go),
// dequantisation, the transpose-cast backward passes need, and the FP8 GEMM (cuBLASLt on CUDA, a
// float64 reference on the CPU). Arguments are checked here, once for every backend; the kernels
// are the FP8 family of the kernel registry (fp8_kernels.h).
#include <vector>

#include "kiln/tensor/fp8_tensor.h"
#include "kiln/tensor/tensor.h"

namespace kiln::ops {

struct Fp8CastOptions {
  // Per tensor only: false = delayed scaling (multiply by dst.scale as it is, e.g. from an amax
  // history); true = current scaling (dst.scale = fp8_max / amax(x), computed on the device before
  // the cast). Block layouts always derive each block's scale from the block's amax.
  bool current_scaling = false;
  // Scales rounded down to a power of two (exact scaling; DeepSeek-V3 / TE's force_pow_2_scales).
  bool power_of_two_scales = false;
  // amax values below this count as this when a scale is computed (TE's amax_epsilon).
  float amax_epsilon = 0.0f;
};

// A zeroed Fp8Tensor of [rows, cols]: scale and scale_inv 1, amax 0 (so a delayed-scaling cast
// into it starts with scale 1).
Fp8Tensor fp8_empty(std::int64_t rows, std::int64_t cols, DType fp8_dtype, ScalingLayout layout, Device device);

// As fp8_empty but nothing is initialised and nothing is launched: for a tensor a cast is about to
// fill. Every entry a cast reads or writes is written by the cast (data, scale_inv and amax; scale
// with current scaling or block layouts; a delayed cast needs dst.scale set by the caller); block
// layouts' padding entries are left undefined (no kernel reads them).
Fp8Tensor fp8_alloc(std::int64_t rows, std::int64_t cols, DType fp8_dtype, ScalingLayout layout, Device device);

// dst = cast(x): x is a 2-D f32/bf16/f16 matrix (any strides) of dst's shape, on dst's device.
// Writes dst.data (saturated to +-fp8_max, rounded to nearest even), dst.amax (max |x| over the
// tensor or each block), dst.scale (when computed) and dst.scale_inv = 1 / dst.scale.
void fp8_quantize_into(const Tensor& x, const Fp8Tensor& dst, const Fp8CastOptions& options = {});
Fp8Tensor fp8_quantize(const Tensor& x, DType fp8_dtype, ScalingLayout layout, const Fp8CastOptions& options = {});

// The transpose-cast of wgrad/dgrad: rowwise = cast(x) and columnwise = cast(x^T) (columnwise is
// [cols, rows]; with block layouts its blocks run along x's columns, TE's "columnwise" data).
// Where the backend has a fused kernel (CUDA: per tensor with one dtype, or both outputs in the same
// block layout) x is read once for both; the bytes, scales and amaxes are those of the two casts.
void fp8_quantize_transpose_into(const Tensor& x, const Fp8Tensor& rowwise, const Fp8Tensor& columnwise,
                                 const Fp8CastOptions& options = {});

// A shard of one weight matrix as a distributed optimizer holds it (--fp8-param-gather): the
// elements [begin, begin + n) of a [rows, cols] matrix in row-major order, given as a flat tensor of
// n elements. A shard may start and end anywhere in a row, so it may cut a 128x128 block; the ops
// below map each element (r, c) to its entry of the whole matrix's scale tensor (fp8_scale_index),
// so the pieces of a matrix held by several processes give, together, the whole matrix's cast.
struct Fp8MatrixPiece {
  std::int64_t rows = 0, cols = 0, begin = 0;
  ScalingLayout layout = ScalingLayout::PerTensor;
};

// amax[k] = max(amax[k], |x[i]|) for every element i of the piece whose scale entry is k: the
// piece's share of the per-tensor or per-block amaxes (zero `amax` first; a max-reduction of the
// pieces' results over the processes is the whole matrix's amax). x: contiguous 1-D f32 / bf16 /
// f16; amax: contiguous f32 of fp8_scale_shape(layout, rows, cols).
void fp8_piece_amax_(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& amax);

// dst[i] = fp8(x[i] * scale[k]) (saturating, round to nearest even) with k element i's scale entry:
// exactly the bytes fp8_quantize_into of the whole matrix writes there when its scales are `scale`.
// dst: contiguous 1-D fp8 of x's length.
void fp8_piece_quantize_into(const Tensor& x, const Fp8MatrixPiece& piece, const Tensor& scale, const Tensor& dst);

// float(q.data) * q.scale_inv in f32, rounded to `dtype` (f32, bf16, f16 or f64).
Tensor fp8_dequantize(const Fp8Tensor& q, DType dtype = DType::F32);
void fp8_dequantize_into(const Fp8Tensor& q, const Tensor& out);

// How delayed scaling reduces the amax history to the amax its scale follows (TE's amax_compute_algo).
enum class AmaxComputeAlgo : std::uint8_t { Max, MostRecent };
std::string_view amax_compute_algo_name(AmaxComputeAlgo a);  // "max", "most_recent"

// fp8_max(dtype) * 2^-margin in f32: the value delayed scaling maps the amax onto (TE's scaled_max).
float fp8_scaled_max(DType fp8_dtype, int margin);

// One step of TransformerEngine's DelayedScaling update, on the device (no host synchronisation,
// CUDA-graph capturable): amax_history is an f32 [L] vector whose entry 0 holds the amax the last
// cast recorded (a cast into an Fp8Tensor whose `amax` is amax_history.narrow(0, 0, 1) writes it
// there); scale and scale_inv are f32 [1]. Rolls the history, zeroes entry 0, and sets
// scale = scaled_max / amax(history), scale_inv = 1 / scale (see fp8::delayed_scaling_step).
void fp8_delayed_scaling_update(const Tensor& amax_history, const Tensor& scale, const Tensor& scale_inv,
                                AmaxComputeAlgo algo, float scaled_max);

// Many tensors' delayed-scaling updates in one launch (TE updates all of a step's scaling state in
// one kernel): each entry is one fp8_delayed_scaling_update, with its own scaled_max; all on one
// device. The bits are those of the single updates (fp8::delayed_scaling_step).
struct Fp8DelayedScalingRef {
  Tensor amax_history, scale, scale_inv;
  float scaled_max = 0.0f;
};
void fp8_delayed_scaling_update_many(const std::vector<Fp8DelayedScalingRef>& states, AmaxComputeAlgo algo);

enum class Fp8Epilogue : std::uint8_t { None, Bias, Gelu, GeluBias };
std::string_view fp8_epilogue_name(Fp8Epilogue e);

struct Fp8GemmOptions {
  // out = op(a) @ op(b) (row-major). The native FP8 form on Hopper is trans_b = true with a
  // [M, K] and b [N, K] both K-contiguous (a linear layer's x @ W^T); other forms transpose the
  // fp8 bytes of per-tensor operands first (block-scaled operands must come K-contiguous: use
  // fp8_quantize_transpose_into).
  bool trans_a = false;
  bool trans_b = true;
  DType out_dtype = DType::BF16;  // bf16 or f32 (fp8 output: fp8_gemm_into with an Fp8Tensor)
  Fp8Epilogue epilogue = Fp8Epilogue::None;
  Tensor bias;              // bf16 [N] for Bias / GeluBias (the bias type cuBLASLt takes with fp8 inputs)
  bool fast_accum = false;  // per-tensor only: no periodic promotion of the tensor-core partial sums
  // out += result instead of out = result (float32 out, no epilogue, fp8_gemm_into only): how a
  // weight gradient goes straight into its fp32 main gradient (autograd/grad_accumulation_fusion.h),
  // in the GEMM's fp32 accumulator precision and without a second pass over the gradient.
  bool accumulate = false;
};

Tensor fp8_gemm(const Fp8Tensor& a, const Fp8Tensor& b, const Fp8GemmOptions& options = {});
// out is bf16 or f32 [M, N], contiguous.
void fp8_gemm_into(const Fp8Tensor& a, const Fp8Tensor& b, const Tensor& out, const Fp8GemmOptions& options = {});
// FP8 output (per-tensor operands only): out.data = cast(result * out.scale), out.amax = max |result|,
// out.scale_inv = 1 / out.scale; out's layout must be PerTensor.
void fp8_gemm_into(const Fp8Tensor& a, const Fp8Tensor& b, const Fp8Tensor& out, const Fp8GemmOptions& options = {});

}  // namespace kiln::ops
