#pragma once
// Runs one pipeline rank's part of a training step: the rank's list of actions
// (sim/pipeline_actions.h: 1F1B, Megatron's interleaved 1F1B, or ZB-H1's zero-bubble list) over the
// micro-batches of the
// global batch, with the activations sent to the next virtual stage after each forward and their
// gradients back after each backward (point-to-point over the pipeline group, dist::batch_send_recv
// over MPI between host buffers; on a GPU the tensors are copied to and from the host). Sends are
// posted without waiting (a send never holds up the rank; the buffers live until the step's end),
// receives are waited for where the action needs them; each message's tag names its kind,
// micro-batch and receiving chunk, so messages match whatever order the ranks post them in.
//
// Zero bubble: a micro-batch's backward (B) runs with a weight-gradient store of its own active
// (autograd/weight_grad_store.h): the input gradient goes to the previous stage at once, the linear
// layers' weight gradients wait in the store until the list's W action for that micro-batch runs
// them into the parameters' .grad. Everything else (norms, embeddings, fused ops) gets its gradient
// in B.
//
// The stage is seen through PipelineStageHandle (gpt_pretrain.cpp fills it from a
// models::GptPipelineStage). Each action's start and end are recorded (the timeline that
// --profile-schedule draws and bench/pipeline_bubble measures).
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/sim/pipeline_actions.h"
#include "kiln/tensor/tensor.h"

namespace kiln::train {

struct PipelineStageHandle {
  int chunks = 1;                                    // model chunks on this rank (v)
  std::function<bool(int chunk)> is_first, is_last;  // the first / last virtual stage
  // Chunk `chunk` on `input` (the previous stage's hidden states; undefined on the first virtual
  // stage, which embeds `tokens`): the hidden states, or on the last virtual stage the scalar f32 loss.
  std::function<Tensor(int chunk, const Tensor& input, const Tensor& tokens, const Tensor& labels,
                       const Tensor& loss_mask)>
      forward;
  std::int64_t hidden_size = 0;     // activations between stages are [micro-batch, seq, hidden]
  std::int64_t sequence_split = 1;  // ... [micro-batch, seq / this, hidden] (sequence parallelism: tp)
  // Tied embeddings: the word embeddings (first stage) or their copy (last stage), whose gradients
  // are summed over the embedding group after backward; undefined elsewhere or untied.
  Tensor shared_embedding;
  Tensor tied_copy;            // the last stage's copy: counted in neither the norm nor the checkpoint
  std::string tied_copy_name;  // its name in the stage's state_dict
  // The one-process model: its parameters (name, dim) in order, its dropout modules' names.
  std::vector<std::pair<std::string, std::int64_t>> whole_parameters;
  std::vector<std::string> whole_dropout_names;
};

struct PipelineMicroBatch {
  Tensor tokens, labels, loss_mask;
};

// One action as it ran: seconds on the steady clock (comparable between the processes of one
// machine). The start is taken once its input has arrived: the time before it is idle.
struct TimedPipelineAction {
  sim::PipelineAction action;
  double start = 0, end = 0;
};

class PipelineExecutor {
 public:
  // `group`: the pipeline group (rank r is stage r). `activation_dtype`: the hidden states' dtype
  // (the parameters': bf16 with --bf16).
  // `zero_bubble`: run ZB-H1's list (one model chunk per rank).
  PipelineExecutor(PipelineStageHandle stage, dist::Communicator group, Device device, DType activation_dtype,
                   bool zero_bubble = false);

  const PipelineStageHandle& stage() const { return stage_; }
  const dist::Communicator& group() const { return group_; }

  // One step's forwards and backwards over `batches` (this data-parallel rank's micro-batches), in
  // the schedule's order; each micro-batch's loss enters the gradient scaled by `loss_scale` (1 / m:
  // the gradients add up to the global batch's mean). `before_backward` runs before each backward
  // or weight-gradient action, told whether it is its model chunk's last one of the step (the grad
  // buffers' sync switch: on from there, the chunk's parameters get no later contribution). Returns
  // the sum of the micro-batches' losses (f32 scalar), equal on every rank of the group (sent from
  // the last stage).
  Tensor train_step(const std::vector<PipelineMicroBatch>& batches, double loss_scale,
                    const std::function<void(bool last)>& before_backward = {});
  // Forwards only (evaluation; gradients off): the sum of the micro-batches' losses, on every rank.
  Tensor forward_only(const std::vector<PipelineMicroBatch>& batches);

  // The last train_step's actions as they ran on this rank.
  const std::vector<TimedPipelineAction>& timeline() const { return timeline_; }

 private:
  int previous_rank(int chunk) const;  // the rank of virtual stage chunk p + r - 1
  int next_rank(int chunk) const;
  int previous_chunk(int chunk) const;  // that stage's chunk index on its rank
  int next_chunk(int chunk) const;
  int tag(int kind, int micro_batch, int receiving_chunk) const;
  Tensor receive(int peer, int tag, const std::vector<std::int64_t>& shape);
  void send(const Tensor& t, int peer, int tag);
  void finish_sends();
  Tensor broadcast_loss(Tensor sum);

  PipelineStageHandle stage_;
  dist::Communicator group_;
  Device device_;
  DType dtype_;
  int rank_, size_;
  bool zero_bubble_;
  struct PendingSend;
  std::vector<std::shared_ptr<PendingSend>> sends_;
  std::vector<TimedPipelineAction> timeline_;
};

}  // namespace kiln::train
