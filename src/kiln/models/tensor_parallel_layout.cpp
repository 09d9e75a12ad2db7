#include "kiln/models/tensor_parallel_layout.h"

#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

TensorParallelSplit split_of(const TensorParallelLayout& layout, const std::string& name) {
  const auto it = layout.find(name);
  return it == layout.end() ? TensorParallelSplit{} : it->second;
}

Shape whole_shape(const Shape& local_shape, const TensorParallelSplit& split, int ranks) {
  Shape s = local_shape;
  if (!split.replicated()) s.at(static_cast<std::size_t>(split.dim)) *= ranks;
  return s;
}

Tensor shard_of(const Tensor& whole, const TensorParallelSplit& split, int rank, int ranks, const std::string& what) {
  if (split.replicated() || ranks == 1) return whole;
  NoGradGuard no_grad;
  const std::int64_t d = split.dim;
  KILN_CHECK(whole.dim() > d, "{}: {} has no dimension {} to split over the tensor-parallel group", what,
             whole.describe(), d);
  const std::int64_t n = whole.size(d), block = n / split.blocks;
  KILN_CHECK(n % (static_cast<std::int64_t>(split.blocks) * ranks) == 0,
             "{}: dimension {} of {} ({}) does not split into {} block(s) over {} tensor-parallel ranks", what, d,
             whole.describe(), n, split.blocks, ranks);
  const std::int64_t part = block / ranks;
  std::vector<Tensor> pieces;
  for (int b = 0; b < split.blocks; ++b) pieces.push_back(whole.narrow(d, b * block + rank * part, part));
  return (pieces.size() == 1 ? pieces[0] : cat(pieces, d)).contiguous().clone();
}

Tensor whole_from_shards(const std::vector<Tensor>& shards, const TensorParallelSplit& split) {
  KILN_CHECK(!shards.empty(), "whole_from_shards: no shards");
  if (split.replicated() || shards.size() == 1) return shards[0];
  NoGradGuard no_grad;
  const std::int64_t d = split.dim, part = shards[0].size(d) / split.blocks;
  std::vector<Tensor> pieces;  // block-major: every rank's slice of block 0, then of block 1, ...
  for (int b = 0; b < split.blocks; ++b)
    for (const Tensor& s : shards) pieces.push_back(s.narrow(d, b * part, part));
  return cat(pieces, d).contiguous();
}

Tensor gather_whole(const Tensor& local, const TensorParallelSplit& split, const dist::Communicator& tp) {
  if (split.replicated() || tp.size() == 1) return local;
  NoGradGuard no_grad;
  const Tensor mine = local.detach().contiguous();
  std::vector<Tensor> shards;
  for (int r = 0; r < tp.size(); ++r) shards.push_back(Tensor::empty(mine.shape(), mine.dtype(), mine.device()));
  dist::all_gather(tp, mine, shards, Stream::current(mine.device())).wait();
  return whole_from_shards(shards, split);
}

}  // namespace kiln::models
