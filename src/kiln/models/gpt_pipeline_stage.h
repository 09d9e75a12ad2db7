#pragma once
// GptPipelineStage: one pipeline rank's part of a models::GptModel (Megatron-core's GPTModel built
// with pre_process / post_process over the layers of its pipeline stage).
//
// The decoder's layers are split over p pipeline ranks, v model chunks each (the interleaved
// schedule: chunk c of rank r is virtual stage c p + r and holds the layers of that stage):
//   - the first virtual stage (rank 0, chunk 0) also holds the embedding,
//   - the last one (rank p - 1, chunk v - 1) the final norm, the output layer and the loss;
//     with tied embeddings it holds a copy of the word embeddings as "output_layer.weight"
//     (Megatron's shared embedding on the last stage), initialised equal; the training loop sums
//     its gradient with the first stage's over the embedding group, so both copies stay equal.
//   - MTP (--mtp-num-layers; 1F1B and interleaved): the last stage also holds the MTP block and a copy of
//     the embedding (Megatron's mtp_process stage), under the first stage's names ("embedding.*"),
//     whose gradients are summed with the first stage's over the embedding group; with tied
//     embeddings the copy's word embeddings are the output layer's weight. The copy is not saved
//     (the original is) and loads the original's tensors. The embedding's dropout stream stays the
//     one-process model's: the first stage skips the draws the MTP depths make, the copy the main
//     embedding's, so every mask is the one-process run's.
// Parameter names are the one-process model's (decoder.layers.{i} with the global i), so the
// checkpoint of a pipeline run is the one-process checkpoint (train/pipeline_parallel.h gathers it).
//
// The stage is built from the whole model made from the same seed (then dropped): the same weights
// and dropout seeds as one process, whatever the layout.
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "kiln/models/gpt_model.h"

namespace kiln::models {

// How the layers lie over the pipeline (the flags of the same names; 0: not given).
struct PipelineSplit {
  int stages = 1;                             // --pipeline-model-parallel-size
  std::int64_t layers_per_virtual_stage = 0;  // --num-layers-per-virtual-pipeline-stage
  std::int64_t first_stage_layers = 0;        // --decoder-first-pipeline-num-layers
  std::int64_t last_stage_layers = 0;         // --decoder-last-pipeline-num-layers
  // --pipeline-schedule dualpipe: the layers split as 1F1B's (p stages), rank r holding stage r as
  // chunk 0 and a copy of stage p - 1 - r as chunk 1 (DeepSeek-V3's DualPipe).
  bool dualpipe = false;
  int chunks(std::int64_t num_layers) const;  // v: model chunks per rank
};

// The layers [begin, end) of each virtual stage (index c p + r), p v of them. Throws naming the
// flags and the numbers when the layers cannot be split so (not divisible, a stage left empty, an
// uneven split with interleaving).
std::vector<std::pair<std::int64_t, std::int64_t>> pipeline_layer_ranges(std::int64_t num_layers,
                                                                         const PipelineSplit& split);

class GptPipelineStage : public nn::Module {
 public:
  // Throws naming the flag for what a stage cannot hold (MTP with DualPipe). Activation recompute
  // (--recompute-granularity full) counts each model chunk's layers from its first, as Megatron.
  // MoE layers come as the whole model's: their routers' aux losses are attached to the stage's
  // activations, so each stage's backward gives its own layers' aux losses their gradient.
  // `groups`: with config.tensor_model_parallel_size, expert_model_parallel_size or
  // context_parallel_size > 1, the groups the stage's layers split over (as GptModel's); null: one
  // process per stage. Under context parallelism every stage holds this rank's two chunks of each
  // sequence (context_parallel_layout.h): the first stage embeds them at their true positions, every
  // stage's attention runs over the context-parallel group, the last stage's loss is GptModel's.
  GptPipelineStage(GptConfig config, std::uint64_t seed, int pipeline_rank, const PipelineSplit& split,
                   const dist::ProcessGroups* groups = nullptr);

  const GptConfig& config() const { return config_; }
  int pipeline_rank() const { return rank_; }
  int pipeline_size() const { return split_.stages; }
  int num_chunks() const { return chunks_; }
  // The first / last virtual stage of the chunk's direction (DualPipe: chunk 1 runs from rank p - 1
  // to rank 0).
  bool is_first_virtual_stage(int chunk) const;
  bool is_last_virtual_stage(int chunk) const;
  std::pair<std::int64_t, std::int64_t> layers_of_chunk(int chunk) const;
  // DualPipe: the pipeline stage chunk `chunk` holds (r, or p - 1 - r for chunk 1).
  int stage_of_chunk(int chunk) const;
  // DualPipe: the names (as named_parameters / state_dict / named_modules give them) of chunk
  // `chunk`'s parameters, state and dropout modules: its layers, and the embedding where it is a
  // first stage, the final norm and output layer (or tied copy) where it is a last one.
  bool in_chunk(const std::string& name, int chunk) const;

