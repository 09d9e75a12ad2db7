#include "kiln/models/vocab_parallel.h"

#include <vector>

#include "kiln/autograd/functions.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

// Per id: its row in this rank's range (0 where outside, masked) and 1/0 for inside/outside.
struct LocalIds {
  Tensor rows, inside;
};

LocalIds local_ids(const Tensor& ids, std::int64_t vocab, std::int64_t start, std::int64_t count, Device device,
                   const char* call) {
  const std::vector<std::int64_t> all = ids.to(Device::cpu(), DType::I64).contiguous().to_vector<std::int64_t>();
  std::vector<std::int64_t> rows(all.size());
  std::vector<float> inside(all.size());
  for (std::size_t i = 0; i < all.size(); ++i) {
    KILN_CHECK(all[i] >= 0 && all[i] < vocab, "{}: id {} is outside the vocabulary [0, {})", call, all[i], vocab);
    const bool mine = all[i] >= start && all[i] < start + count;
    rows[i] = mine ? all[i] - start : 0;
    inside[i] = mine ? 1.0f : 0.0f;
  }
  return {Tensor::from_vector(rows, ids.shape(), device), Tensor::from_vector(inside, ids.shape(), device)};
}

}  // namespace

std::int64_t vocab_range_start(std::int64_t vocab, int rank, int ranks) {
  KILN_CHECK(vocab % ranks == 0,
             "the vocabulary ({}) is not divisible by --tensor-model-parallel-size ({}): pad it with "
             "--make-vocab-size-divisible-by",
             vocab, ranks);
  return vocab / ranks * rank;
}

Tensor vocab_parallel_embedding_partial(const Tensor& local_weight, const Tensor& tokens, std::int64_t vocab,
                                        const dist::Communicator& tp) {
  const std::int64_t count = local_weight.size(0), start = vocab_range_start(vocab, tp.rank(), tp.size());
  KILN_CHECK(count * tp.size() == vocab,
             "vocab_parallel_embedding: {} rows per rank x {} ranks is not the vocabulary {}", count, tp.size(), vocab);
  if (tp.size() == 1) return embedding(local_weight, tokens);
  const LocalIds ids = local_ids(tokens, vocab, start, count, local_weight.device(), "vocab_parallel_embedding");
  Shape mask_shape = tokens.shape();
  mask_shape.push_back(1);
  return mul(embedding(local_weight, ids.rows), ids.inside.to(local_weight.dtype()).reshape(mask_shape));
}

Tensor vocab_parallel_embedding(const Tensor& local_weight, const Tensor& tokens, std::int64_t vocab,
                                const dist::Communicator& tp) {
  Tensor partial = vocab_parallel_embedding_partial(local_weight, tokens, vocab, tp);
  return tp.size() == 1 ? partial : reduce_from_tensor_parallel_region(partial, tp);
}

Tensor vocab_parallel_cross_entropy(const Tensor& local_logits, const Tensor& labels, std::int64_t vocab,
                                    const dist::Communicator& tp) {
  if (tp.size() == 1) {
    KILN_CHECK(local_logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == local_logits.size(0) &&
                   local_logits.size(1) == vocab,
               "vocab_parallel_cross_entropy: logits {} and labels {} must be [N, {}] and [N]", local_logits.describe(),
               labels.describe(), vocab);
    return cross_entropy(local_logits, labels);
  }
  return mean(vocab_parallel_cross_entropy_per_token(local_logits, labels, vocab, tp));
}

Tensor vocab_parallel_cross_entropy_per_token(const Tensor& local_logits, const Tensor& labels, std::int64_t vocab,
                                              const dist::Communicator& tp) {
  KILN_CHECK(local_logits.dim() == 2 && labels.dim() == 1 && labels.size(0) == local_logits.size(0),
             "vocab_parallel_cross_entropy: logits {} and labels {} must be [N, V/tp] and [N]", local_logits.describe(),
             labels.describe());
  const std::int64_t n = local_logits.size(0), count = local_logits.size(1);
  const std::int64_t start = vocab_range_start(vocab, tp.rank(), tp.size());
  KILN_CHECK(count * tp.size() == vocab,
             "vocab_parallel_cross_entropy: {} logits per rank x {} ranks is not the vocabulary {}", count, tp.size(),
             vocab);
  // The shift for a stable exp: the group's maximum per token (a constant: no gradient through it).
  Tensor shift;
  {
    NoGradGuard no_grad;
    shift = amax(local_logits.detach(), {1}, /*keepdim=*/true).contiguous();
    dist::all_reduce(tp, shift, dist::ReduceOp::Max).wait();
  }
  Tensor shifted = sub(local_logits, shift);
  Tensor sum_exp = reduce_from_tensor_parallel_region(sum(exp(shifted), {1}), tp);  // [N]
  const LocalIds ids = local_ids(labels, vocab, start, count, local_logits.device(), "vocab_parallel_cross_entropy");
  Tensor label_logit = mul(gather(shifted, 1, ids.rows.reshape({n, 1})).reshape({n}), ids.inside);
  label_logit = reduce_from_tensor_parallel_region(label_logit, tp);  // the one rank that holds it
  return sub(log(sum_exp), label_logit);
}

}  // namespace kiln::models
