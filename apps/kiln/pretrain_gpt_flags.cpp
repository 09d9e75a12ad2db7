#include "pretrain_gpt_flags.h"

#include <fmt/format.h>

#include "fp8_flags.h"
#include "kiln/data/tokenizer_factory.h"
#include "kiln/models/gpt_pipeline_stage.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/error.h"
#include "kiln/sim/pipeline_actions.h"
#include "moe_flags.h"
#include "number_checks.h"

namespace kiln::cli {

namespace {

// Megatron flags Kiln knows of but does not do (yet), with what to do instead: an error that names
// them, rather than a run that silently differs from what the flags asked for. pretrain-gpt and
// simulate refuse the same ones (simulate takes every flag pretrain-gpt takes).

const std::map<std::string, std::string>& unsupported_megatron_flags() {
  static const std::map<std::string, std::string> flags = {
      {"--fp16", "fp16 training (loss scaling) is not supported: use --bf16"},
      {"--rampup-batch-size", "batch-size ramp-up is not supported: give a fixed --global-batch-size"},
      {"--lr-warmup-samples", "give the warmup in iterations: --lr-warmup-iters"},
      {"--lr-decay-samples", "give the decay in iterations: --lr-decay-iters"},
      {"--lr-wsd-decay-samples", "give the anneal in iterations: --lr-wsd-decay-iters"},
      {"--optimizer", "pretrain-gpt trains with AdamW (Megatron's default 'adam' is AdamW): leave it out"},
  };
  return flags;
}

Device default_device() { return device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu(); }

void add_layout_flags(CLI::App* cmd, GptLayoutFlags& l) {
  const auto positive = whole_number_at_least(1);
  const char* g = "Parallel layout (simulate)";
  cmd->add_option("--tensor-model-parallel-size", l.tensor_model_parallel_size, "tensor-parallel size (TP)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--pipeline-model-parallel-size", l.pipeline_model_parallel_size, "pipeline stages (PP)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--num-layers-per-virtual-pipeline-stage", l.num_layers_per_virtual_pipeline_stage,
                  "layers per model chunk: the interleaved schedule")
      ->check(positive)
      ->group(g);
  cmd->add_option("--expert-model-parallel-size", l.expert_model_parallel_size, "expert-parallel size (EP)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--expert-tensor-parallel-size", l.expert_tensor_parallel_size,
                  "ranks each expert's hidden size is split over (ETP)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--decoder-first-pipeline-num-layers", l.decoder_first_pipeline_num_layers,
                  "layers of the first pipeline stage (an uneven split; the others share the rest)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--decoder-last-pipeline-num-layers", l.decoder_last_pipeline_num_layers,
                  "layers of the last pipeline stage (an uneven split; the others share the rest)")
      ->check(positive)
      ->group(g);
  cmd->add_option("--context-parallel-size", l.context_parallel_size, "context-parallel size (CP)")
      ->check(positive)
      ->group(g);
  cmd->add_flag("--sequence-parallel", l.sequence_parallel, "sequence parallelism inside the TP group")->group(g);
  cmd->add_option("--cp-comm-type", l.cp_comm_type, "context parallelism: p2p (ring attention) or a2a (Ulysses)")
      ->check(CLI::IsMember({"p2p", "a2a"}))
      ->group(g);
  cmd->add_option("--moe-token-dispatcher-type", l.moe_token_dispatcher_type,
                  "expert parallelism's token dispatcher: alltoall or allgather")
      ->check(CLI::IsMember({"alltoall", "allgather"}))
      ->group(g);
  cmd->add_flag("--tp-comm-overlap", l.tp_comm_overlap,
                "with --sequence-parallel: the TP all-gathers / reduce-scatters hidden under the linears' GEMMs")
      ->group(g);
  cmd->add_flag("--use-distributed-optimizer", l.use_distributed_optimizer,
                "optimizer state sharded over data parallelism (ZeRO-1)")
      ->group(g);
}

}  // namespace

void add_pretrain_gpt_flags(CLI::App* cmd, PretrainGptFlags& f, GptFlagsFor use) {
  auto& c = f.config;
  auto& o = f.options;
  // A flag given twice takes the last value, as Megatron's argparse does (a script's defaults, then
  // the user's override).
  cmd->option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  const auto positive = whole_number_at_least(1);
  const auto non_negative = whole_number_at_least(0);

  // ---- model (models::GptConfig; validate() names the flags of an inconsistent shape)
  // simulate --calibrate measures the machine alone: the shape is required by resolve_pretrain_gpt_flags there.
  const bool train = use == GptFlagsFor::PretrainGpt;
  cmd->add_option("--num-layers", c.num_layers, "transformer layers")->check(positive)->required(train)->group("Model");
  cmd->add_option("--hidden-size", c.hidden_size, "hidden size")->check(positive)->required(train)->group("Model");
  cmd->add_option("--ffn-hidden-size", c.ffn_hidden_size, "MLP width (default 4 x hidden; with --swiglu 8/3 x hidden)")
      ->check(positive)
      ->group("Model");
  cmd->add_option("--num-attention-heads", c.num_attention_heads, "attention heads")
      ->check(positive)
      ->required(train)
      ->group("Model");
  cmd->add_flag("--group-query-attention", f.group_query_attention, "grouped-query attention (--num-query-groups)")
      ->group("Model");
  cmd->add_option("--num-query-groups", c.num_query_groups, "key/value heads with --group-query-attention")
      ->check(positive)
      ->group("Model");
  cmd->add_option("--kv-channels", c.kv_channels, "head dimension (default hidden / heads)")
      ->check(positive)
      ->group("Model");
  cmd->add_option("--seq-length", c.seq_length, "tokens per sample")->check(positive)->required(train)->group("Model");
  cmd->add_option("--max-position-embeddings", c.max_position_embeddings, "positions (default --seq-length)")
      ->check(positive)
      ->group("Model");
  cmd->add_option("--position-embedding-type", f.position_embedding_type, "learned_absolute, rope or none")
      ->check(CLI::IsMember({"learned_absolute", "rope", "none"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--rotary-base", c.rotary_base, "RoPE base")
      ->check(finite_number_above(0))
      ->capture_default_str()
      ->group("Model");
  cmd->add_flag("--use-rope-scaling", c.rope_llama3_scaling, "Llama-3.1 RoPE frequency scaling")->group("Model");
  cmd->add_option("--rope-scaling-factor", c.rope_scaling_factor, "Llama-3.1 RoPE scaling factor")
      ->check(finite_number_above(1, true))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--normalization", f.normalization, "LayerNorm or RMSNorm")
      ->check(CLI::IsMember({"LayerNorm", "RMSNorm"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--norm-epsilon", c.norm_epsilon, "normalisation epsilon")
      ->check(finite_number_above(0))
      ->capture_default_str()
      ->group("Model");
  cmd->add_flag("--swiglu", c.swiglu, "SwiGLU MLP (Llama)")->group("Model");
  cmd->add_flag("--disable-bias-linear", f.disable_bias_linear, "no biases in the linear layers (Llama)")
      ->group("Model");
  cmd->add_flag("--untie-embeddings-and-output-weights", c.untie_embeddings_and_output_weights,
                "a separate output layer (Llama) instead of the word embeddings")
      ->group("Model");
  cmd->add_option("--attention-dropout", c.attention_dropout, "dropout on the attention probabilities")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--hidden-dropout", c.hidden_dropout, "dropout after attention and MLP")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--init-method-std", c.init_method_std, "standard deviation of the weight init")
      ->check(finite_number_above(0))
      ->capture_default_str()
      ->group("Model");
  // MLA (models/transformer_mla.h)
  cmd->add_flag("--multi-latent-attention", c.multi_latent_attention,
                "multi-head latent attention (DeepSeek-V2/V3): low-rank compressed keys/values, decoupled RoPE")
      ->group("Model");
  cmd->add_option("--q-lora-rank", c.q_lora_rank, "MLA: query compression rank (0: none, as DeepSeek-V2-Lite)")
      ->check(non_negative)
      ->group("Model");
  cmd->add_option("--kv-lora-rank", c.kv_lora_rank, "MLA: key/value latent rank (cached at generation)")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--qk-head-dim", c.qk_head_dim, "MLA: query/key head size without RoPE")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--qk-pos-emb-head-dim", c.qk_pos_emb_head_dim, "MLA: query/key head size with RoPE (decoupled)")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--v-head-dim", c.v_head_dim, "MLA: value head size")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  // MTP (models/multi_token_prediction.h)
  cmd->add_option("--mtp-num-layers", c.mtp_num_layers, "multi-token prediction depths (DeepSeek-V3; 0: none)")
      ->check(non_negative)
      ->group("Model");
  cmd->add_option("--mtp-loss-scaling-factor", c.mtp_loss_scaling_factor,
                  "MTP: weight of the mean of the depths' losses in the gradient")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--make-vocab-size-divisible-by", c.make_vocab_size_divisible_by, "vocabulary padding")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--transformer-impl", f.transformer_impl,
                  "local (Kiln's layers) or transformer_engine (Kiln's fused kernels, te/)")
      ->check(CLI::IsMember({"local", "transformer_engine"}))
      ->capture_default_str()
      ->group("Model");
  cmd->add_option("--recompute-granularity", f.recompute_granularity, "activation recompute: full or selective")
      ->check(CLI::IsMember({"full", "selective"}))
      ->group("Model");
  cmd->add_option("--recompute-method", f.recompute_method, "with full: uniform or block")
      ->check(CLI::IsMember({"uniform", "block"}))
      ->group("Model");
  cmd->add_option("--recompute-num-layers", c.recompute_num_layers,
                  "layers per recomputed chunk (uniform) or "
                  "recomputed layers (block)")
      ->check(positive)
      ->capture_default_str()
      ->group("Model");
  add_moe_flags(cmd, c, f.moe);  // MoE
  add_fp8_flags(cmd, c, f.fp8);  // FP8 (simulate: the same flags, so a run's recipe is simulated as it runs)
  f.tokenizer.add_to(cmd, false);
  for (const char* name : {"--tokenizer-type", "--tokenizer-model", "--vocab-file", "--merge-file"})
    cmd->get_option(name)->group("Tokenizer (as preprocess-data: the vocabulary size comes from it)");
  cmd->add_option("--vocab-size", f.vocab_size, "the vocabulary size when no tokenizer is given")
      ->check(positive)
      ->group("Tokenizer (as preprocess-data: the vocabulary size comes from it)");

  // ---- training
  cmd->add_option("--micro-batch-size", o.micro_batch_size, "sequences per forward/backward")
      ->check(positive)
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--global-batch-size", o.global_batch_size,
                  "sequences per optimizer step (a multiple of --micro-batch-size; gradients accumulate; default: "
                  "--micro-batch-size)")
      ->check(positive)
      ->group("Training");
  auto* iters = cmd->add_option("--train-iters", o.train_iters, "optimizer steps")->check(positive)->group("Training");
  auto* samples =
      cmd->add_option("--train-samples", o.train_samples, "samples to train on (iterations = samples / global batch)")
          ->check(positive)
          ->group("Training");
  iters->excludes(samples);
  cmd->add_option("--exit-interval", o.exit_interval, "stop (after saving) at an iteration this divides")
      ->check(positive)
      ->group("Training");
  cmd->add_flag("--exit-signal-handler", o.exit_signal_handler,
                "on SIGTERM or SIGINT: finish the iteration, save (with --save) and stop")
      ->group("Training");
  cmd->add_option("--lr", o.lr, "peak learning rate")
      ->check(finite_number_above(0))
      ->required(use == GptFlagsFor::PretrainGpt)
      ->group("Training");
  cmd->add_option("--min-lr", o.min_lr, "the learning rate at the end of the decay")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--lr-decay-style", o.lr_decay_style, "constant, linear, cosine, inverse-square-root or WSD")
      ->check(CLI::IsMember({"constant", "linear", "cosine", "inverse-square-root", "WSD"}))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--lr-wsd-decay-style", o.lr_wsd_decay_style, "WSD's anneal: exponential, linear, cosine, minus_sqrt")
      ->check(CLI::IsMember({"exponential", "linear", "cosine", "minus_sqrt"}))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--lr-wsd-decay-iters", o.lr_wsd_decay_iters,
                  "WSD: iterations of the anneal, ending at "
                  "--lr-decay-iters")
      ->check(positive)
      ->group("Training");
  cmd->add_option("--lr-warmup-iters", o.lr_warmup_iters, "linear warmup from 0")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--lr-decay-iters", o.lr_decay_iters, "where the decay reaches --min-lr (default --train-iters)")
      ->check(positive)
      ->group("Training");
  cmd->add_option("--weight-decay", o.weight_decay, "AdamW weight decay (not on biases and norms)")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--adam-beta1", o.adam_beta1, "Adam beta1")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--adam-beta2", o.adam_beta2, "Adam beta2")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--adam-eps", o.adam_eps, "Adam epsilon")
      ->check(finite_number_above(0))
      ->capture_default_str()
      ->group("Training");
  cmd->add_option("--clip-grad", o.clip_grad, "gradient clipping by global norm (0: none)")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group("Training");
  cmd->add_flag("--no-gradient-accumulation-fusion", f.no_gradient_accumulation_fusion,
                "with --bf16: the linears' weight-gradient GEMMs write 16-bit gradients that a pass of their own adds "
                "into the fp32 gradient buffers, instead of adding into them in the GEMM")
      ->group("Training");
  cmd->add_option("--seed", o.seed, "random seed (weights, data order, dropout)")
      ->capture_default_str()
      ->group("Training");
  cmd->add_flag("--bf16", o.bf16, "bf16 weights and compute, fp32 master weights, gradients and optimizer state")
      ->group("Training");
  cmd->add_option("--device", f.device, "cpu, cuda or cuda:N (default: cuda:0 if there is a GPU, else cpu)")
      ->group("Training");

  // ---- data
  cmd->add_option("--data-path", f.data_path,
                  "a dataset prefix (<prefix>.bin/.idx from preprocess-data), or a blend: \"0.3 prefix1 0.7 prefix2\"")
      ->required(use == GptFlagsFor::PretrainGpt)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll)
      ->group("Data");
  cmd->add_option("--split", o.split, "train,validation,test proportions of the documents")
      ->capture_default_str()
      ->group("Data");
  cmd->add_option("--data-cache-path", o.data_cache_path, "where the sample indices are cached (default: in memory)")
      ->group("Data");

