#include "kiln/models/token_dispatcher.h"

#include <numeric>
#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/models/expert_parallel_mappings.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

// An int64 index with every -1 replaced by `none` (the row of zeros appended to the source).
Tensor index_with_zero_row(const Tensor& index, std::int64_t none) {
  std::vector<std::int64_t> v = index.to(Device::cpu()).to_vector<std::int64_t>();
  for (auto& i : v)
    if (i < 0) i = none;
  return Tensor::from_vector(v, {static_cast<std::int64_t>(v.size())}).to(index.device());
}

Tensor with_zero_row(const Tensor& x) { return cat({x, Tensor::zeros({1, x.size(1)}, x.dtype(), x.device())}, 0); }

std::vector<std::int64_t> host_int64(const Tensor& t) { return t.to(Device::cpu()).to_vector<std::int64_t>(); }

}  // namespace

DispatchedTokens LocalTokenDispatcher::dispatch(const Tensor& hidden, const RouterOutput& r) {
  DispatchedTokens out;
  out.offsets = r.plan.offsets;
  out.tokens = fused_ ? te::moe_permute(hidden, r.plan)
                      : index_select(with_zero_row(hidden), 0, index_with_zero_row(r.plan.src_token, hidden.size(0)));
  return out;
}

Tensor LocalTokenDispatcher::combine(const Tensor& expert_output, const RouterOutput& r) {
  const Tensor& probs = r.routing.probs;
  if (fused_) return te::moe_unpermute(expert_output, r.plan, probs);
  const std::int64_t n = r.plan.num_tokens, k = r.plan.topk, h = expert_output.size(1);
  const Tensor rows = index_select(with_zero_row(expert_output), 0,
                                   index_with_zero_row(r.plan.row_of.reshape({n * k}), expert_output.size(0)));
  const Tensor weights =
      (probs.dtype() == expert_output.dtype() ? probs : probs.to(expert_output.dtype())).reshape({n, k, 1});
  return sum(mul(rows.reshape({n, k, h}), weights), {1});
}

// ---- all-to-all -------------------------------------------------------------------------------

AllToAllTokenDispatcher::AllToAllTokenDispatcher(const MoeSpec& spec, const dist::Communicator& ep, bool fused)
    : num_experts_(spec.num_experts), ep_(ep), local_(fused) {}

DispatchedTokens AllToAllTokenDispatcher::dispatch(const Tensor& hidden, const RouterOutput& r) {
  const int ranks = ep_.size(), me = ep_.rank();
  const std::int64_t e_all = num_experts_, e_local = e_all / ranks;
  // 1. The local permute: this rank's tokens in global expert-major order (the plan's rows; those
  //    past offsets[E] are unused). Experts are owned in blocks (rank p: [p E_l, (p + 1) E_l)), so
  //    the rows for rank p are one contiguous block.
  const Tensor permuted = local_.dispatch(hidden, r).tokens;
  const std::vector<std::int64_t> offsets = host_int64(r.plan.offsets);
  plan_rows_ = r.plan.rows;
  used_rows_ = offsets[static_cast<std::size_t>(e_all)];
  const std::vector<std::int64_t> counts = counts_from_offsets(offsets);
  // 2. Every rank's per-expert counts (Megatron exchanges them with an all-to-all; the gather of
  //    E integers per rank is as cheap and gives the receive side its per-expert split too).
  std::vector<std::int64_t> all_counts(static_cast<std::size_t>(e_all * ranks));
  ep_.all_gather<std::int64_t>(counts, all_counts);
  auto count_of = [&](int source, std::int64_t local_expert) {
    return all_counts[static_cast<std::size_t>(source * e_all + me * e_local + local_expert)];
  };
  send_rows_.assign(static_cast<std::size_t>(ranks), 0);
  recv_rows_.assign(static_cast<std::size_t>(ranks), 0);
  for (int p = 0; p < ranks; ++p)
    for (std::int64_t l = 0; l < e_local; ++l) {
      send_rows_[static_cast<std::size_t>(p)] += counts[static_cast<std::size_t>(p * e_local + l)];
      recv_rows_[static_cast<std::size_t>(p)] += count_of(p, l);
    }
  // 3. The rows to their experts' owners; they arrive source-rank-major ([rank p][local expert l]).
  const Tensor received = all_to_all_rows(permuted.narrow(0, 0, used_rows_), send_rows_, recv_rows_, ep_);
  // 4. Sorted into local-expert-major order ([l][p]) for the grouped GEMM (Megatron's
  //    sort_chunks_by_idxs), and the way back for combine.
  std::vector<std::int64_t> received_counts(static_cast<std::size_t>(ranks * e_local));
  for (int p = 0; p < ranks; ++p)
    for (std::int64_t l = 0; l < e_local; ++l)
      received_counts[static_cast<std::size_t>(p * e_local + l)] = count_of(p, l);
  const ExpertMajorOrder sort = expert_major_order(received_counts, ranks, e_local);
  const Device device = hidden.device();
  to_expert_major_ = index_tensor(sort.order, device);
  to_source_major_ = index_tensor(sort.inverse, device);
  DispatchedTokens out;
  out.tokens = reordered(received, to_expert_major_);
  out.offsets = index_tensor(sort.offsets, device);
  return out;
}

