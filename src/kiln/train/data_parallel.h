#pragma once
// Data parallelism for the training loop (Megatron-core's DistributedDataParallel and distributed
// optimizer), over the flat gradient buffers (optim/grad_buffers.h) and a data-parallel group
// (dist/collectives.h: MPI for host buffers, NCCL for device buffers behind the same calls).
//
// Every rank holds the whole model and trains on its own slice of each global batch; the
// gradients are averaged over the group bucket by bucket:
//   - without the distributed optimizer, an all-reduce: every rank has the averaged gradients
//     and runs the same optimizer step;
//   - with it (ZeRO-1), a reduce-scatter: rank r gets the average of its shard of every bucket
//     (GradBucket::shard(r, size)), its optimizer holds masters and moments for that shard only
//     and updates it, and an all-gather of the parameter buckets gives every rank the new weights.
// With overlap_grad_reduce a bucket's reduction starts from the bucket-ready callback, while
// backward still runs (on the last micro-batch: GradBuffers' no_sync); without, all buckets start
// after backward. The gradient norm and clipping span the group (the shards' squares are summed).
//
//   DataParallel dp(buffers, group, options);     // buffers built with shard_count = group size
//   FlatAdamW opt(buffers, groups, adam, dp.optimizer_shard());
//   ... backward of every micro-batch ...; buffers.finish_backward();
//   dp.finish_grad_sync();
//   Tensor norm = dp.clip_grad_norm(params, 1.0);
//   opt.step();
//   dp.start_param_gather();  ... dp.finish_param_gather() before the weights are read
//
// Every rank makes the same calls in the same order (the collectives are matched by order).
#include <optional>
#include <string>
#include <unordered_set>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/dist/work.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/optim/grad_buffers.h"
#include "kiln/tensor/ordered_dict.h"

namespace kiln::train {

struct DataParallelOptions {
  bool distributed_optimizer = false;  // --use-distributed-optimizer
  bool overlap_grad_reduce = false;    // --overlap-grad-reduce
  bool overlap_param_gather = false;   // --overlap-param-gather: the all-gather runs until the weights are next read
};

// Tensor parallelism beside data parallelism (world = tp x dp, the tensor-parallel ranks adjacent):
// each rank's parameters are its shards; the data-parallel group joins the ranks holding the same
// shards. What the gradients need from the tensor-parallel group:
struct TensorParallelGrads {
  dist::Communicator group;
  // Whole on every rank of the group (norms, row-parallel biases, position embeddings): counted once
  // in the gradient norm (on the group's rank 0), not tp times.
  std::vector<Tensor> replicated;
  // Of those, the ones whose gradient each rank computes from its slice of the sequence only
  // (--sequence-parallel): summed over the group after backward.
  std::vector<Tensor> sequence_parallel;
};

// Expert parallelism beside data parallelism: the experts' gradients sit in buffers of their own
// (GradBuffers::is_expert_buffer). Each expert-parallel rank holds other experts, fed by the tokens
// of every rank of its expert-parallel group: an expert's gradient is summed over the
// expert-data-parallel group (the ranks holding the same experts) and divided by the whole
// data-parallel size (Megatron's expert gradient scaling), the distributed optimizer shards those
// buffers over the expert-data-parallel group, and the gradient norm adds the experts' squares over
// the expert-parallel group.
struct ExpertParallelGrads {
  dist::Communicator expert_data_parallel;
  // The ranks holding different experts or different slices of them: the expert-parallel group, or
  // with expert tensor parallelism the expert-tensor x expert-parallel one (ProcessGroups::tp_ep()).
  dist::Communicator expert_parallel;
  // The tensor-parallel size under sequence parallelism (each rank of a tensor-parallel group sends
  // its own slice of the tokens to the experts), else 1 (without sequence parallelism the ranks of
  // a tensor-parallel group send copies of the same tokens: an expert sees each token tp times).
  // The experts' gradients are divided by expert_parallel's size over this.
  int sequence_parallel_size = 1;
};

// Pipeline parallelism beside data parallelism: each rank holds its stage's parameters; the norm's
// squares add up over the pipeline group, each parameter counted on the stage that owns it (the
// last stage's copy of tied word embeddings is the first stage's, not counted again).
struct PipelineParallelGrads {
  dist::Communicator group;
  std::vector<Tensor> not_counted;
  // Parameters whose gradient changes after backward (tied word embeddings: summed over the
  // embedding group before finish_grad_sync): with overlap_grad_reduce the buckets holding them are
  // not reduced from backward's bucket-ready callback, only in finish_grad_sync.
  std::vector<Tensor> completed_after_backward;
};

class DataParallel {
 public:
  // Installs the bucket-ready callback on `buffers` (with overlap_grad_reduce). With the distributed
  // optimizer the buffers must have been built with shard_count = group.size(). Broadcasts rank 0's
  // parameters, so every rank starts from the same weights. `tensor_parallel`: see above (the
  // parameters are then shards, and the norm spans the tensor-parallel group too).
  DataParallel(optim::GradBuffers& buffers, dist::Communicator group, DataParallelOptions options,
               std::optional<TensorParallelGrads> tensor_parallel = std::nullopt,
               std::optional<ExpertParallelGrads> expert_parallel = std::nullopt,
               std::optional<PipelineParallelGrads> pipeline_parallel = std::nullopt);
  ~DataParallel();
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  const dist::Communicator& group() const { return group_; }
  int rank() const { return group_.rank(); }
  int size() const { return group_.size(); }
  const DataParallelOptions& options() const { return options_; }

