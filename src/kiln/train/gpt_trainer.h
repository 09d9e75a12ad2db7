#pragma once
// The training loop of `kiln pretrain-gpt`, outside the model (Megatron-LM's training.py): global
// batches of micro-batches whose gradients add up in place in flat fp32 buffers, gradient clipping,
// AdamW on fp32 masters (bf16 parameters with --bf16), Megatron's LR schedules, evaluation loss and
// perplexity, logs (stdout, JSONL, TensorBoard) with throughput, TFLOP/s, MFU and memory, a
// loss-curve PNG, and checkpoints in Megatron's layout (gpt_checkpoint.h) from which a resumed run
// continues bit-identically.
//
// The loop sees the model only through LanguageModelHandle (a module and its loss), so it trains
// any causal language model; gpt_pretrain.h wires models::GptModel into it.
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "kiln/data/blended_dataset.h"
#include "kiln/dist/communicator.h"
#include "kiln/dist/process_groups.h"
#include "kiln/models/tensor_parallel_layout.h"
#include "kiln/nn/module.h"
#include "kiln/runtime/device.h"
#include "kiln/te/fp8_recipe.h"
#include "kiln/tensor/tensor.h"
#include "kiln/train/pipeline_executor.h"
#include "kiln/train/rewind_policy.h"

namespace kiln::train {

// What the loop needs of a language model.
struct LanguageModelHandle {
  std::shared_ptr<nn::Module> module;
  // tokens, labels [B, T] int64, loss_mask [B, T] f32 -> scalar f32: sum(CE * mask) / sum(mask).
  std::function<Tensor(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask)> loss;
  std::int64_t seq_length = 0;
  // MTP: named losses of the last loss() call with gradients on, besides the main one (f32 scalars,
  // detached), e.g. MTP's per-depth "mtp_1" .. "mtp_D"; averaged like lm loss and logged as
  // "<name> loss" (stdout) and "<name>_loss" (JSONL). Unset: none.
  std::function<std::vector<std::pair<std::string, Tensor>>()> auxiliary_losses;
  // Training FLOPs per token (forward and backward), for TFLOP/s and MFU; 0: not reported.
  double flops_per_token = 0;
  // The flags that fix the parameters' shapes and meaning, as "--flag" -> value, in a stable order
  // (saved in checkpoints; a checkpoint whose values differ is refused, naming the flag).
  std::vector<std::pair<std::string, std::string>> shape_flags;
  // Every flag of the run that made the model (saved in the checkpoint's index for the record).
  std::vector<std::pair<std::string, std::string>> all_flags;
  std::string description;  // "GPT 124M (12 layers, hidden 768)" for the banner
  // MoE: run after each optimizer step (the routers' expert-bias update), and at each log line,
  // where it adds its fields to log.jsonl's line and returns text for the console's (may be null).
  std::function<void()> after_optimizer_step;
  std::function<std::string(nlohmann::json& line)> log_extras;
  // Tensor parallelism (GptTrainOptions::tensor_parallel): how the module's parameters lie over the
  // group (models/tensor_parallel_layout.h); checkpoints gather and slice by it, the gradient norm
  // and sequence parallelism read it. Empty: every parameter whole on every rank.
  models::TensorParallelLayout tensor_parallel_layout;
  // --tp-comm-overlap: the linears' sequence-parallel collectives run under their GEMMs (the log says so).
  bool tp_comm_overlap = false;
  // Expert parallelism (GptTrainOptions::process_groups' ep group): the MoE experts split over the
  // expert-parallel group. Their gradients are averaged over the expert-data-parallel group (the
  // dense ones over the data-parallel group), the distributed optimizer shards them over it, and
  // checkpoints gather them whole over the expert-parallel group. Empty: no expert parallelism.
  models::TensorParallelLayout expert_parallel_layout;
  // Expert tensor parallelism (the process groups' expert_tp group): of each expert this rank's slice
  // of F; checkpoints gather it over that group first, then over the expert-parallel one. Empty:
  // whole experts.
  models::TensorParallelLayout expert_tensor_parallel_layout;
  // Tensor parallelism: run after a checkpoint's random state (rank 0's) is loaded on every rank, so
  // that each rank draws its own dropout masks again (GptModel::reseed_tensor_parallel_dropout).
  std::function<void()> after_random_state_load;
  // --fp8-param-gather: the module's FP8 linears (models::fp8_linear_weights) keep their weights in
  // FP8 only, with this recipe (te/fp8_primary_weights.h); the loop casts the optimizer's masters into
  // them after each step, checkpoint load and rewind. Unset: weights in the model's dtype.
  std::optional<te::Fp8Recipe> fp8_param_gather;
  // Pipeline parallelism (GptTrainOptions::pipeline_parallel): this rank's stage; the loop runs the
  // schedule through it (pipeline_executor.h) instead of `loss`, which may then be unset.
  std::shared_ptr<PipelineStageHandle> pipeline;
};

// Megatron's --lr-decay-style and --lr-wsd-decay-style names.
struct GptTrainOptions {
  std::int64_t micro_batch_size = 1;
  std::int64_t global_batch_size = 0;  // 0: micro_batch_size (no accumulation)
  std::int64_t train_iters = 0;        // one of train_iters, train_samples
  std::int64_t train_samples = 0;
  double lr = 0;
  double min_lr = 0;
  std::string lr_decay_style = "linear";  // constant, linear, cosine, inverse-square-root, WSD
  std::int64_t lr_warmup_iters = 0;
  std::int64_t lr_decay_iters = 0;  // 0: train_iters
  std::int64_t lr_wsd_decay_iters = 0;
  std::string lr_wsd_decay_style = "exponential";  // exponential, linear, cosine, minus_sqrt
  double weight_decay = 0.01;                      // not on biases and 1-D parameters (norms)
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_eps = 1e-8;
  double clip_grad = 1.0;  // 0: no clipping
  std::uint64_t seed = 1234;
  bool bf16 = false;  // bf16 parameters and compute, fp32 master weights and gradient buffers
  // With bf16: the linears' weight-gradient GEMMs add into the fp32 gradient buffers themselves
  // (autograd/grad_accumulation_fusion.h); --no-gradient-accumulation-fusion turns it off.
  bool gradient_accumulation_fusion = true;