Tensor AllToAllTokenDispatcher::combine(const Tensor& expert_output, const RouterOutput& r) {
  // The steps of dispatch backwards: source-rank-major again, each row back to its token's rank (in
  // that rank's expert-major order), the plan's unused rows as zeros, the local un-permute.
  const Tensor back = all_to_all_rows(reordered(expert_output, to_source_major_), recv_rows_, send_rows_, ep_);
  const Tensor rows =
      plan_rows_ > used_rows_
          ? cat({back, Tensor::zeros({plan_rows_ - used_rows_, back.size(1)}, back.dtype(), back.device())}, 0)
          : back;
  return local_.combine(rows, r);
}

// ---- all-gather -------------------------------------------------------------------------------

AllGatherTokenDispatcher::AllGatherTokenDispatcher(const MoeSpec& spec, const dist::Communicator& ep, bool fused)
    : num_experts_(spec.num_experts), ep_(ep), local_(fused) {}

DispatchedTokens AllGatherTokenDispatcher::dispatch(const Tensor& hidden, const RouterOutput& r) {
  const int ranks = ep_.size(), me = ep_.rank();
  const std::int64_t n = hidden.size(0), h = hidden.size(1), k = r.plan.topk;
  const std::int64_t e_local = num_experts_ / ranks, first = me * e_local;
  // Every rank's tokens and probs (differentiable: their backward reduce-scatters the gradients
  // back to the tokens' ranks), and the expert of each kept slot (-1: dropped over capacity, as the
  // token's own rank decided).
  const Tensor tokens = gather_from_sequence_parallel_region(hidden.reshape({1, n, h}), ep_).reshape({ranks * n, h});
  const Tensor probs =
      gather_from_sequence_parallel_region(r.routing.probs.reshape({1, n, k}), ep_).reshape({ranks * n, k});
  std::vector<std::int64_t> kept = host_int64(r.routing.indices);
  const std::vector<std::int64_t> row_of = host_int64(r.plan.row_of);
  for (std::size_t i = 0; i < kept.size(); ++i)
    if (row_of[i] < 0) kept[i] = -1;
  std::vector<std::int64_t> all_kept(kept.size() * static_cast<std::size_t>(ranks));
  ep_.all_gather<std::int64_t>(kept, all_kept);
  // The plan of this rank's experts over the gathered tokens: each local expert's slots in token
  // order (no capacity left to apply, no padding rows: padding only adds zeros).
  std::vector<std::vector<std::int64_t>> slots(static_cast<std::size_t>(e_local));
  for (std::size_t s = 0; s < all_kept.size(); ++s) {
    const std::int64_t e = all_kept[s];
    if (e >= first && e < first + e_local)
      slots[static_cast<std::size_t>(e - first)].push_back(static_cast<std::int64_t>(s));
  }
  std::vector<std::int64_t> src_token, plan_row_of(all_kept.size(), -1), offsets{0};
  for (const auto& expert : slots) {
    for (std::int64_t s : expert) {
      plan_row_of[static_cast<std::size_t>(s)] = static_cast<std::int64_t>(src_token.size());
      src_token.push_back(s / k);
    }
    offsets.push_back(static_cast<std::int64_t>(src_token.size()));
  }
  const Device device = hidden.device();
  RouterOutput g;
  g.routing.probs = probs;
  g.plan.num_tokens = ranks * n;
  g.plan.topk = k;
  g.plan.num_experts = e_local;
  g.plan.rows = static_cast<std::int64_t>(src_token.size());
  g.plan.src_token = index_tensor(src_token, device);
  g.plan.row_of = Tensor::from_vector(plan_row_of, {ranks * n, k}).to(device);
  g.plan.offsets = index_tensor(offsets, device);
  gathered_ = g;
  return local_.dispatch(tokens, g);
}

Tensor AllGatherTokenDispatcher::combine(const Tensor& expert_output, const RouterOutput&) {
  KILN_CHECK(gathered_.has_value(), "AllGatherTokenDispatcher: combine() without a dispatch()");
  // Each gathered token's weighted sum over this rank's experts; the sum over the ranks' experts of
  // the rows of this rank's tokens is the reduce-scatter.
  const Tensor partial = local_.combine(expert_output, *gathered_);
  const std::int64_t all = partial.size(0), h = partial.size(1);
  return reduce_scatter_to_sequence_parallel_region(partial.reshape({1, all, h}), ep_).reshape({all / ep_.size(), h});
}

std::unique_ptr<TokenDispatcher> make_token_dispatcher(const MoeSpec& spec, const LayerContext& context) {
  const int ep = context.expert_parallel_size();
  if (ep == 1) return std::make_unique<LocalTokenDispatcher>(spec.permute_fusion);
  KILN_CHECK(spec.num_experts % ep == 0, "MoE: {} experts do not split over {} expert-parallel ranks", spec.num_experts,
             ep);
  if (spec.dispatcher == MoeTokenDispatcher::AllGather)
    return std::make_unique<AllGatherTokenDispatcher>(spec, context.groups->ep(), spec.permute_fusion);
  return std::make_unique<AllToAllTokenDispatcher>(spec, context.groups->ep(), spec.permute_fusion);
}

}  // namespace kiln::models