  // Model chunk `chunk`: from tokens [B, T] (first virtual stage) or the previous stage's hidden
  // states `input` [B, T, H], through its layers; the last virtual stage returns the scalar f32
  // loss sum(CE * mask) / sum(mask) (as GptModel::loss), the others the hidden states [B, T, H]
  // ([B, T / cp / tp, H] under context and sequence parallelism; tokens, labels and mask whole).
  // MTP with gradients on: the last stage's loss is GptModel::loss's (the main loss in value, the
  // depths' scaled losses in its gradient), each depth's loss added to mtp_loss_sums().
  Tensor forward_chunk(int chunk, const Tensor& input, const Tensor& tokens, const Tensor& labels,
                       const Tensor& loss_mask);

  // Tied embeddings on the last stage (DualPipe: ranks 0 and p - 1): the copy of the word embeddings
  // (undefined elsewhere), and its name in the stage's state_dict (kTiedCopyName; with MTP the
  // embedding copy's word embeddings).
  const Tensor& tied_output_copy() const { return tied_copy_; }
  const std::string& tied_copy_name() const { return tied_copy_name_; }
  // The word embeddings where this rank holds them (first stage; with MTP the last stage's copy), else undefined.
  Tensor word_embeddings() const;
  static constexpr const char* kTiedCopyName = "output_layer.weight";
  // The tensor whose gradient the embedding group sums (1F1B / interleaved; undefined elsewhere): on
  // the first stage the word embeddings when the last stage holds a copy of them (tied, or MTP); on
  // the last stage that copy.
  Tensor embedding_group_tensor() const;
  // MTP: the last stage's copy of the embedding (its state_dict keys and dropout modules' names;
  // empty elsewhere), whose state the checkpoint takes from the first stage's original.
  std::vector<std::string> embedding_copy_state_names() const;
  std::vector<std::string> embedding_copy_dropout_names() const;
  // MTP: the sums of the depths' losses L_1 .. L_D over the training forwards since the last
  // call, f32 [D] on the last stage (zeros elsewhere, undefined before the first forward); resets them.
  Tensor take_mtp_loss_sums();

  // The one-process model's parameters, (name, dim), in its named_parameters() order, and its
  // dropout modules' names: what the checkpoint of the whole model holds.
  const std::vector<std::pair<std::string, std::int64_t>>& whole_parameters() const { return whole_parameters_; }
  const std::vector<std::string>& whole_dropout_names() const { return whole_dropout_names_; }

  std::vector<std::shared_ptr<nn::Dropout>> dropout_modules() const;
  // Tensor parallelism: how the stage's parameters lie over the group (GptModel's, the tied copy
  // split as the word embeddings), and each rank's own dropout streams after a load (empty / nothing
  // without it).
  TensorParallelLayout tensor_parallel_layout() const;
  void reseed_tensor_parallel_dropout();
  // Expert parallelism: the stage's routed experts split over the expert-parallel group, as
  // GptModel::expert_parallel_layout (empty without one, or without MoE layers on this stage).
  const TensorParallelLayout& expert_parallel_layout() const { return expert_layout_; }
  // Expert tensor parallelism: each of the stage's experts split over the expert-tensor-parallel
  // group, as GptModel::expert_tensor_parallel_layout (empty without one).
  const TensorParallelLayout& expert_tensor_parallel_layout() const { return expert_tensor_layout_; }

  std::shared_ptr<LanguageModelEmbedding> embedding;  // first stage only (DualPipe: ranks 0 and p - 1)
  std::shared_ptr<TransformerNorm> final_layernorm;   // last stage only (DualPipe: ranks 0 and p - 1)
  std::shared_ptr<ParallelLinear> output_layer;       // last stage, untied only
  std::shared_ptr<MultiTokenPredictionBlock> mtp;     // last stage, with --mtp-num-layers only

 private:
  const RopeTable* rope_table(Device device);
  // The embedding dropout's stream moved past `times` draws of `count` elements (as forward() would
  // move it in training; nothing where it draws nothing).
  void skip_embedding_dropout(std::int64_t count, Device device, std::int64_t times);

  GptConfig config_;
  PipelineSplit split_;
  int rank_ = 0, chunks_ = 1;
  std::vector<std::pair<std::int64_t, std::int64_t>> ranges_;  // per chunk
  std::vector<std::shared_ptr<TransformerLayer>> layers_;      // by global index - first layer held (null: not held)
  std::int64_t first_layer_ = 0;
  Tensor tied_copy_;
  std::string tied_copy_name_ = kTiedCopyName;
  bool embedding_copy_ = false;  // MTP: `embedding` is the last stage's copy of the first stage's
  Tensor mtp_loss_sums_;
  const CoreOps* ops_ = nullptr;
  LayerContext context_;
  RopeTable rope_, context_parallel_rope_;
  std::vector<std::pair<std::string, std::int64_t>> whole_parameters_;
  std::vector<std::string> whole_dropout_names_;
  TensorParallelLayout expert_layout_, expert_tensor_layout_;
};

}  // namespace kiln::models
