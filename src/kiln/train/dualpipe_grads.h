#pragma once
// DualPipe's gradient sum (DeepSeek-V3's DualPipe keeps two copies of every pipeline stage): pipeline
// rank r trains stage r for direction 0 (chunk 0) and a copy of stage p - 1 - r for direction 1
// (chunk 1), and rank p - 1 - r the other way round. Each copy's backward gives the gradient of its
// own direction's micro-batches only, so after the step's backwards the two ranks of each pair
// {r, p - 1 - r} all-reduce both stages' gradients (the pair's group, split off the pipeline group):
// each copy then holds the gradient of the whole batch, the one-process gradient, and the identical
// optimizer step keeps the copies bit-identical.
//
// Tied embeddings: ranks 0 and p - 1 each hold the word embeddings (the first stage of one direction)
// and the output layer's copy of them (the last stage of the other); after the pair sum each has
// both stages' totals and sets both to their sum, in the same order on both ranks (no embedding
// group: the two copies of each are already on the rank).
//
//   DualPipeGrads sync(stage, pipeline);   // collective over the pipeline group (splits the pairs)
//   ... the step's backwards; buffers.finish_backward();
//   sync.sum();                            // before the data-parallel reduction (the sums commute)
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/train/pipeline_executor.h"

namespace kiln::train {

class DualPipeGrads {
 public:
  DualPipeGrads(const PipelineStageHandle& stage, const dist::Communicator& pipeline);

  // Collective over the pair: both stages' gradients summed over it (and the tied embeddings').
  void sum();
  // Collective over the pipeline group: the largest absolute difference between any parameter of
  // this pair's copies (0 when bit-identical), the maximum over the pipeline, on every rank.
  double copy_difference() const;

  // Every parameter of both chunks (they all change after backward: none may be reduced over the
  // data-parallel group before sum()).
  std::vector<Tensor> parameters() const;
  // The copies (chunk 1): counted in the gradient norm by their originals.
  std::vector<Tensor> mirror_parameters() const;

 private:
  // Both stages' parameters, the lower stage's first (the same order on both ranks of the pair).
  std::vector<Tensor> by_stage_;
  std::vector<Tensor> mirror_;
  Tensor word_embeddings_, tied_copy_;
  dist::Communicator pipeline_, pair_;
};

}  // namespace kiln::train
