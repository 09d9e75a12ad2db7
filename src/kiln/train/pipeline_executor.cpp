#include "kiln/train/pipeline_executor.h"

#include <chrono>

#include "kiln/autograd/functions.h"
#include "kiln/autograd/weight_grad_store.h"
#include "kiln/dist/work.h"
#include "kiln/runtime/error.h"
#include "kiln/runtime/stream.h"
#include "kiln/sim/pipeline_schedule.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::train {

namespace {

constexpr int kActivation = 0, kGradient = 1;
// MPI guarantees tags up to 32767 (MPI_TAG_UB may be larger, never smaller).
constexpr int kMaxTag = 32767;

using Clock = std::chrono::steady_clock;

}  // namespace

struct PipelineExecutor::PendingSend {
  dist::Work work;
  Tensor tensor;  // kept alive until the send is done
};

PipelineExecutor::PipelineExecutor(PipelineStageHandle stage, dist::Communicator group, Device device,
                                   DType activation_dtype, PipelineScheduleKind schedule)
    : stage_(std::move(stage)),
      group_(std::move(group)),
      device_(device),
      dtype_(activation_dtype),
      rank_(group_.rank()),
      size_(group_.size()),
      schedule_(schedule) {
  KILN_CHECK(stage_.chunks >= 1 && stage_.forward && stage_.is_first && stage_.is_last && stage_.hidden_size > 0,
             "pipeline executor: an incomplete stage handle");
  KILN_CHECK(schedule_ != PipelineScheduleKind::ZeroBubble || stage_.chunks == 1,
             "--pipeline-schedule zero-bubble runs one model chunk per rank: drop "
             "--num-layers-per-virtual-pipeline-stage ({} chunks per rank)",
             stage_.chunks);
  KILN_CHECK(schedule_ != PipelineScheduleKind::DualPipe || (stage_.dualpipe && stage_.chunks == 2),
             "--pipeline-schedule dualpipe needs the stage built for it (two chunks per rank, one per direction)");
}

// Direction 1 (DualPipe's chunk 1) runs from rank p - 1 down to rank 0, staying in its chunk.
int PipelineExecutor::previous_rank(int chunk) const {
  const int step = schedule_ == PipelineScheduleKind::DualPipe && chunk == 1 ? -1 : 1;
  return (rank_ - step + size_) % size_;
}
int PipelineExecutor::next_rank(int chunk) const {
  const int step = schedule_ == PipelineScheduleKind::DualPipe && chunk == 1 ? -1 : 1;
  return (rank_ + step + size_) % size_;
}
int PipelineExecutor::previous_chunk(int chunk) const {
  if (schedule_ == PipelineScheduleKind::DualPipe) return chunk;
  return rank_ == 0 ? chunk - 1 : chunk;
}
int PipelineExecutor::next_chunk(int chunk) const {
  if (schedule_ == PipelineScheduleKind::DualPipe) return chunk;
  return rank_ == size_ - 1 ? chunk + 1 : chunk;
}

int PipelineExecutor::tag(int kind, int micro_batch, int receiving_chunk) const {
  const int t = (micro_batch * stage_.chunks + receiving_chunk) * 2 + kind;
  KILN_CHECK(t <= kMaxTag,
             "pipeline: {} micro-batches x {} model chunks per step are more than the point-to-point tags can name "
             "(at most {} micro-batch-chunks): raise --micro-batch-size or lower --global-batch-size",
             micro_batch + 1, stage_.chunks, kMaxTag / 2);
  return t;
}

// The messages travel between host buffers over MPI, matched by tag, whatever the device: an NCCL
// send holds its stream until the peer posts the receive, which in a 1F1B steady state (each rank
// sending its activation while its neighbour sends a gradient back) deadlocks unless the two are
// batched as Megatron's send_forward_recv_backward; this executor's sends never wait instead.
Tensor PipelineExecutor::receive(int peer, int t, const std::vector<std::int64_t>& shape) {
  Tensor buffer = Tensor::empty(shape, dtype_, Device::cpu());
  const dist::TensorPointToPoint op = dist::TensorPointToPoint::recv(buffer, peer, t);
  dist::batch_send_recv(group_, std::span<const dist::TensorPointToPoint>(&op, 1), Stream::current(Device::cpu()))
      .wait();
  return device_.is_cpu() ? buffer : buffer.to(device_);
}