  // ---- evaluation, logging, checkpoints
  cmd->add_option("--eval-interval", o.eval_interval, "iterations between evaluations")
      ->check(positive)
      ->capture_default_str()
      ->group("Logging and checkpoints");
  cmd->add_option("--eval-iters", o.eval_iters, "global batches per evaluation (0: none)")
      ->check(non_negative)
      ->capture_default_str()
      ->group("Logging and checkpoints");
  cmd->add_option("--log-interval", o.log_interval, "iterations between log lines")
      ->check(positive)
      ->capture_default_str()
      ->group("Logging and checkpoints");
  cmd->add_option("--save", o.save, "checkpoint folder (Megatron's iter_XXXXXXX layout)")
      ->group("Logging and checkpoints");
  cmd->add_option("--save-interval", o.save_interval, "iterations between checkpoints (and one at the end)")
      ->check(positive)
      ->group("Logging and checkpoints");
  cmd->add_option("--load", o.load,
                  "continue from the newest intact checkpoint in this folder (checksums verified; newer damaged ones "
                  "are passed over, saying why; none there: start afresh)")
      ->group("Logging and checkpoints");
  cmd->add_flag("--finetune", o.finetune,
                "with --load: load the model only; iteration 0, a fresh optimizer, this run's seed (e.g. to train "
                "an import-hf checkpoint)")
      ->group("Logging and checkpoints");
  cmd->add_flag("--no-load-optim", o.no_load_optim,
                "with --load: do not load the optimizer state (fresh Adam moments); the iteration continues")
      ->group("Logging and checkpoints");
  cmd->add_option("--keep-last", o.keep_last, "keep only the K newest iter_* checkpoints in --save (0: all)")
      ->check(whole_number_at_least(0))
      ->capture_default_str()
      ->group("Logging and checkpoints");
  cmd->add_flag("--async-save", o.async_save,
                "write checkpoints on a background thread: the step waits only for a host copy (the stall is logged)")
      ->group("Logging and checkpoints");
  auto& r = o.rewind;
  const char* rg = "Rewind (docs/checkpoints.md)";
  cmd->add_flag("--rewind", r.enabled,
                "roll back iterations whose loss or gradient norm is NaN/inf or spikes to an in-memory snapshot, "
                "skip their global batch, carry on")
      ->group(rg);
  cmd->add_option("--rewind-loss-zscore", r.thresholds.loss_zscore,
                  "a loss this many standard deviations above the window's mean is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-loss-ratio", r.thresholds.loss_ratio,
                  "a loss above this multiple of the window's median is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-grad-norm-ratio", r.thresholds.grad_norm_ratio,
                  "a gradient norm above this multiple of the window's median is a spike (0: off)")
      ->check(finite_number_above(0, true))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-window", r.thresholds.window, "good iterations the spike statistics are over")
      ->check(whole_number_at_least(2))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-min-history", r.thresholds.min_history,
                  "spikes are judged once this many good iterations are in the window")
      ->check(whole_number_at_least(2))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-snapshot-interval", r.snapshot_interval,
                  "iterations between in-memory snapshots to roll back to (also after each log line, evaluation "
                  "and save)")
      ->check(whole_number_at_least(1))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-max", r.max_rewinds, "give up after this many rewinds ...")
      ->check(whole_number_at_least(1))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-max-window", r.max_rewinds_window, "... within this many iterations")
      ->check(whole_number_at_least(1))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-lr-factor", r.lr_factor,
                  "after a rewind, multiply the learning rate by this (0 < f <= 1) ...")
      ->check(finite_number_above(0))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--rewind-lr-steps", r.lr_steps, "... for this many iterations (0: not lowered)")
      ->check(whole_number_at_least(0))
      ->capture_default_str()
      ->group(rg);
  cmd->add_option("--skip-batches", f.skip_batches,
                  "iterations (1-based) whose global batches are never trained on, e.g. 12,40: to reproduce a run "
                  "that rewound")
      ->group(rg);
  cmd->add_option("--tensorboard-dir", o.tensorboard_dir, "TensorBoard event files")->group("Logging and checkpoints");
  cmd->add_option("--log-dir", o.log_dir,
                  "log.jsonl and loss_curve.png (default: --save, else --tensorboard-dir, else none)")
      ->group("Logging and checkpoints");
  cmd->add_flag("--no-progress", f.no_progress, "no progress line between log lines")->group("Logging and checkpoints");

  if (use == GptFlagsFor::Simulate) add_layout_flags(cmd, f.layout);
  if (use == GptFlagsFor::PretrainGpt) {
    // Data parallelism: mpirun -np N starts N ranks, each training on its slice of every global batch.
    const char* dg = "Data parallelism (mpirun -np N)";
    cmd->add_flag("--use-distributed-optimizer", o.use_distributed_optimizer,
                  "ZeRO-1: gradients reduce-scattered, each rank keeps and updates its shard of the fp32 masters and "
                  "Adam moments, parameters all-gathered")
        ->group(dg);
    cmd->add_flag("--overlap-grad-reduce", o.overlap_grad_reduce,
                  "start each gradient bucket's reduction as soon as backward has produced it")
        ->group(dg);
    cmd->add_flag("--overlap-param-gather", o.overlap_param_gather,
                  "with --use-distributed-optimizer: the parameters' all-gather runs on until the next forward")
        ->group(dg);
    cmd->add_option("--ddp-bucket-size", o.ddp_bucket_size,
                    "elements per gradient bucket (default: one bucket, or max(40M, 1M x ranks) with "
                    "--overlap-grad-reduce)")
        ->check(positive)
        ->group(dg);
    // Tensor and sequence parallelism (docs/parallel.md): world = tp x dp, the tensor-parallel ranks adjacent.
    const char* tg = "Tensor parallelism (mpirun -np N, N a multiple of the size)";
    cmd->add_option("--tensor-model-parallel-size", c.tensor_model_parallel_size,
                    "ranks each layer is split over (heads, MLP units, vocabulary); the other N / size ranks are "
                    "data-parallel")
        ->check(positive)
        ->group(tg);
    cmd->add_flag("--sequence-parallel", c.sequence_parallel,
                  "with --tensor-model-parallel-size > 1: the activations outside attention and the MLP split along "
                  "the sequence over the tensor-parallel ranks")
        ->group(tg);
    cmd->add_flag("--tp-comm-overlap", c.tp_comm_overlap,
                  "with --sequence-parallel: the linears' sequence all-gather / reduce-scatter run in per-rank chunks "
                  "around the tensor-parallel ring under their GEMMs (TransformerEngine's ring-exchange overlap)")
        ->group(tg);
    add_expert_parallel_flags(cmd, c, f.moe);  // EP (docs/parallel.md)
    // Pipeline parallelism (docs/parallel.md): world = tp x dp x pp, the stages farthest apart.
    const char* pg = "Pipeline parallelism (mpirun -np N, N a multiple of the stages)";
    cmd->add_option("--pipeline-model-parallel-size", f.pipeline_model_parallel_size,
                    "pipeline stages the layers are split over; the other N / size ranks are data-parallel")
        ->check(positive)
        ->group(pg);
    cmd->add_option("--num-layers-per-virtual-pipeline-stage", o.num_layers_per_virtual_pipeline_stage,
                    "layers per model chunk: each rank holds several chunks, run by the interleaved 1F1B schedule")
        ->check(positive)
        ->group(pg);
    cmd->add_option("--decoder-first-pipeline-num-layers", o.decoder_first_pipeline_num_layers,
                    "layers of the first stage (an uneven split; the others share the rest)")
        ->check(positive)
        ->group(pg);
    cmd->add_option("--decoder-last-pipeline-num-layers", o.decoder_last_pipeline_num_layers,
                    "layers of the last stage (an uneven split; the others share the rest)")
        ->check(positive)
        ->group(pg);
    cmd->add_option("--pipeline-schedule", f.pipeline_schedule,
                    "1f1b, interleaved, zero-bubble (ZB-H1: the backward split into input and weight gradients, "
                    "the weight gradients filling the waits) or dualpipe (DeepSeek-V3: half the micro-batches enter "
                    "at each end, each rank holding two copies of stages, twice the parameter memory; even "
                    "--pipeline-model-parallel-size and micro-batches) (default: interleaved with "
                    "--num-layers-per-virtual-pipeline-stage, else 1f1b)")
        ->group(pg);
    cmd->add_option("--profile-schedule", o.profile_schedule,
                    "write a PNG of every pipeline rank's measured timeline of one step (forward and backward boxes "
                    "per micro-batch, the idle gaps)")
        ->group(pg);
    cmd->add_option("--profile-schedule-step", o.profile_schedule_step,
                    "the step --profile-schedule draws (1: the run's first trained step)")
        ->check(positive)
        ->group(pg);
    // Context parallelism (docs/parallel.md): world = tp x cp x dp, Megatron's order.
    const char* cg = "Context parallelism (mpirun -np N, N a multiple of TP x CP)";
    cmd->add_option("--context-parallel-size", c.context_parallel_size,
                    "ranks each sequence is split over (2 x size load-balanced chunks); attention spans them")
        ->check(positive)
        ->group(cg);
    cmd->add_option("--cp-comm-type", f.cp_comm_type,
                    "p2p: ring attention (keys and values passed around the ring); a2a: all-to-all to head-sharded "
                    "attention (Ulysses)")
        ->check(CLI::IsMember({"p2p", "a2a"}))
        ->capture_default_str()
        ->group(cg);
  }
  for (const auto& [flag, why] : unsupported_megatron_flags())
    cmd->add_option(flag, f.unsupported_values[flag])->expected(0, 1)->group("");
}

