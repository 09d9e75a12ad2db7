#pragma once
// A model's gradient buffers (one ParamAndGradBuffer per parameter dtype, as Megatron-core's
// DistributedDataParallel keeps them) and bucket-ready notification: each parameter gets a
// grad-ready hook (autograd/grad_ready_hook.h); when every parameter of a bucket has its
// gradient for this backward, the bucket-ready callback runs, while backward goes on, so data
// parallelism can start that bucket's all-reduce or reduce-scatter right away.
//
//   optim::GradBuffers grads(model.parameters(), {.bucket_size = 1 << 20, .shard_count = dp});
//   grads.set_bucket_ready_callback([&](ParamAndGradBuffer& buf, const GradBucket& b) { start_reduce(b); });
//   for (micro-batch m) {
//     grads.set_grad_sync_enabled(m == last);    // no notifications while accumulating
//     loss(m).backward();                        // gradients add up in place in the buffers
//   }
//   grads.finish_backward();                     // notifies the buckets still pending
//
// Build the buffers after the model is on its device and before the optimizer. Parameters keep
// their order (params()); the buffers lay them out in reverse.
#include <functional>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kiln/autograd/grad_ready_hook.h"
#include "kiln/optim/param_and_grad_buffer.h"

namespace kiln::optim {

class GradBuffers {
 public:
  using BucketReadyCallback = std::function<void(ParamAndGradBuffer& buffer, const GradBucket& bucket)>;

  // Parameters are grouped by dtype (in order of first appearance); a parameter listed twice is
  // an error.
  explicit GradBuffers(const std::vector<Tensor>& params, GradBufferOptions options = {});
  // Expert parallelism (Megatron's expert-parallel buffers): the parameters in `expert_params` (a
  // subset of `params`) get buffers of their own, built with `expert_options` (its shard_count: the
  // expert-data-parallel size), since their gradients reduce over another group.
  GradBuffers(const std::vector<Tensor>& params, GradBufferOptions options, const std::vector<Tensor>& expert_params,
              GradBufferOptions expert_options);
  GradBuffers(const GradBuffers&) = delete;
  GradBuffers& operator=(const GradBuffers&) = delete;

  std::size_t size() const { return buffers_.size(); }
  // Whether buffer i holds expert parameters (the second constructor's).
  bool is_expert_buffer(std::size_t i) const { return expert_.at(i); }
  ParamAndGradBuffer& buffer(std::size_t i) { return *buffers_.at(i); }
  const ParamAndGradBuffer& buffer(std::size_t i) const { return *buffers_.at(i); }
  const std::vector<Tensor>& params() const { return params_; }  // in the order given
  // Each buffer's whole flat gradient (1-D, padding included, which holds zeros): what an operation
  // over every gradient (clipping's scale) runs on in one launch per buffer instead of one per parameter.
  std::vector<Tensor> flat_grads() const;
  struct Location {
    std::size_t buffer, index;  // buffer(buffer).params()[index]
  };
  std::optional<Location> locate(const Tensor& param) const;

  // Zeroes every gradient buffer and forgets the readiness of the current backward.
  void zero_grad();
  // Off: grad-ready hooks count nothing and no bucket is notified (micro-batches before the
  // last, as Megatron's no_sync()). On by default.
  void set_grad_sync_enabled(bool on) { sync_enabled_ = on; }
  bool grad_sync_enabled() const { return sync_enabled_; }
  void set_bucket_ready_callback(BucketReadyCallback callback) { callback_ = std::move(callback); }
  // Notifies the buckets not yet notified in this backward (those holding a parameter that got
  // no gradient), in layout order, then starts the next round. Does nothing with sync off.
  void finish_backward();
  // A parameter that may get several gradients in one round (pipeline parallelism's copy of the
  // embedding on the last stage under a split backward: part in B, part in W): its grad-ready hook
  // counts nothing, and its bucket is complete at finish_backward(). Does nothing for a parameter
  // not in the buffers.
  void complete_at_finish(const Tensor& param);
  // How many buckets were notified since the last finish_backward()/zero_grad().
  std::size_t buckets_notified() const;

  // Every buffer's shard for rank `rank` of `count` (ParamAndGradBuffer::shard_ranges), indexed
  // like the buffers: the seam a distributed optimizer takes.
  std::vector<std::vector<ElementRange>> shard(int rank, int count) const;
  void check_views(const char* caller) const;

 private:
  void on_grad_ready(std::size_t buffer, std::size_t index);
  void notify(std::size_t buffer, std::size_t bucket);
  void reset_round();

  std::vector<Tensor> params_;
  std::vector<std::unique_ptr<ParamAndGradBuffer>> buffers_;
  std::vector<bool> expert_;  // per buffer
  std::unordered_map<const TensorImpl*, Location> where_;
  std::vector<autograd::GradReadyHookHandle> hooks_;
  // Per buffer: per bucket, how many parameters are ready and whether it was notified; per
  // parameter, whether its gradient arrived in this round.
  std::vector<std::vector<std::size_t>> ready_count_;
  std::vector<std::vector<bool>> notified_;
  std::vector<std::vector<bool>> param_ready_;
  std::vector<std::vector<bool>> complete_at_finish_;  // per buffer and parameter (complete_at_finish)
  bool sync_enabled_ = true;
  BucketReadyCallback callback_;
};

}  // namespace kiln::optim
