#pragma once
// LayerWork: what one transformer layer makes a device do per micro-batch, beyond its four linear
// layers' GEMMs, as Kiln runs it (read from models/transformer_*.cpp, models/transformer_core_ops.cpp,
// models/transformer_te_ops.cpp, te/ and autograd/functions/): the bytes the memory-bound kernels
// move, by kind, forward and backward; which attention path runs and what it moves; the ops it
// records (each a dispatch on the host).
//
// The attention path: transformer_engine layers run te::attention (flash: cuDNN in bf16, Kiln's
// kernel in fp32) unless attention dropout is on, when transformer_te_ops.cpp hands the call to
// the local op, as local layers always run it: the [B, H, T, S] scores materialised by a batched
// GEMM, scaled, cast to f32, the causal mask added, softmax, cast back, dropout, a second batched
// GEMM (runs_unfused_attention()).
#include <array>
#include <vector>

#include "kiln/sim/calibration.h"
#include "kiln/sim/layout.h"

namespace kiln::sim {

// The models count in int64 (elements, bytes, FLOPs) and price in double.
inline double as_double(std::int64_t v) { return static_cast<double>(v); }

struct Traffic {
  std::array<double, kKernelKinds> bytes{};
  void add(KernelKind kind, double b) { bytes[static_cast<std::size_t>(kind)] += b; }
  double total() const;
  // At each kind's bandwidth (CalibrationTable::kernel_bandwidth), `fallback` where the table has none.
  double seconds(const CalibrationTable& table, double fallback_bandwidth) const;
};

// The local attention path of one layer and micro-batch: the traffic of its casts, mask, softmax,
// dropout and copies, and its batched GEMMs (FLOPs and the bytes they read and write).
struct UnfusedAttentionWork {
  Traffic forward, backward;
  double gemm_flops_forward = 0, gemm_flops_backward = 0;
  double gemm_bytes_forward = 0, gemm_bytes_backward = 0;
};

// Calls of Kiln's own non-GEMM ops (CalibrationTable::ops) in one pass: `calls` calls of `kind` on
// `elements` elements each.
struct OpCall {
  OpKind kind = OpKind::Add;
  double elements = 0, calls = 1;
};
// Seconds of the calls at the table's measured costs (forward or backward of each op kind), 0 for a
// kind the table lacks.
double op_calls_seconds(const std::vector<OpCall>& calls, const CalibrationTable& table, Precision p, bool backward);

struct LayerWork {
  bool unfused_attention = false;
  UnfusedAttentionWork attention;  // when unfused_attention
  Traffic forward, backward;       // the rest of the layer's memory-bound kernels
  // FP8 casts (and scaling) of the linear layers' inputs, weights and output gradients: part of a
  // calibrated FP8 linear sample, counted separately for tables without one.
  Traffic fp8_casts_forward, fp8_casts_backward;
  // Of the forward's, the columnwise casts of the FP8 linears' inputs: not made by a forward without
  // gradients (the first forward under full recompute).
  Traffic fp8_columnwise_forward;
  double fp8_weights = 0;                    // elements of the FP8 linear weights: cast once per optimizer step
  double ops_forward = 0, ops_backward = 0;  // recorded ops (host dispatches)
  double parameters = 0;                     // on this device
  double accumulated_parameters = 0;         // of those, the ones whose gradients accumulate in a pass of their own
  double parameter_tensors = 0;
  // transformer_engine layers, op by op as models/ and te/ call them (for tables with op samples;
  // the byte counts above serve older tables): the forward's and the backward's calls, and those of
  // the MLP's bias / GELU passes when the MLP is te::linear_gelu_linear (`gelu_mlp`: a table with
  // GELU MLP samples prices fc1, fc2 and these passes together and skips mlp_calls_*).
  std::vector<OpCall> calls_forward, calls_backward, mlp_calls_forward, mlp_calls_backward;
  bool gelu_mlp = false;
  // Elements of each parameter tensor of the layer on this device whose gradient is accumulated
  // into the fp32 buffers by one call per micro-batch (autograd/node.cpp AccumulateGrad): all but
  // the linears' weights under gradient-accumulation fusion.
  std::vector<double> parameter_sizes;
  // Bytes the MoE dispatch and combine move (priced by bytes in any table).
  Traffic moe_forward, moe_backward;
};

// True when `c`'s layers run attention through the materialised scores (see above).
bool runs_unfused_attention(const models::GptConfig& c);

LayerWork layer_work(const ModelSpec& model, const Layout& layout, bool moe);

}  // namespace kiln::sim