namespace {

// Pipeline parallelism's flags together (the world's size is checked when the ranks join).
void resolve_pipeline_flags(CLI::App* cmd, PretrainGptFlags& f) {
  auto& o = f.options;
  const int pp = f.pipeline_model_parallel_size;
  const bool interleaving = o.num_layers_per_virtual_pipeline_stage > 0;
  if (pp == 1)
    for (const char* flag :
         {"--num-layers-per-virtual-pipeline-stage", "--decoder-first-pipeline-num-layers",
          "--decoder-last-pipeline-num-layers", "--pipeline-schedule", "--profile-schedule", "--profile-schedule-step"})
      if (cmd->count(flag) > 0) throw CLI::ValidationError(flag, "needs --pipeline-model-parallel-size above 1");
  if (!f.pipeline_schedule.empty() && f.pipeline_schedule != "1f1b" && f.pipeline_schedule != "interleaved" &&
      f.pipeline_schedule != "zero-bubble" && f.pipeline_schedule != "dualpipe")
    throw CLI::ValidationError(
        "--pipeline-schedule",
        fmt::format("'{}' is not one of 1f1b, interleaved, zero-bubble, dualpipe", f.pipeline_schedule));
  if (f.pipeline_schedule == "dualpipe") {
    if (interleaving)
      throw CLI::ValidationError("--num-layers-per-virtual-pipeline-stage",
                                 "makes model chunks for the interleaved schedule, but --pipeline-schedule dualpipe "
                                 "holds its own two per rank (stage r and a copy of stage p - 1 - r)");
    // The simulator's check of the pipeline size (the micro-batches per step are checked when the
    // ranks join: they depend on the data-parallel size).
    try {
      sim::check_dualpipe_sizes(pp, 2);
    } catch (const Error& e) {
      throw CLI::ValidationError("--pipeline-model-parallel-size", e.what());
    }
  }
  o.dualpipe_schedule = f.pipeline_schedule == "dualpipe";
  if (f.pipeline_schedule == "zero-bubble" && interleaving)
    throw CLI::ValidationError("--num-layers-per-virtual-pipeline-stage",
                               "makes model chunks for the interleaved schedule, but --pipeline-schedule zero-bubble "
                               "runs one chunk per rank (ZB-H1)");
  o.zero_bubble_schedule = f.pipeline_schedule == "zero-bubble";
  if (f.pipeline_schedule == "interleaved" && !interleaving)
    throw CLI::ValidationError(
        "--pipeline-schedule",
        "interleaved needs --num-layers-per-virtual-pipeline-stage (the layers of a model chunk)");
  if (f.pipeline_schedule == "1f1b" && interleaving)
    throw CLI::ValidationError("--num-layers-per-virtual-pipeline-stage",
                               "makes model chunks for the interleaved schedule, but --pipeline-schedule is 1f1b");
  if (!o.profile_schedule.empty() && o.profile_schedule.extension() != ".png")
    throw CLI::ValidationError("--profile-schedule", fmt::format("{} is not a .png path", o.profile_schedule.string()));
  if (pp > 1) {
    // The split of the layers, refused here naming the flags and the numbers.
    try {
      (void)models::pipeline_layer_ranges(
          f.config.num_layers,
          models::PipelineSplit{.stages = pp,
                                .layers_per_virtual_stage = o.num_layers_per_virtual_pipeline_stage,
                                .first_stage_layers = o.decoder_first_pipeline_num_layers,
                                .last_stage_layers = o.decoder_last_pipeline_num_layers});
    } catch (const Error& e) {
      throw CLI::ValidationError("--pipeline-model-parallel-size", e.what());
    }
  }
}

}  // namespace