void PipelineExecutor::send(const Tensor& t, int peer, int message_tag) {
  auto pending = std::make_shared<PendingSend>();
  pending->tensor = t.detach().to(dtype_).to(Device::cpu()).contiguous();
  const dist::TensorPointToPoint op = dist::TensorPointToPoint::send(pending->tensor, peer, message_tag);
  pending->work =
      dist::batch_send_recv(group_, std::span<const dist::TensorPointToPoint>(&op, 1), Stream::current(Device::cpu()));
  sends_.push_back(std::move(pending));
}

void PipelineExecutor::finish_sends() {
  for (auto& s : sends_) s->work.wait();
  sends_.clear();
}

Tensor PipelineExecutor::broadcast_loss(Tensor sum, bool both_ends) {
  // The last stage computed the losses; every rank of the group gets them (rank 0 logs). DualPipe:
  // rank p - 1 holds direction 0's, rank 0 direction 1's, the others zero: their sum.
  if (both_ends)
    dist::all_reduce(group_, sum).wait();
  else
    dist::broadcast(group_, sum, size_ - 1).wait();
  return sum;
}

Tensor PipelineExecutor::train_step(const std::vector<PipelineMicroBatch>& batches, double loss_scale,
                                    const std::function<void(bool last)>& before_backward) {
  const int m = static_cast<int>(batches.size()), v = stage_.chunks;
  const std::vector<sim::PipelineAction> actions =
      schedule_ == PipelineScheduleKind::ZeroBubble ? sim::zero_bubble_actions(rank_, size_, m)
      : schedule_ == PipelineScheduleKind::DualPipe ? sim::dualpipe_actions(rank_, size_, m)
                                                    : sim::pipeline_actions(rank_, size_, m, v);
  // Per model chunk, its last backward or weight-gradient action: after it none of the chunk's
  // parameters gets another contribution this step, so the gradient buffers may count them ready
  // (and with --overlap-grad-reduce reduce their buckets) from there on (Megatron enables its DDP
  // hooks on each chunk's last micro-batch).
  std::vector<std::size_t> last_of_chunk(static_cast<std::size_t>(v), actions.size());
  for (std::size_t i = 0; i < actions.size(); ++i)
    if (actions[i].kind != sim::ActionKind::Forward) last_of_chunk[static_cast<std::size_t>(actions[i].chunk)] = i;
  std::vector<Tensor> inputs(static_cast<std::size_t>(m * v)), outputs(static_cast<std::size_t>(m * v));
  // Zero bubble and DualPipe: each micro-batch's deferred weight gradients, from its B to its W.
  std::vector<autograd::WeightGradStore> weight_grads(split_backward() ? static_cast<std::size_t>(m * v) : 0);
  Tensor loss_sum = Tensor::zeros({}, DType::F32, device_);
  timeline_.clear();
  // The steady clock's own origin: the same on every process of one machine, so the ranks' timelines
  // line up (pipeline_timeline_plot.h).
  auto seconds = [] { return std::chrono::duration<double>(Clock::now().time_since_epoch()).count(); };
  for (std::size_t i = 0; i < actions.size(); ++i) {
    const sim::PipelineAction& a = actions[i];
    const PipelineMicroBatch& b = batches[static_cast<std::size_t>(a.micro_batch)];
    const std::vector<std::int64_t> shape = {b.tokens.size(0), b.tokens.size(1) / stage_.sequence_split,
                                             stage_.hidden_size};
    const auto slot = static_cast<std::size_t>(a.micro_batch * v + a.chunk);
    if (a.kind == sim::ActionKind::Forward) {
      Tensor input;
      if (!stage_.is_first(a.chunk)) {
        input = receive(previous_rank(a.chunk), tag(kActivation, a.micro_batch, a.chunk), shape);
        input.requires_grad_(true);
      }
      const double start = seconds();
      Tensor out = stage_.forward(a.chunk, input, b.tokens, b.labels, b.loss_mask);
      if (stage_.is_last(a.chunk)) {
        NoGradGuard no_grad;
        loss_sum.add_(out.detach().to(DType::F32));
      } else {
        send(out, next_rank(a.chunk), tag(kActivation, a.micro_batch, next_chunk(a.chunk)));
      }
      inputs[slot] = input;
      outputs[slot] = out;
      timeline_.push_back({a, start, seconds()});
    } else if (a.kind == sim::ActionKind::BackwardWeight) {
      const double start = seconds();
      if (before_backward) before_backward(i == last_of_chunk[static_cast<std::size_t>(a.chunk)]);
      weight_grads[slot].flush();
      timeline_.push_back({a, start, seconds()});
    } else {
      Tensor grad;
      if (!stage_.is_last(a.chunk)) grad = receive(next_rank(a.chunk), tag(kGradient, a.micro_batch, a.chunk), shape);
      const double start = seconds();
      if (before_backward) before_backward(i == last_of_chunk[static_cast<std::size_t>(a.chunk)]);
      {
        // Zero bubble, DualPipe: the linear layers' weight gradients wait for this micro-batch's W.
        autograd::WeightGradStoreScope defer(split_backward() ? &weight_grads[slot] : nullptr);
        if (stage_.is_last(a.chunk)) {
          (loss_scale != 1.0 ? outputs[slot] * loss_scale : outputs[slot]).backward();
        } else {
          outputs[slot].backward(grad);
        }
      }
      if (!stage_.is_first(a.chunk)) {
        const Tensor input_grad = inputs[slot].grad();
        KILN_CHECK(input_grad.defined(), "pipeline: chunk {}'s input got no gradient (micro-batch {})", a.chunk,
                   a.micro_batch);
        send(input_grad, previous_rank(a.chunk), tag(kGradient, a.micro_batch, previous_chunk(a.chunk)));
      }
      inputs[slot] = Tensor();  // the activations of this micro-batch's chunk are done with
      outputs[slot] = Tensor();
      timeline_.push_back({a, start, seconds()});
    }
  }
  finish_sends();
  for (const autograd::WeightGradStore& store : weight_grads)
    KILN_CHECK(store.empty(),
               "pipeline: a micro-batch's weight gradients were never run (a bug in the schedule's list)");
  return broadcast_loss(loss_sum, schedule_ == PipelineScheduleKind::DualPipe);
}

