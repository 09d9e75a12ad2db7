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

#include "kiln/sim/calibration.h"
#include "kiln/sim/layout.h"

namespace kiln::sim {

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

struct LayerWork {
  bool unfused_attention = false;
  UnfusedAttentionWork attention;  // when unfused_attention
  Traffic forward, backward;       // the rest of the layer's memory-bound kernels
  // FP8 casts (and scaling) of the linear layers' inputs, weights and output gradients: part of a
  // calibrated FP8 linear sample, counted separately for tables without one.
  Traffic fp8_casts_forward, fp8_casts_backward;
  double fp8_weights = 0;                    // elements of the FP8 linear weights: cast once per optimizer step
  double ops_forward = 0, ops_backward = 0;  // recorded ops (host dispatches)
  double parameters = 0;                     // on this device: their gradients accumulate per micro-batch
  double parameter_tensors = 0;
};

// True when `c`'s layers run attention through the materialised scores (see above).
bool runs_unfused_attention(const models::GptConfig& c);

LayerWork layer_work(const ModelSpec& model, const Layout& layout, bool moe);

}  // namespace kiln::sim