  std::vector<data::BlendPart> data_path;
  std::string split = "969, 30, 1";
  std::filesystem::path data_cache_path;  // empty: <first data prefix's folder>/cache
  std::int64_t eval_interval = 1000;
  std::int64_t eval_iters = 100;  // global batches per evaluation (0: none)
  std::int64_t log_interval = 100;

  std::filesystem::path save;  // empty: no checkpoints
  std::int64_t save_interval = 0;
  std::int64_t exit_interval = 0;  // stop (after saving, with --save) at an iteration it divides; 0: never
  // Megatron's --exit-signal-handler: SIGTERM or SIGINT (a scheduler's notice, Ctrl-C) ends the run
  // after the iteration in progress, saving a checkpoint first when there is --save.
  bool exit_signal_handler = false;
  std::filesystem::path load;           // empty: start afresh
  int keep_last = 0;                    // --keep-last: checkpoints kept in --save (0: all)
  bool async_save = false;              // --async-save: the step pays the host copy, a thread writes
  bool finetune = false;                // --finetune: load the model only; fresh optimizer, iteration 0
  bool no_load_optim = false;           // --no-load-optim: load model and iteration, not the optimizer state
  RewindOptions rewind;                 // --rewind and its thresholds
  std::set<std::int64_t> skip_batches;  // --skip-batches: global batches (1-based steps) not trained
  std::filesystem::path tensorboard_dir;
  std::filesystem::path log_dir;  // log.jsonl and loss_curve.png; empty: save, else tensorboard_dir, else none
  Device device = Device::cpu();
  // Data parallelism (data_parallel.h): the group of ranks that each train on their slice of every
  // global batch (Megatron's sampler: micro-batch m of rank r holds samples (m * dp + r) * mbs ..
  // of the global batch); unset or of one rank: one process. Rank 0 writes checkpoints and logs.
  std::optional<dist::Communicator> data_parallel;
  bool use_distributed_optimizer = false;  // --use-distributed-optimizer (ZeRO-1)
  bool overlap_grad_reduce = false;        // --overlap-grad-reduce
  bool overlap_param_gather = false;       // --overlap-param-gather
  std::int64_t ddp_bucket_size = 0;        // --ddp-bucket-size (elements); 0: Megatron's choice
  bool progress = true;                    // the progress line with the ETA between log lines (a terminal only)
  // Tensor parallelism (docs/parallel.md): the group of ranks that hold the shards of one model and
  // train on the same samples (world = tp x dp, its ranks adjacent); data_parallel is then the group
  // of the ranks holding the same shards. Unset or of one rank: none. The model must have been built
  // over it (pretrain_gpt builds it over process_groups).
  std::optional<dist::Communicator> tensor_parallel;
  // The process groups pretrain_gpt builds the model over (null: one process, or data parallelism
  // alone); set by the caller together with data_parallel and tensor_parallel.
  std::shared_ptr<const dist::ProcessGroups> process_groups;
  // Pipeline parallelism (docs/parallel.md): the group of the stages of one model replica (world =
  // tp x dp x pp, the stages farthest apart); unset or of one rank: none. The model handle must then
  // carry its stage (LanguageModelHandle::pipeline; pretrain_gpt builds it), and process_groups its
  // embedding group (tied embeddings).
  std::optional<dist::Communicator> pipeline_parallel;
  // How pretrain_gpt splits the layers over the stages (0: not given): interleaving with
  // --num-layers-per-virtual-pipeline-stage, an uneven split with the first/last stage's layers.
  std::int64_t num_layers_per_virtual_pipeline_stage = 0;
  std::int64_t decoder_first_pipeline_num_layers = 0;
  std::int64_t decoder_last_pipeline_num_layers = 0;
  // --pipeline-schedule zero-bubble: ZB-H1 (sim/pipeline_actions.h), the backward split into input
  // gradients (B) and the linear layers' weight gradients (W, deferred); one model chunk per rank.
  bool zero_bubble_schedule = false;
  // --pipeline-schedule dualpipe: DeepSeek-V3's bidirectional schedule (sim/pipeline_actions.h:
  // dualpipe_actions): each rank holds stage r of direction 0 and a copy of stage p - 1 - r for
  // direction 1 (twice the parameters, gradients and optimizer state), the copies' gradients summed
  // after backward (train/dualpipe_grads.h). Needs an even pipeline size and micro-batch count.
  bool dualpipe_schedule = false;
  // --profile-schedule: a PNG of every pipeline rank's measured timeline of step
  // profile_schedule_step (1-based, counted from the run's first trained step).
  std::filesystem::path profile_schedule;
  std::int64_t profile_schedule_step = 1;

