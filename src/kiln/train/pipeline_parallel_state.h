#pragma once
// Checkpoints of a pipeline-parallel model in the one-process format (whole model, the names and
// optimizer indices of one process), so that a checkpoint written with P stages loads into one
// process (generate, export-hf) and at any other P, and back. Each rank holds its stage's
// parameters; saving gathers every stage's tensors to the pipeline group's rank 0 (collective over
// the pipeline group; the run's rank 0 writes), loading takes from the whole checkpoint the
// tensors of the rank's stage (no communication: every rank reads the files). The last stage's
// copy of tied word embeddings is not saved; it is loaded from the word embeddings. Under DualPipe
// the copy of another rank's stage (PipelineStageHandle::mirror_state_names) is not saved either
// (its original is) and loads the same tensors as the original, so both copies start equal.
//
//   PipelineParallelState pp_state(model, stage, pp);
//   ModelStateLayout view = pp_state.model_state_layout();        // for gpt_checkpoint.h
//   PipelineOptimizerState optimizer_view(inner, pp_state);       // the optimizer's state alike
//   pp_state.complete_rng_state(state);                           // every stage's dropout streams
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/nn/module.h"
#include "kiln/optim/optimizer.h"
#include "kiln/train/gpt_checkpoint.h"
#include "kiln/train/pipeline_executor.h"

namespace kiln::train {

// Collective over `group`: rank 0 gets every rank's tensors (host copies, in rank order; names
// must not repeat), the others an empty dict.
TensorDict gather_tensor_dicts(const dist::Communicator& group, const TensorDict& local);

class PipelineParallelState {
 public:
  PipelineParallelState(const nn::Module& model, const PipelineStageHandle& stage, dist::Communicator pp);

  const dist::Communicator& group() const { return pp_; }
  // Collective: the whole model's state_dict on the group's rank 0.
  TensorDict gather(const TensorDict& local) const;
  // This stage's tensors out of a whole state_dict (the tied copy from the word embeddings).
  TensorDict local(const TensorDict& whole) const;
  ModelStateLayout model_state_layout() const;
  // Collective: the dropout streams of every stage's modules into `state` (it holds this stage's).
  void complete_rng_state(GptCheckpointState& state) const;

  // The name of one of the stage's parameters, and the index the one-process optimizer gives it
  // (the tied copy maps to the word embeddings'; -1 when excluded from the whole state).
  std::string name_of(const Tensor& param) const;
  int whole_index_for_load(const std::string& name) const;
  int whole_index_for_save(const std::string& name) const;
  // The one-process optimizer's parameter groups: (decay, no decay) sizes.
  const std::vector<std::size_t>& whole_group_sizes() const { return whole_group_sizes_; }

 private:
  dist::Communicator pp_;
  std::string tied_copy_name_;
  std::unordered_map<const TensorImpl*, std::string> names_;
  std::vector<std::string> local_keys_;  // the stage's state_dict keys
  std::unordered_map<std::string, int> whole_index_;
  std::vector<std::size_t> whole_group_sizes_;
  std::vector<std::string> whole_dropout_names_;
  std::unordered_set<std::string> mirror_names_, mirror_dropout_names_;  // DualPipe's copies
  const nn::Module& model_;
};

// An optimizer's state as checkpoints see it under pipeline parallelism: state_dict() renumbers
// this stage's "state.<i>.<name>" to the one-process optimizer's indices and gathers the stages to
// the group's rank 0 (collective), load_state_dict() takes the one-process state and keeps this
// stage's part. The inner optimizer may be a data-parallel view (GatheredOptimizerState).
class PipelineOptimizerState : public optim::Optimizer {
 public:
  PipelineOptimizerState(optim::Optimizer& inner, const PipelineParallelState& state);
  void step() override { inner_.step(); }
  TensorDict state_dict() const override;
  void load_state_dict(const TensorDict& state) override;

 private:
  optim::Optimizer& inner_;
  const PipelineParallelState& state_;
  std::vector<std::string> param_names_;  // by the inner optimizer's index
};

}  // namespace kiln::train
