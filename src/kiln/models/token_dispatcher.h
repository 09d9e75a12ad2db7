#pragma once
// Token dispatchers (Megatron-core's MoETokenDispatcher): they move the routed tokens from token
// order to the rows of this rank's experts, expert-major, and back. make_token_dispatcher() picks
// the one for the layer's process groups and --moe-token-dispatcher-type:
//   LocalTokenDispatcher (expert-parallel size 1): the permute / unpermute are local gathers, fused
//   (te::moe_permute / moe_unpermute, --moe-permute-fusion) or through index_select and a sum.
//   AllToAllTokenDispatcher (Megatron's MoEAlltoAllTokenDispatcher, alltoall): the local permute by
//   expert, the per-expert counts exchanged over the expert-parallel group, the rows sent to their
//   experts' owners (all-to-all-v), sorted from source-rank-major into local-expert-major order;
//   combine runs the same steps backwards and un-permutes locally.
//   AllGatherTokenDispatcher (Megatron's MoEAllGatherTokenDispatcher, allgather): every rank's
//   tokens, probs and kept routes are all-gathered over the group, each rank runs its own experts
//   on the rows routed to them, and combine reduce-scatters the weighted outputs back to the
//   tokens' ranks.
// Each rank routes (and drops over capacity) its own tokens, as one process routes the same
// micro-batch, so every dispatcher gives the one-process layer's output and gradients.
#include <memory>
#include <optional>
#include <vector>

#include "kiln/models/moe_router.h"
#include "kiln/models/transformer_context.h"

namespace kiln::models {

struct DispatchedTokens {
  Tensor tokens;   // [R, H] this rank's experts' rows, expert-major
  Tensor offsets;  // [E_local + 1] int64 on the tokens' device
};

class TokenDispatcher {
 public:
  virtual ~TokenDispatcher() = default;
  // hidden [N, H] -> the rows of this rank's experts.
  virtual DispatchedTokens dispatch(const Tensor& hidden, const RouterOutput& routing) = 0;
  // The experts' outputs [R, H] (of the last dispatch) -> [N, H]: each token's rows weighted by its
  // probs and summed.
  virtual Tensor combine(const Tensor& expert_output, const RouterOutput& routing) = 0;
};

class LocalTokenDispatcher : public TokenDispatcher {
 public:
  explicit LocalTokenDispatcher(bool fused) : fused_(fused) {}
  DispatchedTokens dispatch(const Tensor& hidden, const RouterOutput& routing) override;
  Tensor combine(const Tensor& expert_output, const RouterOutput& routing) override;

 private:
  bool fused_;
};

class AllToAllTokenDispatcher : public TokenDispatcher {
 public:
  AllToAllTokenDispatcher(const MoeSpec& spec, const dist::Communicator& ep, bool fused);
  DispatchedTokens dispatch(const Tensor& hidden, const RouterOutput& routing) override;
  Tensor combine(const Tensor& expert_output, const RouterOutput& routing) override;

 private:
  std::int64_t num_experts_;
  dist::Communicator ep_;
  LocalTokenDispatcher local_;
  // Of the last dispatch: rows sent to / received from each rank, the source-major -> expert-major
  // order of the received rows and back, the plan's rows and those used.
  std::vector<std::int64_t> send_rows_, recv_rows_;
  Tensor to_expert_major_, to_source_major_;
  std::int64_t plan_rows_ = 0, used_rows_ = 0;
};

class AllGatherTokenDispatcher : public TokenDispatcher {
 public:
  AllGatherTokenDispatcher(const MoeSpec& spec, const dist::Communicator& ep, bool fused);
  DispatchedTokens dispatch(const Tensor& hidden, const RouterOutput& routing) override;
  Tensor combine(const Tensor& expert_output, const RouterOutput& routing) override;

 private:
  std::int64_t num_experts_;
  dist::Communicator ep_;
  LocalTokenDispatcher local_;
  std::optional<RouterOutput> gathered_;  // of the last dispatch: every rank's tokens routed to this rank's experts
};

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeSpec& spec, const LayerContext& context);

}  // namespace kiln::models