void resolve_pretrain_gpt_flags(CLI::App* cmd, PretrainGptFlags& f, GptFlagsFor use) {
  for (const char* flag : {"--num-layers", "--hidden-size", "--num-attention-heads", "--seq-length"})
    if (cmd->count(flag) == 0) throw CLI::ValidationError(flag, "is required (the model's shape)");
  for (const auto& [flag, why] : unsupported_megatron_flags())
    if (cmd->count(flag) > 0) throw CLI::ValidationError(flag, "a Megatron flag Kiln does not support: " + why);
  auto& c = f.config;
  auto& o = f.options;
  if (c.num_query_groups > 0 && !f.group_query_attention)
    throw CLI::ValidationError("--num-query-groups", "needs --group-query-attention (as in Megatron)");
  if (f.group_query_attention && c.num_query_groups == 0)
    throw CLI::ValidationError("--group-query-attention", "needs --num-query-groups");
  // MLA, MTP: their sizes only mean something with the feature on.
  if (!c.multi_latent_attention)
    for (const char* flag :
         {"--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim"})
      if (cmd->count(flag) > 0) throw CLI::ValidationError(flag, "only applies with --multi-latent-attention");
  if (c.multi_latent_attention && f.group_query_attention)
    throw CLI::ValidationError("--group-query-attention",
                               "does not combine with --multi-latent-attention (MLA's keys and values come per head "
                               "from one shared latent, --kv-lora-rank)");
  if (cmd->count("--mtp-loss-scaling-factor") > 0 && c.mtp_num_layers == 0)
    throw CLI::ValidationError("--mtp-loss-scaling-factor", "only applies with --mtp-num-layers 1 or more");
  if (!f.recompute_method.empty() && f.recompute_granularity != "full")
    throw CLI::ValidationError("--recompute-method", "only applies with --recompute-granularity full");
  if (use == GptFlagsFor::PretrainGpt && cmd->count("--train-iters") == 0 && cmd->count("--train-samples") == 0)
    throw CLI::ValidationError("--train-iters", "give --train-iters or --train-samples");
  if (cmd->count("--save-interval") > 0 && o.save.empty())
    throw CLI::ValidationError("--save-interval", "needs --save (the folder to write checkpoints to)");
  if (cmd->count("--lr-wsd-decay-iters") > 0 && o.lr_decay_style != "WSD")
    throw CLI::ValidationError("--lr-wsd-decay-iters", "only applies with --lr-decay-style WSD");
  if (o.global_batch_size > 0 && o.global_batch_size % o.micro_batch_size != 0)
    throw CLI::ValidationError("--global-batch-size", fmt::format("{} is not a multiple of --micro-batch-size {}",
                                                                  o.global_batch_size, o.micro_batch_size));
  const bool has_tokenizer = !f.tokenizer.type.empty();
  if (has_tokenizer && f.vocab_size > 0)
    throw CLI::ValidationError("--vocab-size", "give the tokenizer flags or --vocab-size, not both");
  if (!has_tokenizer && f.vocab_size == 0)
    throw CLI::ValidationError("--tokenizer-type",
                               "the vocabulary size comes from the tokenizer: give the tokenizer flags the data was "
                               "preprocessed with (or --vocab-size)");
  c.vocab_size = has_tokenizer ? data::make_tokenizer(f.tokenizer.spec())->vocab_size() : f.vocab_size;
  c.add_bias_linear = !f.disable_bias_linear;
  c.position_embedding_type = models::parse_position_embedding(f.position_embedding_type);
  c.normalization = models::parse_normalization(f.normalization);
  c.transformer_impl = models::parse_transformer_impl(f.transformer_impl);
  c.cp_comm_type = models::parse_cp_comm_type(f.cp_comm_type);
  if (!f.recompute_granularity.empty())
    c.recompute_granularity = models::parse_recompute_granularity(f.recompute_granularity);
  if (!f.recompute_method.empty()) c.recompute_method = models::parse_recompute_method(f.recompute_method);
  apply_moe_flags(cmd, f.moe, c);  // MoE
  o.device = f.device.empty() ? default_device() : Device::parse(f.device);
  apply_fp8_flags(cmd, f.fp8, o.device, c);  // FP8
  c.validate();
  if (c.fp8 && (o.micro_batch_size * c.seq_length) % 16 != 0)
    throw CLI::ValidationError("--micro-batch-size",
                               fmt::format("--fp8-format needs --micro-batch-size x --seq-length ({} x {}) to be a "
                                           "multiple of 16 (the tokens of an FP8 GEMM)",
                                           o.micro_batch_size, c.seq_length));

  std::string joined;
  for (const auto& w : f.data_path) joined += (joined.empty() ? "" : " ") + w;
  if (!joined.empty() || use == GptFlagsFor::PretrainGpt) o.data_path = data::parse_data_path(joined);
  o.progress = !f.no_progress;
  o.gradient_accumulation_fusion = !f.no_gradient_accumulation_fusion;
  if (use == GptFlagsFor::PretrainGpt) resolve_pipeline_flags(cmd, f);
  o.skip_batches = train::parse_skip_list(f.skip_batches, "--skip-batches");
  if ((o.finetune || o.no_load_optim) && o.load.empty())
    throw CLI::ValidationError(o.finetune ? "--finetune" : "--no-load-optim", "needs --load");
}

}  // namespace kiln::cli
