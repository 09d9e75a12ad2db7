#pragma once
// Runs one pipeline rank's part of a training step: the rank's list of actions
// (sim/pipeline_actions.h: 1F1B, Megatron's interleaved 1F1B, ZB-H1's zero-bubble list or DualPipe's
// bidirectional one) over the micro-batches of the global batch, with the activations sent to the
// next virtual stage after each forward and their gradients back after each backward
// (point-to-point over the pipeline group, dist::batch_send_recv over MPI between host buffers; on
// a GPU the tensors are copied to and from the host). Sends are posted without waiting (a send never holds up the rank;
// the buffers live until the step's end), receives are waited for where the action needs them; each message's tag names
// its kind, micro-batch and receiving chunk, so messages match whatever order the ranks post them in.
//
// Zero bubble: a micro-batch's backward (B) runs with a weight-gradient store of its own active
// (autograd/weight_grad_store.h): the input gradient goes to the previous stage at once, the linear
// layers' weight gradients wait in the store until the list's W action for that micro-batch runs
// them into the parameters' .grad. Everything else (norms, embeddings, fused ops) gets its gradient
// in B. DualPipe splits its backwards the same way.
//
// DualPipe: chunk 0 is stage r of direction 0 (micro-batches 0 .. m/2 - 1, from rank 0 to rank
// p - 1), chunk 1 stage p - 1 - r of direction 1 (m/2 .. m - 1, from rank p - 1 to rank 0); the
// messages' tags name the chunk, so the two directions' traffic between the same ranks never mixes.
// Each direction's loss is its last stage's (rank p - 1, rank 0); the step's sum adds both.
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
  std::function<bool(int chunk)> is_first, is_last;  // the first / last virtual stage of its direction
  // Chunk `chunk` on `input` (the previous stage's hidden states; undefined on the first virtual
  // stage, which embeds `tokens`): the hidden states, or on the last virtual stage the scalar f32 loss.
  std::function<Tensor(int chunk, const Tensor& input, const Tensor& tokens, const Tensor& labels,
                       const Tensor& loss_mask)>
      forward;
  std::int64_t hidden_size = 0;     // activations between stages are [micro-batch, seq, hidden]
  std::int64_t sequence_split = 1;  // ... [micro-batch, seq / this, hidden] (sequence parallelism: tp)
  // Tied embeddings or MTP: the word embeddings (first stage) or their copy (last stage), whose
  // gradients are summed over the embedding group after backward; undefined elsewhere.
  Tensor shared_embedding;
  Tensor tied_copy;            // the last stage's copy: counted in neither the norm nor the checkpoint
  std::string tied_copy_name;  // its name in the stage's state_dict
  // The one-process model: its parameters (name, dim) in order, its dropout modules' names.
  std::vector<std::pair<std::string, std::int64_t>> whole_parameters;
  std::vector<std::string> whole_dropout_names;
  // Copies of another stage's modules (DualPipe's chunk 1, MTP's embedding on the last stage): their
  // state_dict keys and dropout modules' names, which the checkpoint and the random state take from
  // the original. DualPipe (chunks == 2): chunk 0 is pipeline stage r (of direction 0), chunk 1 a copy of stage
  // p - 1 - r (for direction 1) whose original is rank p - 1 - r's chunk 0. Per chunk its
  // parameters by name, sorted (the same order on both holders of a stage); of chunk 1, the
  // state_dict keys and dropout modules' names, which the checkpoint and the random state take from
  // the original (the copy is left out of the norm, the save and the gathered streams).
  bool dualpipe = false;
  std::vector<std::vector<std::pair<std::string, Tensor>>> chunk_parameters;
  std::vector<std::string> mirror_state_names, mirror_dropout_names;
  // Tied embeddings under DualPipe: ranks 0 and p - 1 both hold the word embeddings (the first stage
  // of one direction) and the output layer's copy of them (the last stage of the other); undefined
  // elsewhere. Their gradients are summed on the rank (dualpipe_grads.h), not over an embedding group.
  Tensor dualpipe_word_embeddings, dualpipe_tied_copy;
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

// Which list a rank runs: 1F1B or interleaved (by the stage's chunks), ZB-H1 (one chunk per rank),
// or DualPipe (two chunks per rank, one per direction; the stage handle's `dualpipe`).
enum class PipelineScheduleKind { OneF1B, ZeroBubble, DualPipe };

class PipelineExecutor {
 public:
  // `group`: the pipeline group (rank r is stage r). `activation_dtype`: the hidden states' dtype
  // (the parameters': bf16 with --bf16).
  PipelineExecutor(PipelineStageHandle stage, dist::Communicator group, Device device, DType activation_dtype,
                   PipelineScheduleKind schedule = PipelineScheduleKind::OneF1B);

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
  // DualPipe: every micro-batch through direction 0 (chunk 0: the stages in order, as 1F1B).
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
  // The loss sums of the step on every rank: the last stage's (DualPipe: both ends', summed).
  Tensor broadcast_loss(Tensor sum, bool both_ends = false);
  bool split_backward() const { return schedule_ != PipelineScheduleKind::OneF1B; }

  PipelineStageHandle stage_;
  dist::Communicator group_;
  Device device_;
  DType dtype_;
  int rank_, size_;
  PipelineScheduleKind schedule_;
  struct PendingSend;
  std::vector<std::shared_ptr<PendingSend>> sends_;
  std::vector<TimedPipelineAction> timeline_;
};

}  // namespace kiln::train