  // Context parallelism (docs/parallel.md): the group of ranks that split each sequence (the model
  // must have been built over it); they read the same samples as one data-parallel rank, and the
  // gradients are averaged over data_context_parallel (dp x cp, Megatron's dp_cp group) in place of
  // data_parallel. Unset or of one rank: none.
  std::optional<dist::Communicator> context_parallel;
  std::optional<dist::Communicator> data_context_parallel;

  int context_parallel_size() const { return context_parallel ? context_parallel->size() : 1; }
  int context_parallel_rank() const { return context_parallel ? context_parallel->rank() : 0; }
  int data_parallel_size() const { return data_parallel ? data_parallel->size() : 1; }
  int data_parallel_rank() const { return data_parallel ? data_parallel->rank() : 0; }
  int tensor_parallel_size() const { return tensor_parallel ? tensor_parallel->size() : 1; }
  int tensor_parallel_rank() const { return tensor_parallel ? tensor_parallel->rank() : 0; }
  int pipeline_parallel_size() const { return pipeline_parallel ? pipeline_parallel->size() : 1; }
  int pipeline_parallel_rank() const { return pipeline_parallel ? pipeline_parallel->rank() : 0; }
  // The rank that prints, logs and writes checkpoints: rank 0 of every group.
  bool is_first_rank() const {
    return data_parallel_rank() == 0 && tensor_parallel_rank() == 0 && context_parallel_rank() == 0 &&
           pipeline_parallel_rank() == 0;
  }
  // Micro-batches per rank per iteration: global batch / (micro-batch x data-parallel size).
  std::int64_t num_micro_batches() const;
  std::int64_t effective_global_batch() const { return global_batch_size > 0 ? global_batch_size : micro_batch_size; }
};

// One log line's numbers (also what the JSONL line holds).
struct GptLogRecord {
  std::int64_t iteration = 0, train_iters = 0, consumed_samples = 0;
  double loss = 0;                                               // mean of the iterations since the last log line
  std::vector<std::pair<std::string, double>> auxiliary_losses;  // MTP: LanguageModelHandle's, same mean
  double lr = 0, grad_norm = 0;
  double seconds_per_iteration = 0, tokens_per_second = 0;
  double tflops_per_gpu = 0;
  std::optional<double> mfu;  // fraction of the device's peak; nullopt where the peak is unknown (CPU)
  std::size_t memory_allocated = 0, memory_reserved = 0, memory_peak = 0;
  double eta_seconds = 0;
};

struct GptEvalRecord {
  std::int64_t iteration = 0;
  double loss = 0, perplexity = 0;
  std::string split;  // "validation" or "test"
};

struct GptTrainSummary {
  std::int64_t start_iteration = 0;  // the iteration loaded (0 for a fresh run)
  std::int64_t iterations = 0;       // the last iteration done
  std::vector<GptLogRecord> logs;
  std::vector<GptEvalRecord> evals;
  double seconds = 0;
  std::vector<std::filesystem::path> checkpoints_written;
  double final_loss = 0;                   // the loss of the last iteration trained
  std::vector<RewindEvent> rewinds;        // this run's rewinds
  std::set<std::int64_t> skipped_batches;  // every skipped step (loaded, --skip-batches, rewinds)
  double max_save_stall_seconds = 0;       // the longest a save held up training
  // --pipeline-schedule dualpipe: after the run, the largest difference between the two copies of
  // any stage's parameters over the pipeline (0: bit-identical, as they must be); 0 otherwise.
  double dualpipe_copy_difference = 0;
};

struct GptTrainCallbacks {
  std::function<void(const std::string&)> message;  // banner, checkpoint and eval lines; default stdout
  std::function<void(const GptLogRecord&)> on_log;
  std::function<void(const GptEvalRecord&)> on_eval;
};

// Checks the options (errors name the Megatron flag), builds the datasets, loads --load when it
// holds a checkpoint, trains and writes checkpoints, logs and the loss curve. The model's
// parameters must be f32 (they move to `options.device`, and become bf16 with bf16). The caller
// seeds the default generator before building the model (pretrain_gpt: manual_seed(--seed)); its
// state and the dropout modules' are checkpointed from there.
GptTrainSummary train_language_model(LanguageModelHandle model, const GptTrainOptions& options,
                                     const GptTrainCallbacks& callbacks = {});

// The dense peak of the device for the training dtype in TFLOP/s, from the device's name: H100/H200
// bf16 989, f32 66.9 (494.5 with TF32 allowed: KILN_ALLOW_TF32=1); A100 bf16 312, f32 19.5 (TF32
// 156); nullopt where Kiln does not know it (CPUs, other GPUs).
std::optional<double> device_peak_tflops(Device device, bool bf16);

// "1h02m03s"
std::string eta_text(double seconds);

// The log line, in Megatron's wording.
std::string format_log_line(const GptLogRecord& r);

}  // namespace kiln::train
