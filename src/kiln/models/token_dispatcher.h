#pragma once
// Token dispatchers (Megatron-core's MoETokenDispatcher): they move the routed tokens from token
// order to the experts' expert-major rows and back. The interface is written against the process
// groups so that expert parallelism (an all-to-all over the expert-parallel group) is one more
// implementation; make_token_dispatcher() picks the one for the groups, and refuses expert-parallel
// sizes above 1, which have no implementation yet.
//   LocalTokenDispatcher (expert-parallel size 1): the permute / unpermute are local gathers, fused
//   (te::moe_permute / moe_unpermute, --moe-permute-fusion) or through index_select and a sum.
#include <memory>

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
  // The experts' outputs [R, H] -> [N, H]: each token's rows weighted by its probs and summed.
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

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeSpec& spec, const LayerContext& context);

}  // namespace kiln::models