  // The ranges of the buffers this rank's optimizer updates: its shard with the distributed
  // optimizer, everything ({}) without.
  optim::FlatOptimizer::Shard optimizer_shard() const;

  // After GradBuffers::finish_backward(): starts the reductions not started yet and waits for all.
  // Then every gradient (or, with the distributed optimizer, this rank's shard of them) holds the
  // average over the group. Under sequence parallelism the sequence-parallel gradients are then
  // summed over the tensor-parallel group.
  void finish_grad_sync();

  // The global L2 norm of the reduced gradients (a f32 scalar, equal on every rank), clipping them
  // to max_norm first when max_norm > 0 (torch's clip_grad_norm_). Under tensor parallelism the
  // shards' squares are summed over the tensor-parallel group, the replicated parameters' once.
  Tensor clip_grad_norm(const std::vector<Tensor>& params, double max_norm);

  // Distributed optimizer, after the step: all-gathers the parameter buckets. Without
  // overlap_param_gather it waits at once; with it, finish_param_gather() waits (call it before
  // anything reads the weights). Both do nothing without the distributed optimizer.
  void start_param_gather();
  void finish_param_gather();

  // In place: the mean (or sum) of a tensor over the group (losses, evaluation sums).
  void average(Tensor& value) const;
  void sum(Tensor& value) const;

  void barrier() const { group_.barrier(); }

  // Gradient reductions started and not yet finished (finish_grad_sync() ends them): with
  // overlap_grad_reduce, those that backward's bucket-ready callbacks started.
  std::size_t reductions_in_flight() const { return grad_work_.size(); }

 private:
  void start_bucket(optim::ParamAndGradBuffer& buffer, const optim::GradBucket& bucket);
  // The bucket-ready callback: start_bucket unless the bucket holds a gradient completed after backward.
  void on_bucket_ready(optim::ParamAndGradBuffer& buffer, const optim::GradBucket& bucket);
  // The group buffer b reduces over (the expert-data-parallel one for expert buffers).
  const dist::Communicator& group_of(std::size_t b) const;
  bool expert_buffer(std::size_t b) const { return ep_.has_value() && buffers_.is_expert_buffer(b); }
  // The ranges of the optimizer's shard in buffer b.
  std::vector<optim::ElementRange> shard_of(std::size_t b) const;
  std::vector<Tensor> shard_grads() const;
  // The gradients (this rank's shard of them with the distributed optimizer) the norm counts here:
  // all but the replicated parameters' on tensor-parallel ranks other than 0.
  std::vector<Tensor> counted_grads(const std::vector<Tensor>& params, bool experts) const;
  void reduce_sequence_parallel_grads();
  // The experts' gradients divided by the expert-parallel size (Megatron's expert gradient scaling),
  // times the sequence-parallel size.
  void scale_expert_grads();
  void finish_data_parallel_grad_sync();

  optim::GradBuffers& buffers_;
  dist::Communicator group_;
  DataParallelOptions options_;
  struct Pending {
    dist::Work work;
    Tensor scratch, destination;  // reduce-scatter: the received shard and where it goes
  };
  std::vector<Pending> grad_work_, param_work_;
  std::vector<std::vector<bool>> started_;  // per buffer, per bucket: reduction started this round
  std::optional<TensorParallelGrads> tp_;
  std::unordered_set<const TensorImpl*> replicated_;                // tp_->replicated
  std::unordered_set<const TensorImpl*> completed_after_backward_;  // pp_->completed_after_backward
  std::optional<ExpertParallelGrads> ep_;
  std::unordered_set<const TensorImpl*> expert_params_;  // the expert buffers' parameters
  std::optional<PipelineParallelGrads> pp_;
  std::unordered_set<const TensorImpl*> not_counted_;  // pp_->not_counted
};

// The distributed optimizer as checkpoints see it: state_dict() gathers the shards over the group
// into the non-distributed optimizer's format (whole parameters, no "state.<i>.shard"; collective:
// every rank calls it), load_state_dict() takes that format and keeps this rank's part. So a
// checkpoint is the same whatever the data-parallel size and optimizer that wrote it, and loads
// into any. `state_names`: the optimizer's per-element state besides the masters (AdamW's moments).
class GatheredOptimizerState : public optim::Optimizer {
 public:
  // `expert_group`: with expert parallelism, the group the expert buffers are sharded over.
  GatheredOptimizerState(optim::FlatOptimizer& inner, const dist::Communicator& group,
                         std::vector<std::string> state_names = {"exp_avg", "exp_avg_sq"},
                         std::optional<dist::Communicator> expert_group = std::nullopt);
  void step() override { inner_.step(); }
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

 private:
  optim::FlatOptimizer& inner_;
  dist::Communicator group_;
  std::vector<std::string> state_names_;
  std::optional<dist::Communicator> expert_group_;
};

}  // namespace kiln::train
