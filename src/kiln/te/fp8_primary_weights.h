#pragma once
// --fp8-param-gather (Megatron-LM's --fp8-param-gather, TransformerEngine's FP8 primary weights and
// cast_master_weights_to_fp8): a model's FP8 linears keep their weights in FP8 only. Built from the
// model's FP8 linears, this turns each weight parameter into fp8 bytes (te/fp8_primary_weight.h) and,
// after every optimizer step, casts the optimizer's fp32 masters straight into those bytes (no
// 16-bit intermediate). With the distributed optimizer each process holds the masters of its shard
// of the flat buffers only, which may cut a weight anywhere (even inside a 128x128 block), so the
// cast runs in two halves around one all-reduce:
//   1. each process measures the amaxes of its pieces (per tensor, or per 128x128 block; a piece
//      contributes to the blocks it touches) into one flat f32 vector over all weights (delayed:
//      into each weight's amax history, entry 0, reduced as te/fp8_amax_reduction.h reduces them);
//   2. one max all-reduce of that vector over the data-parallel group: every process now holds the
//      whole weights' amaxes, so every process computes the same scales; under tensor parallelism
//      (the linears' amax_group) per-tensor amaxes are max-reduced over that group too, so a split
//      weight's scale is the whole weight's (a 128x128 block never straddles two ranks);
//   3. the scales, per recipe (one launch for all weights):
//      - tensorwise: fp8_max / amax (TE's current scaling, the cast kernels' own arithmetic);
//      - blockwise:  each block's fp8_max / amax rounded down to a power of two;
//      - delayed:    the amax is recorded into the weight's history (entry 0) and the delayed
//                    update runs for all weights in one launch; the new scale casts. (TE casts with
//                    the scale of the previous update and updates afterwards; casting with the
//                    updated scale makes the bytes a function of the master and the saved scaling
//                    state, so a resumed run recasts exactly the bytes it saved with.)
//   4. each process casts its pieces into its part of the fp8 parameter buffer; the caller then
//      all-gathers the buffer (1 byte a weight, half of bf16's).
// The result is bit for bit the cast of the whole fp32 master (ops::fp8_quantize_into with those
// scales). The scale tensors of all weights are views of one arena, so step 3 is one launch.
#include <memory>
#include <optional>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/optim/flat_optimizer.h"
#include "kiln/te/fp8_linear.h"
#include "kiln/te/fp8_primary_weight.h"

namespace kiln::te {

class Fp8PrimaryWeights {
 public:
  // An FP8 linear: its weight parameter (f32 or bf16 [out, in], contiguous, not yet in a gradient
  // buffer) and its state, whose primary_weight this sets.
  struct Linear {
    Tensor weight;
    Fp8LinearState* state = nullptr;
  };
  // Converts every weight to FP8 in place (the parameter handles now hold fp8 bytes; the same
  // TensorImpls, so modules and parameter lists follow): the weight's value is cast as a master
  // would be (step 3 above; delayed: the amax recorded and the scale updated first). The values
  // they had are kept for take_initial_values(). Refuses the mxfp8 recipe and 1x128 layouts.
  Fp8PrimaryWeights(const std::vector<Linear>& linears, const Fp8Recipe& recipe);

  std::size_t size() const { return weights_.size(); }
  const Tensor& weight(std::size_t i) const { return weights_.at(i).param; }
  const Fp8PrimaryWeight& primary(std::size_t i) const { return *weights_.at(i).primary; }
  // The values the weights had before the conversion, in weight order (the optimizer's masters
  // start from these: FlatOptimizer::set_master), then released (the memory --fp8-param-gather saves).
  std::vector<Tensor> take_initial_values();

  // Casts the masters (FlatOptimizer::fp8_master_pieces()) into the weights' bytes (steps 1-4 above).
  // `shard_group`: the group whose processes hold the other pieces (the distributed optimizer's
  // data-parallel group), or null when every process holds whole masters. Collective over it.
  // `record_delayed_amax`: false to recast with the scaling state as it is (after a checkpoint or
  // rewind restored the masters and the state: the bytes the run had).
  void cast_masters(const std::vector<optim::FlatOptimizer::MasterPiece>& pieces, const dist::Communicator* shard_group,
                    bool record_delayed_amax);

 private:
  struct Weight {
    Tensor param;
    std::shared_ptr<Fp8PrimaryWeight> primary;
    std::int64_t offset = 0, entries = 0;  // its scale entries in the arena
  };
  std::size_t index_of(const Tensor& param) const;

  Fp8Recipe recipe_;
  ScalingLayout layout_ = ScalingLayout::PerTensor;
  std::optional<dist::Communicator> amax_group_;  // the linears' (tensor x context parallel), if any
  std::vector<Weight> weights_;
  std::vector<Tensor> initial_values_;
  // amax: one entry per scale entry of every weight; scales: a cast of that vector as [N, 1] in
  // 1x128 tiles (one tile a row), whose scale / scale_inv are the per-entry scales (tensorwise and
  // blockwise; the weights' scale tensors are views of them).
  Tensor amax_;
  Fp8Tensor scales_;
};

}  // namespace kiln::te
