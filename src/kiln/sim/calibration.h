#pragma once
// CalibrationTable: what `kiln simulate --calibrate` measured on a device, through Kiln's own ops:
// GEMM seconds by shape and precision, attention forward and backward (te/'s fused kernel, and the
// local layers' unfused path through [B, H, T, S] scores, with and without attention dropout), FP8
// linear layers by recipe, the bandwidth of memory-bound kernels and the per-op dispatch cost.
// Predictions look a GEMM up by its nearest measured shape (in log space) and take that shape's
// efficiency; without a table they fall back to the roofline.
//
// Timing. Tables written since format 2 ("timing": "amortized") time each shape over several
// back-to-back calls between two device synchronisations: device time, as in training, where
// launches are asynchronous. Older tables ("timing" absent) timed one call per synchronisation, so
// every sample carries the launch and synchronisation latency (about 15 us on the H200, the whole
// time of a small GEMM); load_calibration() removes it (call_latency: the fastest GEMM sample, a
// shape with negligible work) from every GEMM and attention sample, keeping at least a tenth of
// the sample. The same old tables measured the memory-bound kernels' per-element cost on 512K
// f32 elements, launch-bound on a GPU: without "elementwise_elements" those costs are dropped on
// GPU tables and the kernels run at memory_bandwidth (docs/simulate.md).
#include <array>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "kiln/runtime/device.h"
#include "kiln/sim/system_spec.h"
#include "kiln/te/fp8_recipe.h"

