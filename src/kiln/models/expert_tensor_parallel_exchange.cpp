#include "kiln/models/expert_tensor_parallel_exchange.h"

#include "kiln/autograd/functions.h"
#include "kiln/models/expert_parallel_mappings.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

ExpertTensorParallelExchange::ExpertTensorParallelExchange(const dist::Communicator& group) : group_(group) {}

DispatchedTokens ExpertTensorParallelExchange::gather(const DispatchedTokens& rows) {
  const int ranks = group_.size();
  const std::vector<std::int64_t> offsets = rows.offsets.to(Device::cpu()).to_vector<std::int64_t>();
  KILN_CHECK(!offsets.empty() && rows.tokens.dim() == 2, "expert tensor parallelism: rows {} with {} offsets",
             rows.tokens.describe(), offsets.size());
  const std::int64_t experts = static_cast<std::int64_t>(offsets.size()) - 1;
  used_rows_ = offsets.back();
  all_rows_ = rows.tokens.size(0);
  // Every rank's rows per local expert (the same experts on every rank of the group).
  const std::vector<std::int64_t> counts = counts_from_offsets(offsets);
  std::vector<std::int64_t> all_counts(static_cast<std::size_t>(experts * ranks));
  group_.all_gather<std::int64_t>(counts, all_counts);
  auto count_of = [&](int rank, std::int64_t e) { return all_counts[static_cast<std::size_t>(rank * experts + e)]; };
  used_of_rank_.assign(static_cast<std::size_t>(ranks), 0);
  for (int p = 0; p < ranks; ++p)
    for (std::int64_t e = 0; e < experts; ++e) used_of_rank_[static_cast<std::size_t>(p)] += count_of(p, e);
  // The all-gather as an all-to-all: this rank's used rows sent to every rank of the group (its
  // backward sums the gradients of the copies: the reduce-scatter).
  const Tensor used = rows.tokens.narrow(0, 0, used_rows_);
  const Tensor copies = ranks == 1 ? used : cat(std::vector<Tensor>(static_cast<std::size_t>(ranks), used), 0);
  const Tensor received = all_to_all_rows(
      copies, std::vector<std::int64_t>(static_cast<std::size_t>(ranks), used_rows_), used_of_rank_, group_);
  // Rank-major ([p][e]) -> expert-major ([e][p]) for the grouped GEMM, and the way back.
  const ExpertMajorOrder sort = expert_major_order(all_counts, ranks, experts);
  const Device device = rows.tokens.device();
  to_expert_major_ = index_tensor(sort.order, device);
  to_rank_major_ = index_tensor(sort.inverse, device);
  DispatchedTokens out;
  out.tokens = reordered(received, to_expert_major_);
  out.offsets = index_tensor(sort.offsets, device);
  return out;
}

Tensor ExpertTensorParallelExchange::scatter(const Tensor& partial) {
  const int ranks = group_.size();
  // Rank-major again, each rank's rows sent back to it from every rank of the group, the partial
  // sums added (the reduce-scatter; its backward sends each rank's gradient to every rank: the gather).
  const Tensor back = all_to_all_rows(reordered(partial, to_rank_major_), used_of_rank_,
                                      std::vector<std::int64_t>(static_cast<std::size_t>(ranks), used_rows_), group_);
  const std::int64_t h = partial.size(1);
  Tensor mine = ranks == 1 ? back : sum(back.reshape({ranks, used_rows_, h}), {0});
  if (all_rows_ > used_rows_)
    mine = cat({mine, Tensor::zeros({all_rows_ - used_rows_, h}, mine.dtype(), mine.device())}, 0);
  return mine;
}

}  // namespace kiln::models