Tensor PipelineExecutor::forward_only(const std::vector<PipelineMicroBatch>& batches) {
  NoGradGuard no_grad;
  Tensor loss_sum = Tensor::zeros({}, DType::F32, device_);
  const int m = static_cast<int>(batches.size());
  // Micro-batch by micro-batch, each through the rank's chunks in order: the order every stage's
  // inputs arrive in (sends never wait, so no rank holds up another).
  for (int mb = 0; mb < m; ++mb) {
    const PipelineMicroBatch& b = batches[static_cast<std::size_t>(mb)];
    const std::vector<std::int64_t> shape = {b.tokens.size(0), b.tokens.size(1) / stage_.sequence_split,
                                             stage_.hidden_size};
    // DualPipe: direction 0 alone (its chunk 0 is stage r: the whole model in order over the ranks).
    const int chunks = schedule_ == PipelineScheduleKind::DualPipe ? 1 : stage_.chunks;
    for (int c = 0; c < chunks; ++c) {
      Tensor input;
      if (!stage_.is_first(c)) input = receive(previous_rank(c), tag(kActivation, mb, c), shape);
      Tensor out = stage_.forward(c, input, b.tokens, b.labels, b.loss_mask);
      if (stage_.is_last(c))
        loss_sum.add_(out.to(DType::F32));
      else
        send(out, next_rank(c), tag(kActivation, mb, next_chunk(c)));
    }
    finish_sends();
  }
  return broadcast_loss(loss_sum);
}

}  // namespace kiln::train