namespace kiln::sim {

struct GemmSample {
  std::int64_t m = 0, n = 0, k = 0;
  Precision precision = Precision::FP32;
  double seconds = 0;
};

struct AttentionSample {
  std::int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  Precision precision = Precision::FP32;
  double forward_seconds = 0, backward_seconds = 0;
  // With attention dropout te::attention runs Kiln's own kernels with the Philox mask instead of
  // cuDNN's (te/attention_dropout.h): a separate sample. Tables from before 2026-12-03 have none.
  bool dropout = false;
};

// The local layers' attention (models/transformer_core_ops.cpp local_attention): batched GEMMs and
// the casts, mask add, softmax and (with attention dropout) dropout over the [B, H, T, S] scores.
struct UnfusedAttentionSample {
  std::int64_t batch = 0, heads = 0, seq = 0, head_dim = 0;
  Precision precision = Precision::FP32;
  bool dropout = false;
  double forward_seconds = 0, backward_seconds = 0;
};

// One linear layer (autograd/functions/linalg.cpp linear: x W^T forward, dgrad g W and wgrad g^T x
// backward, the layouts training runs) of [m, k] x [n, k]^T, bias-free.
struct LinearSample {
  std::int64_t m = 0, n = 0, k = 0;
  Precision precision = Precision::BF16;
  double forward_seconds = 0, backward_seconds = 0;
};

// One te::fp8_linear forward and backward ([m, k] x [n, k]^T, casts included) under a recipe.
struct Fp8LinearSample {
  std::int64_t m = 0, n = 0, k = 0;
  te::Fp8ScalingRecipe recipe = te::Fp8ScalingRecipe::Delayed;
  double seconds = 0;  // forward and backward together
};

// The memory-bound kernel kinds of the layers; their reference traffic per element (f32, forward
// and backward together, as calibrate() runs them, less the harness) converts a measured
// per-element time into an effective bandwidth.
// Strided: elementwise work over non-contiguous views (narrowed halves, permutes, broadcasts), which
// Kiln's strided kernels run well below the contiguous ones' bandwidth; priced by the table's Copy op
// sample (ops::contiguous of a strided view), else as Copy.
enum class KernelKind { Copy, Norm, Activation, Dropout, Softmax, Strided };
inline constexpr int kKernelKinds = 6;
double reference_bytes_per_element(KernelKind kind);

// Kiln's own non-GEMM ops as a transformer layer calls them (te/fused_norm.h, te/rope.h,
// te/swiglu.h, autograd's add / gelu / dropout, the linear layers' bias gradient and out-of-place
// bias add, the strided copies before and after attention, the bf16 gradients accumulated into the
// fp32 buffers), each timed forward and backward through autograd (autograd::grad with a given output
// gradient: no sum, fill or .grad accumulation around it) at several sizes on the device, back to
// back as training launches them. Each pass's time is `fixed + per_element * elements` (least squares
// over the sizes, relative error): `fixed` is what one call costs whatever its size (the host's
// dispatch and recording where that is slower than the kernels, the launches and their ramp and
// tail), `per_element` the bandwidth the kernels actually reach. The elements are those of the
// op's main tensor: x for norms, add, dropout, gelu, RoPE and the copies, the [.., F] output for
// SwiGLU, the output gradient [N, out] for the bias gradient, the gradient for Accumulate.
enum class OpKind {
  LayerNorm,          // te::add_layer_norm(x, none, w, b): the first norm of a layer
  LayerNormResidual,  // te::add_layer_norm(x, residual, w, b): the second (and the final norm)
  RmsNorm,
  RmsNormResidual,
  Add,         // add(a, b) forward; also what the autograd engine runs to sum two gradients
  BiasGrad,    // ops::reduce(Sum, dy [N, out], {0}): a linear layer's bias gradient
  BiasAdd,     // y + b broadcast over rows, out of place (after an FP8 GEMM, or fc2 in te's GELU MLP)
  Rope,        // te::apply_rope on q or k [B, T, H, D]
  Swiglu,      // te::swiglu [N, 2F] -> [N, F]
  Gelu,        // gelu(x, tanh) through autograd (local layers and FP8 MLPs)
  Dropout,     // dropout(x, p) with its Philox mask
  Copy,        // ops::contiguous of a strided [B, T, H, D] view (q, k, v before / after attention)
  Accumulate,  // ops::accumulate_(fp32 buffer, gradient): AccumulateGrad, per parameter tensor
};
inline constexpr int kOpKinds = 13;
const char* to_string(OpKind kind);

struct OpCost {
  double fixed = 0, per_element = 0;
  double seconds(double elements) const { return elements > 0 ? fixed + per_element * elements : 0.0; }
};

struct OpSample {
  OpKind kind = OpKind::Add;
  Precision precision = Precision::BF16;
  OpCost forward, backward;
  // The measurements the costs were fitted to: (elements, forward seconds, backward seconds).
  std::vector<std::array<double, 3>> points;
};

// A line `fixed + per_element * x` through (x, seconds) points, least squares on the relative error
// (each point weighted by 1 / seconds^2, so the small sizes that carry the fixed cost count as much
// as the large ones); both terms kept >= 0.
OpCost fit_op_cost(const std::vector<std::pair<double, double>>& points);

// te::linear_gelu_linear (transformer_engine's GELU MLP on one rank without FP8), forward and
// backward: fc1 with its bias and GELU in the GEMM's epilogue, fc2, fc2's bias added out of place,
// the GELU derivative and fc1's bias gradient pass, fc2's bias gradient, the four GEMMs of the
// backward. [m, h] -> [m, f] -> [m, h].
struct GeluMlpSample {
  std::int64_t m = 0, f = 0, h = 0;
  Precision precision = Precision::BF16;
  double forward_seconds = 0, backward_seconds = 0;
};

// What a te::fp8_linear keeps for its backward beyond its output, per element of its input x (the
// saved FP8 cast(s) of x), and what its te::Fp8WeightCache holds per weight element, measured from
// the caching allocator's count around one call (bf16 input).
struct Fp8MemorySample {
  te::Fp8ScalingRecipe recipe = te::Fp8ScalingRecipe::Delayed;
  double saved_bytes_per_input = 0, cache_bytes_per_weight = 0;
};

struct CalibrationTable {
  std::string device;
  int format = 2;           // 1: one call per synchronisation (older tables), 2: amortized
  double call_latency = 0;  // removed from the samples of a format-1 table (seconds)
  std::vector<GemmSample> gemms;
  std::vector<AttentionSample> attention;
  std::vector<UnfusedAttentionSample> unfused_attention;
  std::vector<Fp8LinearSample> fp8_linear;
  // One FP8 linear's forward and backward at a shape too small to cost anything but its calls (16
  // rows x 128 x 128), per recipe: the fixed part of the samples above, which fp8_linear_seconds
  // keeps when it scales a sample by FLOPs (tables since 2026-12-07; "fp8_linear_call" in the file).
  std::vector<Fp8LinearSample> fp8_linear_call;
  std::vector<LinearSample> linear;
  double memory_bandwidth = 0;  // bytes/s of an elementwise kernel (read two, write one)
  // Seconds one small recorded op costs beyond its arithmetic (dispatch, autograd recording, a
  // kernel launch or the CPU thread pool's fork and join): what dominates tiny models.
  double op_overhead = 0;
  // Seconds per element of the memory-bound kernels the layers run, forward and backward together
  // (0: not measured; memory_bandwidth stands in), measured on `elementwise_elements` f32 elements.
  // `harness`: the same measurement around no op (the sum, its gradient's fill, x's gradient
  // accumulation), taken off the others.
  struct Elementwise {
    double norm = 0, activation = 0, dropout = 0, softmax = 0, add = 0, harness = 0;
  } elementwise;
  std::int64_t elementwise_elements = 0;
  // How the samples were taken (tables since 2026-12-04): linear layers' backward as their two GEMMs
  // called directly (before: through autograd, with its harness), FP8 linear layers with their
  // weight's casts kept between calls as training keeps them. load_calibration() takes the harness
  // (and the weight casts) off older samples.
  bool linear_backward_direct = false, fp8_weight_cached = false;
  // The FP8 linear samples timed as training runs the layer (since 2026-12-07: the output's gradient
  // given, the weight gradient added into an fp32 main gradient by the GEMM, no .grad accumulation):
  // no harness to take off them ("fp8_linear": "training" in the file).
  bool fp8_linear_direct = false;
  // Tables since 2026-12-05 (empty in older ones: the byte model above stands in).
  std::vector<OpSample> ops;
  std::vector<GeluMlpSample> gelu_mlp;
  std::vector<Fp8MemorySample> fp8_memory;
  bool empty() const { return gemms.empty(); }
  // The op's sample of the precision; nullptr without one.
  const OpSample* op(OpKind kind, Precision p) const;
  // True when the table has every op kind of the precision: the layers' ops are then priced per call.
  bool has_ops(Precision p) const;
  // te::linear_gelu_linear's (forward, backward) from the nearest sample (log-shape space) of the
  // precision, scaled by FLOPs; nullopt without one.
  std::optional<std::pair<double, double>> gelu_mlp_seconds(std::int64_t m, std::int64_t f, std::int64_t h,
                                                            Precision p) const;
  const Fp8MemorySample* fp8_memory_of(te::Fp8ScalingRecipe recipe) const;
  // Seconds of an m x k by k x n GEMM: the nearest sample's FLOP/s; roofline if none.
  double gemm_seconds(std::int64_t m, std::int64_t n, std::int64_t k, Precision p, double peak_flops) const;
  // Seconds of causal attention (forward, backward): the FLOP rate interpolated in log(work) between
  // the samples of the nearest head size (the end sample's rate beyond them), of the samples with
  // attention dropout when `dropout` and the table has them, else of those without (an old table: a
  // prediction that is low by the dropout kernels' extra cost).
  std::pair<double, double> attention_seconds(std::int64_t batch, std::int64_t heads, std::int64_t seq_q,
                                              std::int64_t seq_kv, std::int64_t head_dim, Precision p,
                                              double peak_flops, bool dropout = false) const;
  // The unfused path (forward, backward) from the sample of the same precision and dropout nearest in
  // sequence and head size (then in score elements), scaled by the score elements B x H x T x S (its
  // traffic); nullopt without such a sample.
  std::optional<std::pair<double, double>> unfused_attention_seconds(std::int64_t batch, std::int64_t heads,
                                                                     std::int64_t seq_q, std::int64_t seq_kv,
                                                                     std::int64_t head_dim, Precision p,
                                                                     bool dropout) const;
  // One linear layer's (forward, backward): the samples' FLOP rates of the precision interpolated
  // in log-shape space, kept between the samples the shape contains and those containing it;
  // nullopt without one (the GEMM samples stand in).
  std::optional<std::pair<double, double>> linear_seconds(std::int64_t m, std::int64_t n, std::int64_t k,
                                                          Precision p) const;
  // One FP8 linear's forward and backward from the nearest sample of the recipe: its fixed part
  // (fp8_linear_fixed_seconds) plus the rest scaled by FLOPs;
  // nullopt without a sample.
  std::optional<double> fp8_linear_seconds(std::int64_t m, std::int64_t n, std::int64_t k,
                                           te::Fp8ScalingRecipe recipe) const;
  // The fixed part of the recipe's FP8 linear call (seconds, in [0, at_most]): the intercept of two
  // samples that differ only in rows, else the call sample; 0 without either.
  double fp8_linear_fixed_seconds(te::Fp8ScalingRecipe recipe, double at_most) const;
  // Effective bytes/s of a kernel kind: its measured per-element cost where that is trustworthy,
  // else memory_bandwidth (0 when neither).
  double kernel_bandwidth(KernelKind kind) const;
};

struct CalibrateOptions {
  Device device = Device::cpu();
  bool quick = false;  // fewer and smaller shapes (tests)
  std::vector<Precision> precisions = {Precision::FP32};
};

// Runs the measurements (a few seconds on the CPU with quick).
CalibrationTable calibrate(const CalibrateOptions& options);
// Written atomically (io/atomic_file); read back with names in messages.
void save_calibration(const CalibrationTable& table, const std::filesystem::path& path);
CalibrationTable load_calibration(const std::filesystem::path& path);

}  // namespace kiln::sim
