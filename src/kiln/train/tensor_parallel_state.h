#pragma once
// Checkpoints of a tensor-parallel model in the one-process format (whole tensors, the names of one
// process), so that a checkpoint loads at any tensor-parallel size, into one process (export-hf,
// generate) and back. Saving gathers each rank's shards over the tensor-parallel group into whole
// tensors (collective: every rank of the group calls it, rank 0 of the run writes); loading takes
// the whole tensors and keeps this rank's slices (no communication: every rank reads the files).
// The split of each tensor comes from the model's models::TensorParallelLayout.
//
//   TensorParallelState tp_state(model, layout, tp);
//   ModelStateLayout view = tp_state.model_state_layout();          // for gpt_checkpoint.h
//   TensorParallelOptimizerState optimizer_view(inner, tp_state);   // the optimizer's state alike
#include <string>
#include <unordered_map>

#include "kiln/dist/communicator.h"
#include "kiln/models/tensor_parallel_layout.h"
#include "kiln/nn/module.h"
#include "kiln/optim/optimizer.h"
#include "kiln/train/gpt_checkpoint.h"

namespace kiln::train {

class TensorParallelState {
 public:
  TensorParallelState(const nn::Module& model, models::TensorParallelLayout layout, dist::Communicator tp);

  const dist::Communicator& group() const { return tp_; }
  const models::TensorParallelLayout& layout() const { return layout_; }

  // Collective: the whole tensors of a state_dict of this rank's shards (names -> splits by layout).
  TensorDict gather(const TensorDict& local) const;
  // This rank's slices of whole tensors; a tensor whose split dimension does not divide is kept as it
  // is (the shape check that follows names it and the flag behind it).
  TensorDict shard(const TensorDict& whole) const;
  ModelStateLayout model_state_layout() const;

  // The state_dict name of a parameter of the model (empty for a tensor that is none of them).
  std::string name_of(const Tensor& param) const;

 private:
  models::TensorParallelLayout layout_;
  dist::Communicator tp_;
  std::unordered_map<const TensorImpl*, std::string> names_;
};

// An optimizer's state as checkpoints see it under tensor parallelism: state_dict() gathers every
// per-parameter tensor ("state.<i>.master", the moments) of a split parameter into the whole
// parameter's shape (collective over the group), load_state_dict() keeps this rank's slices. The
// inner optimizer may itself be a data-parallel view (GatheredOptimizerState).
class TensorParallelOptimizerState : public optim::Optimizer {
 public:
  TensorParallelOptimizerState(optim::Optimizer& inner, const TensorParallelState& state);
  void step() override { inner_.step(); }
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

 private:
  // The split of "state.<i>.<what>" (replicated for anything but a split parameter's own tensors).
  models::TensorParallelSplit split_of_key(const std::string& key) const;

  optim::Optimizer& inner_;
  const TensorParallelState& state_;
  std::vector<std::string> param_names_;  // by state_dict index
};

}  // namespace kiln::train
