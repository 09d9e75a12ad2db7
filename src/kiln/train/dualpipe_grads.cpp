#include "kiln/train/dualpipe_grads.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kiln/autograd/functions.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::train {

namespace {

// The tensors as one flat f32 tensor, in order (one collective instead of one per parameter).
Tensor flatten_all(const std::vector<Tensor>& tensors) {
  std::vector<Tensor> flat;
  flat.reserve(tensors.size());
  for (const Tensor& t : tensors) flat.push_back(t.detach().to(DType::F32).reshape({t.numel()}));
  return cat(flat, 0).contiguous();
}

}  // namespace

DualPipeGrads::DualPipeGrads(const PipelineStageHandle& stage, const dist::Communicator& pipeline)
    : pipeline_(pipeline),
      pair_(pipeline.split(std::min(pipeline.rank(), pipeline.size() - 1 - pipeline.rank()), pipeline.rank())) {
  const int r = pipeline.rank(), p = pipeline.size();
  KILN_CHECK(stage.dualpipe && stage.chunks == 2 && stage.chunk_parameters.size() == 2,
             "DualPipe gradients: the stage handle holds no DualPipe stage (two chunks, one per direction)");
  KILN_CHECK(p % 2 == 0, "--pipeline-schedule dualpipe needs an even --pipeline-model-parallel-size, got {}", p);
  // Stage r is chunk 0 here and chunk 1 on rank p - 1 - r: the lower stage first on both ranks.
  const std::size_t lower = r < p - 1 - r ? 0 : 1;
  for (std::size_t c : {lower, 1 - lower})
    for (const auto& [name, t] : stage.chunk_parameters[c]) by_stage_.push_back(t);
  for (const auto& [name, t] : stage.chunk_parameters[1]) mirror_.push_back(t);
  word_embeddings_ = stage.dualpipe_word_embeddings;
  tied_copy_ = stage.dualpipe_tied_copy;
  KILN_CHECK(word_embeddings_.defined() == tied_copy_.defined(),
             "DualPipe gradients: tied embeddings need both the word embeddings and their copy on the rank");
}

void DualPipeGrads::sum() {
  NoGradGuard no_grad;
  std::vector<Tensor> grads;
  grads.reserve(by_stage_.size());
  for (const Tensor& t : by_stage_) {
    const Tensor g = t.grad();
    KILN_CHECK(g.defined(), "DualPipe gradients: a parameter of the stage has no gradient buffer");
    grads.push_back(g);
  }
  if (!grads.empty()) {
    const Tensor flat = flatten_all(grads);
    dist::all_reduce(pair_, flat).wait();
    std::int64_t at = 0;
    for (Tensor& g : grads) {
      g.copy_(flat.narrow(0, at, g.numel()).reshape(g.shape()));
      at += g.numel();
    }
  }
  if (word_embeddings_.defined()) {
    // Both stages' totals are on this rank now: the tied weight's gradient is their sum, the same
    // expression (first stage's + last stage's) on both ranks of the pair, so the same bits.
    Tensor word = word_embeddings_.grad(), copy = tied_copy_.grad();
    const Tensor total = word + copy;
    word.copy_(total);
    copy.copy_(total);
  }
}

double DualPipeGrads::copy_difference() const {
  NoGradGuard no_grad;
  double worst = 0;
  if (!by_stage_.empty()) {
    const Tensor flat = flatten_all(by_stage_);
    Tensor high = flat.clone(), low = flat.clone();
    dist::all_reduce(pair_, high, dist::ReduceOp::Max).wait();
    dist::all_reduce(pair_, low, dist::ReduceOp::Min).wait();
    const Tensor spread = (high - low).to(Device::cpu()).contiguous();
    const float* d = spread.data<float>();
    for (std::int64_t i = 0; i < spread.numel(); ++i)
      worst = std::max(worst, std::isnan(d[i]) ? std::numeric_limits<double>::infinity() : static_cast<double>(d[i]));
  }
  return pipeline_.all_reduce_value(worst, dist::ReduceOp::Max);
}

std::vector<Tensor> DualPipeGrads::parameters() const { return by_stage_; }

std::vector<Tensor> DualPipeGrads::mirror_parameters() const { return mirror_; }

}  // namespace kiln::train
