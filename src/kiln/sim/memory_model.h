#pragma once
// Memory of one device during a training step: parameters, gradients, optimizer state (sharded by
// the distributed optimizer), FP8 weight copies, the activations the pipeline schedule holds at its
// worst moment (per pipeline stage, with recompute and sequence parallelism), the transient of the
// loss's backward, and the caching allocator's rounding (512 B, as runtime/caching_allocator) plus an
// optional fragmentation margin.
//
// Activations are counted tensor by tensor, as the implementation keeps them for the backward:
// Kiln's local layers (models/transformer_core_ops.cpp: attention through [B, H, T, S] scores, the
// q/k/v copies the batched matmuls keep, dropout masks in the activation dtype) or the fused ones
// (transformer_engine, Megatron-core with TE: flash attention, masks of one byte).
#include <cstdint>
#include <utility>
#include <vector>

#include "kiln/sim/layout.h"

namespace kiln::sim {

// The caching allocator's block size for a request (runtime/caching_allocator.cpp's rule: the
// request rounded to 512 B; blocks are split to it).
double allocator_block_bytes(double bytes);

struct MemoryBreakdown {
  double parameters = 0, gradients = 0, optimizer = 0, fp8_copies = 0;
  double activations = 0;  // held at the worst moment of the schedule
  double transient = 0;    // the loss's backward and one layer's gradients, on top
  double other = 0;        // the batch, the causal mask and RoPE table
  double fragmentation = 0;
  double peak() const {
    return parameters + gradients + optimizer + fp8_copies + activations + transient + other + fragmentation;
  }
};

// Parameters on one device of pipeline stage `stage` (embedding on the first, output layer on the last).
struct StageParameters {
  double dense = 0;   // replicated over data parallelism (and sharded by TP)
  double expert = 0;  // this device's experts
  double total() const { return dense + expert; }
};
StageParameters stage_parameters(const ModelSpec& model, const Layout& layout, int stage);
// The [out, in] shapes (this device's parts) of the FP8 ParallelLinears' weights on stage `stage`
// (empty without FP8): what the weight cache casts, and what --fp8-param-gather keeps in one byte.
std::vector<std::pair<double, double>> stage_fp8_linear_shapes(const ModelSpec& model, const Layout& layout, int stage);
// Their elements summed: the weights --fp8-param-gather keeps in one byte and gathers as such.
double stage_fp8_weight_elements(const ModelSpec& model, const Layout& layout, int stage);

// Bytes one layer keeps for its backward, per micro-batch, on one device (as the tensors are
// allocated: each rounded to the allocator's block). `moe`: the layer's MLP is the experts.
double layer_activation_bytes(const ModelSpec& model, const Layout& layout, bool moe);

// in_flight_chunks: micro-batch chunks whose activations stage `stage` holds at its worst moment
// (ScheduleResult::peak_in_flight). fragmentation: fraction of the dynamic memory added (0 for
// Kiln's CPU allocator, which only rounds). host_device: the device is the host (the "cpu" system),
// where the pipeline's sends keep the sent activations themselves until the step's end (on a GPU
// they are host copies, outside the device's memory).
MemoryBreakdown stage_memory(const ModelSpec& model, const Layout& layout, int stage, int in_flight_chunks,
                             double fragmentation, bool host_device = false);

}  // namespace kiln::sim
