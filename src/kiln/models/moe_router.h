#pragma once
// TopKRouter (Megatron-core's): logits = x W^T (W [E, H], in f32), the fused score + top-k of
// te::router_topk, capacity dropping and padding through te::dispatch_plan, and the auxiliary
// losses (load balancing: aux_loss / seq_aux_loss; z-loss) attached to the probs and the logits
// so they reach the backward (moe_aux_loss.h). With --moe-router-enable-expert-bias the router
// keeps DeepSeek-V3's expert bias (a buffer, saved in checkpoints as mlp.router.expert_bias),
// moved by update_expert_bias() after the optimizer step: bias += rate * sign(mean load - load).
//
// The router also counts, while training with gradients, the slots routed to each expert and
// those dropped over capacity, and sums the aux losses: take_stats() hands them to the trainer's
// log and starts over.
//
// Sequence parallelism (a `sequence_partition` group: the tensor-parallel group under
// --sequence-parallel, each rank holding an equal slice of every sequence), as Megatron-core's
// router with its tp_cp group: the weight is replicated and each rank routes its own tokens, whose
// capacity is its own (Megatron's get_capacity of the local tokens); the load-balancing loss takes
// the token counts summed over the group (each rank's loss its share of the group's), the z-loss's
// coefficient is divided by the group's size (the mean over the group's tokens), and the expert
// bias's counts and the statistics (loads, drops, aux and z losses; not the forwards) are summed
// over the group, so they are the whole sequences'. The weight's gradient, each rank's from its
// tokens, is summed over the group by the trainer (a sequence-parallel parameter).
//
// Context parallelism: the partition is the context-parallel group (with sequence parallelism the
// tensor-and-context-parallel group, Megatron's tp_cp), each rank routing its part of every
// sequence alike. The trainer averages the gradients over the data-and-context-parallel ranks
// (GptModel::loss scales the LM loss by the context-parallel size to make up for it), so the aux
// and z losses' gradients are multiplied by that size too (Megatron's MoEAuxLossAutoScaler scale x
// the cp size): their shares then add up to the one-process gradient.
#include <cstdint>
#include <optional>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/models/moe_spec.h"
#include "kiln/nn/module.h"
#include "kiln/te/moe.h"

namespace kiln::models {

struct RouterOutput {
  te::RouterTopk routing;  // probs [N, k] f32 (aux losses attached), indices [N, k]
  te::DispatchPlan plan;
};

struct RouterStats {
  std::vector<std::int64_t> tokens;   // per expert: slots routed (before dropping)
  std::vector<std::int64_t> dropped;  // per expert: slots dropped over capacity
  double load_balancing_loss = 0;     // sums over the forwards counted (coefficient applied)
  double z_loss = 0;
  std::int64_t forwards = 0;
};

class TopKRouter : public nn::Module {
 public:
  // `context_parallel_size`: how many of `sequence_partition`'s ranks have their gradients averaged
  // rather than summed (1 without context parallelism).
  explicit TopKRouter(const MoeSpec& spec, const dist::Communicator* sequence_partition = nullptr,
                      int context_parallel_size = 1);
  // x [N, H], the tokens of B sequences of seq_length (b-major; with a sequence partition, this
  // rank's slice of each sequence).
  RouterOutput forward(const Tensor& x, std::int64_t seq_length);
  // DeepSeek-V3's update from the slots kept since the last call (no-op without expert bias). With
  // a group (data parallelism: Megatron's tensor-and-data-parallel group) the counts are summed over
  // its ranks first, so every rank moves its bias by the whole global batch's load, as one process.
  // Collective over the sequence partition too. `copies`: DualPipe's pair of ranks holding this
  // layer and its copy, each routing its own direction's micro-batches: their counts are summed too
  // (collective over it; both ranks call it for the layer at the same point).
  void update_expert_bias(const dist::Communicator* group = nullptr, const dist::Communicator* copies = nullptr);
  // Collective over the sequence partition (every rank of it calls it at the same points).
  RouterStats take_stats();
  // Expert capacity for N tokens (Megatron's get_capacity: ceil(N k / E * factor)); 0 without one.
  std::int64_t capacity(std::int64_t num_tokens) const;

  MoeSpec spec;
  Tensor weight;       // [E, H]
  Tensor expert_bias;  // [E] buffer, f32 at construction; undefined without expert bias

 private:
  void count(const RouterOutput& out, const Tensor& aux, const Tensor& z);
  const dist::Communicator* partition() const { return sequence_partition_ ? &*sequence_partition_ : nullptr; }

  std::optional<dist::Communicator> sequence_partition_;  // more than one rank, or none
  double aux_gradient_factor_ = 1;                        // the context-parallel size

  Tensor kept_since_update_;           // [E] int64: the bias update's load
  Tensor stat_tokens_, stat_dropped_;  // [E] int64
  Tensor stat_aux_, stat_z_;           // f32 scalars
  std::int64_t stat_forwards_ = 0;
};

}  // namespace kiln::models
