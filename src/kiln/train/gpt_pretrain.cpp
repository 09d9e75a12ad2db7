#include "kiln/train/gpt_pretrain.h"

#include <fmt/format.h>

#include <algorithm>

#include "kiln/models/gpt_model.h"
#include "kiln/models/gpt_pipeline_stage.h"
#include "kiln/runtime/backend.h"
#include "kiln/tensor/collectives.h"
#include "kiln/tensor/random_generator.h"
#include "kiln/train/moe_training.h"

namespace kiln::train {

namespace {

double gib(std::size_t bytes) { return static_cast<double>(bytes) / 1073741824.0; }

std::string flag_value(double v) { return fmt::format("{}", v); }

}  // namespace

namespace {

std::string describe_model(const models::GptConfig& config) {
  return fmt::format("GPT {:.1f}M ({} layers, hidden {}, {} heads{}, {}{}{})", config.num_parameters() / 1e6,
                     config.num_layers, config.hidden_size, config.num_attention_heads,
                     config.query_groups() != config.num_attention_heads
                         ? fmt::format(" / {} groups", config.query_groups())
                         : std::string(),
                     models::to_string(config.position_embedding_type), config.swiglu ? ", SwiGLU" : "",
                     config.fp8 ? fmt::format(", fp8 {} {} GEMMs", te::to_string(config.fp8_recipe.format),
                                              te::to_string(config.fp8_recipe.recipe))
                                : std::string());
}

// Pipeline parallelism: this rank's stage of the model (models/gpt_pipeline_stage.h), trained
// through the schedule (pipeline_executor.h).
GptTrainSummary pretrain_gpt_pipeline(const models::GptConfig& config, const GptTrainOptions& options,
                                      const std::vector<std::pair<std::string, std::string>>& all_flags,
                                      const GptTrainCallbacks& callbacks) {
  const models::PipelineSplit split{.stages = options.pipeline_parallel_size(),
                                    .layers_per_virtual_stage = options.num_layers_per_virtual_pipeline_stage,
                                    .first_stage_layers = options.decoder_first_pipeline_num_layers,
                                    .last_stage_layers = options.decoder_last_pipeline_num_layers,
                                    .dualpipe = options.dualpipe_schedule};
  auto stage = std::make_shared<models::GptPipelineStage>(config, options.seed, options.pipeline_parallel_rank(), split,
                                                          options.process_groups.get());
  auto pipeline = std::make_shared<PipelineStageHandle>();
  pipeline->chunks = stage->num_chunks();
  pipeline->is_first = [stage](int c) { return stage->is_first_virtual_stage(c); };
  pipeline->is_last = [stage](int c) { return stage->is_last_virtual_stage(c); };
  pipeline->forward = [stage](int c, const Tensor& input, const Tensor& tokens, const Tensor& labels,
                              const Tensor& mask) { return stage->forward_chunk(c, input, tokens, labels, mask); };
  pipeline->hidden_size = config.hidden_size;
  // Between stages each rank passes its part of the sequence: its context-parallel chunks, of which
  // its sequence-parallel slice.
  pipeline->sequence_split =
      config.context_parallel_size * (config.sequence_parallel ? config.tensor_model_parallel_size : 1);
  if (options.dualpipe_schedule) {
    // Each chunk's parameters by name, and chunk 1's (the copy of stage p - 1 - r) state and dropout
    // names (dualpipe_grads.h sums the copies' gradients; checkpoints hold the originals).
    pipeline->dualpipe = true;
    pipeline->chunk_parameters.resize(2);
    for (const auto& [name, t] : stage->named_parameters())
      for (int c = 0; c < 2; ++c)
        if (stage->in_chunk(name, c)) pipeline->chunk_parameters[static_cast<std::size_t>(c)].emplace_back(name, t);
    for (auto& chunk : pipeline->chunk_parameters)
      std::sort(chunk.begin(), chunk.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
    for (const auto& [name, t] : stage->state_dict())
      if (stage->in_chunk(name, 1)) pipeline->mirror_state_names.push_back(name);
    for (const auto& [name, m] : stage->named_modules())
      if (std::dynamic_pointer_cast<nn::Dropout>(m) && stage->in_chunk(name, 1))
        pipeline->mirror_dropout_names.push_back(name);
    if (!config.untie_embeddings_and_output_weights && stage->tied_output_copy().defined()) {
      // Ranks 0 and p - 1: both ends of both directions. Their sum is taken on the rank, after the
      // pair's: no embedding group (and no shared_embedding for the trainer to reduce over one).
      pipeline->dualpipe_word_embeddings = stage->word_embeddings();
      pipeline->dualpipe_tied_copy = stage->tied_output_copy();
      pipeline->tied_copy = stage->tied_output_copy();
      pipeline->tied_copy_name = models::GptPipelineStage::kTiedCopyName;
    }
  } else {
    pipeline->shared_embedding = stage->embedding_group_tensor();
    pipeline->tied_copy = stage->tied_output_copy();
    pipeline->tied_copy_name = stage->tied_copy_name();
    // MTP: the last stage's copy of the embedding (its state comes from the first stage's).
    pipeline->mirror_state_names = stage->embedding_copy_state_names();
    pipeline->mirror_dropout_names = stage->embedding_copy_dropout_names();
  }
  pipeline->whole_parameters = stage->whole_parameters();
  pipeline->whole_dropout_names = stage->whole_dropout_names();
  LanguageModelHandle handle;
  handle.module = stage;
  handle.pipeline = pipeline;
  if (config.mtp_num_layers > 0) {
    // MTP: the depths' losses of the step's micro-batches, summed on the last stage, sent to every stage.
    const Device device = stage->parameters().front().device();
    handle.auxiliary_losses = [stage, device, group = *options.pipeline_parallel, d = config.mtp_num_layers] {
      Tensor sums = stage->take_mtp_loss_sums();
      if (!sums.defined()) sums = Tensor::zeros({d}, DType::F32, device);
      dist::broadcast(group, sums, group.size() - 1).wait();
      std::vector<std::pair<std::string, Tensor>> out;
      for (std::int64_t k = 0; k < d; ++k)
        out.emplace_back(fmt::format("mtp_{}", k + 1), sums.narrow(0, k, 1).reshape({}));
      return out;
    };
  }
  handle.tensor_parallel_layout = stage->tensor_parallel_layout();
  handle.tp_comm_overlap = config.tp_comm_overlap;
  handle.expert_parallel_layout = stage->expert_parallel_layout();
  handle.expert_tensor_parallel_layout = stage->expert_tensor_parallel_layout();
  if (config.tensor_model_parallel_size > 1)
    handle.after_random_state_load = [stage] { stage->reseed_tensor_parallel_dropout(); };
  handle.seq_length = config.seq_length;
  handle.flops_per_token = config.flops_per_token();
  if (config.fp8_param_gather) handle.fp8_param_gather = config.fp8_recipe;
  handle.shape_flags = gpt_shape_flags(config);
  handle.all_flags = all_flags;
  handle.description = describe_model(config);
  // MoE: each stage's routers; the logged statistics are gathered over the stages.
  MoePipeline moe{
      .group = *options.pipeline_parallel, .moe_layers = {}, .num_experts = config.num_experts, .dualpipe_pair = {}};
  for (std::int64_t i = 0; i < config.num_layers; ++i)
    if (config.is_moe_layer(i)) moe.moe_layers.push_back(i);
  if (options.dualpipe_schedule && config.num_experts > 0) {
    const int p = options.pipeline_parallel_size(), r = options.pipeline_parallel_rank();
    moe.dualpipe_pair = options.pipeline_parallel->split(std::min(r, p - 1 - r), r);  // collective over the stages
  }
  attach_moe_training(handle, *stage, options.num_micro_batches(), options.data_parallel, std::move(moe));
  return train_language_model(std::move(handle), options, callbacks);
}

}  // namespace

TrainingMemoryEstimate estimate_gpt_training_memory(const models::GptConfig& c, std::int64_t micro_batch_size,
                                                    bool bf16) {
  using models::RecomputeGranularity;
  using models::RecomputeMethod;
  TrainingMemoryEstimate e;
  const auto n = static_cast<std::size_t>(c.num_parameters());
  e.parameters = n * (bf16 ? 2 : 4);
  e.gradients = n * 4;
  e.optimizer = n * 8 + (bf16 ? n * 4 : 0);

  const double sb = static_cast<double>(c.seq_length) * static_cast<double>(micro_batch_size);
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(c.ffn_hidden());
  const double q = static_cast<double>(c.num_attention_heads * c.head_dim());
  const double kv = static_cast<double>(c.query_groups() * c.head_dim());
  const double f1 = c.swiglu ? 2 * f : f;
  const double scale = bf16 ? 1.0 : 2.0;  // the formula counts 16-bit values at 2 bytes
  const double full_layer =
      sb * (4 * h + (2 * h + 2 * (q + 2 * kv) + 2 * q + h) + (2 * h + 2 * f1 + 2 * f + h)) * scale;
  const double layer_input = 2 * sb * h * scale;
  const double layers = static_cast<double>(c.num_layers);
  double stored = layers * full_layer;
  if (c.recompute_granularity == RecomputeGranularity::Full) {
    const double r = static_cast<double>(std::min(c.recompute_num_layers, c.num_layers));
    if (c.recompute_method == RecomputeMethod::Uniform)  // chunk inputs, plus one chunk rebuilt in the backward
      stored = std::ceil(layers / r) * layer_input + r * full_layer;
    else  // block: the first r layers keep their inputs only (one rebuilt at a time)
      stored = r * layer_input + (layers - r) * full_layer + full_layer;
  }
  const double logits = sb * static_cast<double>(c.padded_vocab_size()) * 4;
  e.activations = static_cast<std::size_t>(stored + logits);
  return e;
}

std::string describe(const TrainingMemoryEstimate& e) {
  return fmt::format(
      "parameters {:.2f} GiB + gradients {:.2f} GiB + optimizer {:.2f} GiB + activations {:.2f} GiB = {:.2f} GiB",
      gib(e.parameters), gib(e.gradients), gib(e.optimizer), gib(e.activations), gib(e.total()));
}

std::vector<std::pair<std::string, std::string>> gpt_shape_flags(const models::GptConfig& c) {
  std::vector<std::pair<std::string, std::string>> f = {
      {"--num-layers", std::to_string(c.num_layers)},
      {"--hidden-size", std::to_string(c.hidden_size)},
      {"--ffn-hidden-size", std::to_string(c.ffn_hidden())},
      {"--num-attention-heads", std::to_string(c.num_attention_heads)},
      {"--num-query-groups", std::to_string(c.query_groups())},
      {"--kv-channels", std::to_string(c.head_dim())},
      {"--max-position-embeddings", std::to_string(c.max_positions())},
      {"--position-embedding-type", std::string(models::to_string(c.position_embedding_type))},
      {"--normalization", std::string(models::to_string(c.normalization))},
      {"--swiglu", c.swiglu ? "true" : "false"},
      {"--disable-bias-linear", c.add_bias_linear ? "false" : "true"},
      {"--untie-embeddings-and-output-weights", c.untie_embeddings_and_output_weights ? "true" : "false"},
      {"vocabulary size (the tokenizer flags, --make-vocab-size-divisible-by)", std::to_string(c.padded_vocab_size())},
  };
  if (c.position_embedding_type == models::PositionEmbedding::Rope) {
    f.emplace_back("--rotary-base", flag_value(c.rotary_base));
    f.emplace_back("--use-rope-scaling", c.rope_llama3_scaling ? "true" : "false");
    // The factor changes the frequencies (the model's meaning) only with the scaling on.
    if (c.rope_llama3_scaling) f.emplace_back("--rope-scaling-factor", flag_value(c.rope_scaling_factor));
  }
  f.emplace_back("--norm-epsilon", flag_value(c.norm_epsilon));
  append_moe_shape_flags(c, f);  // MoE
  // MLA, MTP: a checkpoint made with other sizes (or without them) is refused naming the flag.
  // Recorded only when on, so checkpoints of dense models without MTP keep their flags.
  if (c.multi_latent_attention) {
    f.emplace_back("--multi-latent-attention", "true");
    f.emplace_back("--q-lora-rank", std::to_string(c.q_lora_rank));
    f.emplace_back("--kv-lora-rank", std::to_string(c.kv_lora_rank));
    f.emplace_back("--qk-head-dim", std::to_string(c.qk_head_dim));
    f.emplace_back("--qk-pos-emb-head-dim", std::to_string(c.qk_pos_emb_head_dim));
    f.emplace_back("--v-head-dim", std::to_string(c.v_head_dim));
  }
  if (c.mtp_num_layers > 0) f.emplace_back("--mtp-num-layers", std::to_string(c.mtp_num_layers));
  return f;
}

GptTrainSummary pretrain_gpt(const models::GptConfig& config, const GptTrainOptions& options,
                             const std::vector<std::pair<std::string, std::string>>& all_flags,
                             const GptTrainCallbacks& callbacks) {
  config.validate();
  auto say = [&](const std::string& text) {
    if (!options.is_first_rank()) return;  // data and tensor parallelism: rank 0 speaks
    if (callbacks.message)
      callbacks.message(text);
    else
      fmt::print("{}\n", text);
    std::fflush(stdout);
  };
  // Refused before a byte is allocated: a run that cannot fit would die later with a bare
  // out-of-memory error, after the data was read and perhaps a checkpoint loaded.
  TrainingMemoryEstimate estimate = estimate_gpt_training_memory(config, options.micro_batch_size, options.bf16);
  if (config.tensor_model_parallel_size > 1) {
    // Each rank holds about 1/tp of the weights and their state (the activations are kept whole:
    // an upper bound). MoE: the routed experts are whole on every tensor-parallel rank (expert
    // tensor parallelism 1), so only the rest is divided; they are counted whole (an upper bound
    // under expert parallelism too).
    const double tp = config.tensor_model_parallel_size;
    const double fm = static_cast<double>(config.moe_ffn_hidden()), h = static_cast<double>(config.hidden_size);
    const double experts = config.num_experts > 0 ? static_cast<double>(config.num_moe_layers()) *
                                                        static_cast<double>(config.num_experts) *
                                                        (h * (config.swiglu ? 2 * fm : fm) + fm * h)
                                                  : 0.0;
    const double whole_share = std::min(1.0, experts / std::max(1.0, static_cast<double>(config.num_parameters())));
    auto per_rank = [&](std::size_t bytes) {
      return static_cast<std::size_t>(static_cast<double>(bytes) * ((1 - whole_share) / tp + whole_share));
    };
    estimate.parameters = per_rank(estimate.parameters);
    estimate.gradients = per_rank(estimate.gradients);
    estimate.optimizer = per_rank(estimate.optimizer);
  }
  if (options.pipeline_parallel_size() > 1) {
    // Each stage holds about 1/pp of the weights and their state (the activations are one micro-batch
    // of the whole model's: the first stage holds up to pp micro-batches of 1/pp of the layers).
    const std::size_t pp = static_cast<std::size_t>(options.pipeline_parallel_size());
    // DualPipe: two stages per rank (stage r and a copy of stage p - 1 - r), each with its state.
    const std::size_t copies = options.dualpipe_schedule ? 2 : 1;
    estimate.parameters = estimate.parameters * copies / pp;
    estimate.gradients = estimate.gradients * copies / pp;
    estimate.optimizer = estimate.optimizer * copies / pp;
  }
  const DeviceProperties props = backend_for(options.device).properties(options.device.index);
  say(fmt::format("memory estimate on {}: {}; {:.2f} GiB free", options.device.str(), describe(estimate),
                  gib(props.free_memory)));
  KILN_CHECK(props.free_memory == 0 || estimate.total() <= props.free_memory,
             "the model does not fit in {}'s memory: it needs about {:.2f} GiB ({}), {:.2f} GiB are free. Lower "
             "--micro-batch-size (keeping --global-batch-size: more accumulation), add --recompute-granularity full, "
             "use --bf16, or shrink the model (--num-layers, --hidden-size, --seq-length)",
             options.device.str(), gib(estimate.total()), describe(estimate), gib(props.free_memory));

  // Tensor parallelism: the model is built over the run's process groups, whose tensor-parallel group
  // must be the trainer's (cmd_pretrain_gpt builds both from the world).
  const int tp = options.tensor_parallel_size();
  KILN_CHECK(tp == config.tensor_model_parallel_size && (tp == 1 || options.process_groups != nullptr),
             "pretrain-gpt: --tensor-model-parallel-size is {} but the run has a tensor-parallel group of {} rank(s) "
             "(launch with mpirun -np <a multiple of {}>)",
             config.tensor_model_parallel_size, tp, config.tensor_model_parallel_size);
  // Expert parallelism: the experts split over the groups' expert-parallel group (built with the same size).
  const int ep = config.expert_model_parallel_size;
  KILN_CHECK(ep == 1 || (options.process_groups != nullptr && options.process_groups->ep().size() == ep),
             "pretrain-gpt: --expert-model-parallel-size is {} but the run has an expert-parallel group of {} rank(s) "
             "(launch with mpirun -np <a multiple of {}>)",
             ep, options.process_groups ? options.process_groups->ep().size() : 1, ep);
  // Expert tensor parallelism likewise: each expert split over the groups' expert-tensor-parallel group.
  const int etp = config.expert_tensor_parallel_size;
  KILN_CHECK(
      config.num_experts == 0 || options.process_groups == nullptr || options.process_groups->expert_tp().size() == etp,
      "pretrain-gpt: --expert-tensor-parallel-size is {} but the run's expert-tensor-parallel group has {} "
      "rank(s): build the process groups with etp = {}",
      etp, options.process_groups ? options.process_groups->expert_tp().size() : 1, etp);
  KILN_CHECK(etp == 1 || options.process_groups != nullptr,
             "pretrain-gpt: --expert-tensor-parallel-size is {} but the run has no process groups (launch with "
             "mpirun -np <a multiple of {}>)",
             etp, etp);
  // Context parallelism: likewise, the model's context-parallel group must be the trainer's.
  const int cp = options.context_parallel_size();
  KILN_CHECK(cp == config.context_parallel_size && (cp == 1 || options.process_groups != nullptr),
             "pretrain-gpt: --context-parallel-size is {} but the run has a context-parallel group of {} rank(s) "
             "(launch with mpirun -np <a multiple of {}>)",
             config.context_parallel_size, cp, config.context_parallel_size * tp);
  manual_seed(options.seed);
  if (options.pipeline_parallel_size() > 1) return pretrain_gpt_pipeline(config, options, all_flags, callbacks);
  auto model = std::make_shared<models::GptModel>(
      config, options.seed, tp > 1 || ep > 1 || etp > 1 || cp > 1 ? options.process_groups.get() : nullptr);
  LanguageModelHandle handle;
  handle.module = model;
  handle.loss = [model](const Tensor& tokens, const Tensor& labels, const Tensor& mask) {
    return model->loss(tokens, labels, mask);
  };
  if (config.mtp_num_layers > 0)  // MTP: the per-depth losses, logged as mtp_1 loss .. mtp_D loss
    handle.auxiliary_losses = [model] {
      std::vector<std::pair<std::string, Tensor>> out;
      for (std::size_t k = 0; k < model->mtp_losses().size(); ++k)
        out.emplace_back(fmt::format("mtp_{}", k + 1), model->mtp_losses()[k]);
      return out;
    };
  handle.seq_length = config.seq_length;
  handle.tensor_parallel_layout = model->tensor_parallel_layout();
  handle.tp_comm_overlap = config.tp_comm_overlap;
  handle.expert_parallel_layout = model->expert_parallel_layout();
  handle.expert_tensor_parallel_layout = model->expert_tensor_parallel_layout();
  if (tp > 1) handle.after_random_state_load = [model] { model->reseed_tensor_parallel_dropout(); };
  handle.flops_per_token = config.flops_per_token();
  if (config.fp8_param_gather) handle.fp8_param_gather = config.fp8_recipe;
  handle.shape_flags = gpt_shape_flags(config);
  handle.all_flags = all_flags;
  handle.description = describe_model(config);
  attach_moe_training(handle, *model, options.num_micro_batches(), options.data_parallel);  // MoE
  return train_language_model(std::move(handle), options, callbacks);
}

}  // namespace kiln::train
