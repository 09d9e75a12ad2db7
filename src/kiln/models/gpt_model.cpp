#include "kiln/models/gpt_model.h"

#include <string_view>

#include "kiln/autograd/functions.h"
#include "kiln/models/context_parallel_layout.h"
#include "kiln/models/moe_layer.h"
#include "kiln/models/output_layer_loss.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/nn/init.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

namespace {

// Dropout seeds come from a generator of their own, so that re-initialising the parameters
// (reset_parameters) and constructing draw the same weights.
constexpr std::uint64_t kDropoutSeedSalt = 0x64726f706f7574ull;  // "dropout"

bool ends_with(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

GptModel::GptModel(GptConfig config, std::uint64_t seed, const dist::ProcessGroups* groups)
    : Module("GPTModel"), config_(std::move(config)) {
  config_.validate();
  context_.ops = &core_ops_for(config_.transformer_impl);
  context_.groups = groups;
  context_.sequence_parallel = config_.sequence_parallel;
  context_.tp_comm_overlap = config_.tp_comm_overlap;
  context_.cp_comm_type = config_.cp_comm_type;
  KILN_CHECK(context_.tensor_parallel_size() == config_.tensor_model_parallel_size,
             "GPT model: --tensor-model-parallel-size is {}, but the tensor-parallel group has {} rank(s)",
             config_.tensor_model_parallel_size, context_.tensor_parallel_size());
  KILN_CHECK(context_.expert_parallel_size() == config_.expert_model_parallel_size,
             "GPT model: --expert-model-parallel-size is {}, but the expert-parallel group has {} rank(s)",
             config_.expert_model_parallel_size, context_.expert_parallel_size());
  KILN_CHECK(config_.num_experts == 0 || context_.expert_tensor_parallel_size() == config_.expert_tensor_parallel_size,
             "GPT model: --expert-tensor-parallel-size is {}, but the expert-tensor-parallel group has {} rank(s)",
             config_.expert_tensor_parallel_size, context_.expert_tensor_parallel_size());
  KILN_CHECK(context_.context_parallel_size() == config_.context_parallel_size,
             "GPT model: --context-parallel-size is {}, but the context-parallel group has {} rank(s)",
             config_.context_parallel_size, context_.context_parallel_size());

  Generator dropout_seeds(seed ^ kDropoutSeedSalt);
  embedding = register_module("embedding",
                              std::make_shared<LanguageModelEmbedding>(config_, dropout_seeds.next_seed(), context_));
  decoder = register_module("decoder", std::make_shared<TransformerBlock>(config_, dropout_seeds, context_));
  if (config_.untie_embeddings_and_output_weights)
    output_layer = register_module(
        "output_layer", std::make_shared<ParallelLinear>(ParallelLinearKind::Column, config_.hidden_size,
                                                         config_.padded_vocab_size(), /*bias=*/false, context_));
  if (config_.mtp_num_layers > 0) {  // MTP
    // FP8 in every MTP module when the run is FP8, whatever --first-last-layers-bf16 says: Megatron's
    // MTP layers run under the global fp8 context (get_fp8_context(config), no layer number).
    LayerContext mtp_context = context_;
    if (config_.fp8) mtp_context.fp8 = &config_.fp8_recipe;
    mtp = register_module("mtp", std::make_shared<MultiTokenPredictionBlock>(config_, dropout_seeds, mtp_context));
  }
  reset_parameters(seed);
}

void GptModel::reset_parameters(std::uint64_t seed) {
  Generator gen(seed);
  const TransformerLayerSpec spec = gpt_layer_spec(config_);
  const TensorParallelLayout layout = tensor_parallel_layout();
  const TensorParallelLayout expert_layout = expert_parallel_layout();
  const int tp = context_.tensor_parallel_size(), tp_rank = context_.tensor_parallel_rank();
  const TensorParallelLayout expert_tp_layout = expert_tensor_parallel_layout();
  const int ep = context_.expert_parallel_size(), ep_rank = context_.expert_parallel_rank();
  const int etp = context_.expert_tensor_parallel_size(), etp_rank = context_.expert_tensor_parallel_rank();
  NoGradGuard no_grad;
  // In registration order, so a seed gives the same weights on every device. A tensor-parallel
  // shard draws the whole tensor and keeps its slice: the same weights as one process from the same
  // seed, whatever the layout (the generator advances by the whole tensor on every rank alike).
  // Expert parallelism alike: a rank's experts are its block of the whole stack, and under expert
  // tensor parallelism its slice of that block.
  for (const auto& [name, p] : named_parameters()) {
    const bool expert = expert_layout.contains(name);
    const TensorParallelSplit split = expert ? split_of(expert_layout, name) : split_of(layout, name);
    const TensorParallelSplit inner = split_of(expert_tp_layout, name);
    const int ranks = expert ? ep : tp, rank = expert ? ep_rank : tp_rank;
    Tensor whole =
        split.replicated() && inner.replicated()
            ? p
            : Tensor::empty(whole_shape(whole_shape(p.shape(), inner, etp), split, ranks), p.dtype(), p.device());
    if (ends_with(name, ".bias")) {
      nn::init::zeros_(whole);
    } else if (name.find("norm.") != std::string::npos) {  // *layernorm. and MTP's enorm. / hnorm.
      nn::init::ones_(whole);
    } else if (ends_with(name, "linear_proj.weight") || ends_with(name, "linear_fc2.weight") ||
               ends_with(name, "experts.weight2")) {  // MoE: the experts' linear_fc2
      nn::init::normal_(whole, 0.0, spec.init.output_std, &gen);
    } else {
      nn::init::normal_(whole, 0.0, spec.init.std, &gen);
    }
    if (!split.replicated() || !inner.replicated()) {
      const Tensor block = split.replicated() ? whole : shard_of(whole, split, rank, ranks, name);
      Tensor(p).copy_(inner.replicated() ? block : shard_of(block, inner, etp_rank, etp, name));
    }
  }
}

TensorParallelLayout GptModel::expert_parallel_layout() const {
  TensorParallelLayout layout;
  if (context_.expert_parallel_size() == 1 && context_.expert_tensor_parallel_size() == 1) return layout;
  for (const auto& [name, p] : named_parameters())
    if (ends_with(name, "mlp.experts.weight1") || ends_with(name, "mlp.experts.weight2")) layout[name] = {.dim = 0};
  return layout;
}

TensorParallelLayout GptModel::expert_tensor_parallel_layout() const {
  TensorParallelLayout layout;
  if (context_.expert_tensor_parallel_size() == 1) return layout;
  for (const auto& [name, p] : named_parameters()) {
    if (ends_with(name, "mlp.experts.weight1")) layout[name] = {.dim = 1, .blocks = config_.swiglu ? 2 : 1};
    if (ends_with(name, "mlp.experts.weight2")) layout[name] = {.dim = 2};
  }
  return layout;
}

void GptModel::reseed_tensor_parallel_dropout() {
  reseed_tensor_parallel_dropout_of(*this, context_.tensor_parallel_size(), context_.tensor_parallel_rank(),
                                    config_.sequence_parallel);
}

void reseed_tensor_parallel_dropout_of(const nn::Module& model, int tp, int rank, bool sequence_parallel) {
  if (tp == 1 || rank == 0) return;
  for (const auto& [name, m] : model.named_modules()) {
    auto d = std::dynamic_pointer_cast<nn::Dropout>(m);
    if (!d) continue;
    const bool per_rank =
        ends_with(name, "attention_dropout") ||
        (sequence_parallel && (ends_with(name, "self_attn_dropout") || ends_with(name, "mlp_dropout") ||
                               ends_with(name, "embedding_dropout")));
    // Rank 0's seed is base ^ mix(0) (or the base itself, from a one-process checkpoint, where rank
    // 0 keeps it): mix(0) ^ mix(r) turns rank 0's into a stream of rank r's alone.
    if (per_rank) d->seed = tensor_parallel_dropout_seed(tensor_parallel_dropout_seed(d->seed, 0), rank);
  }
}

TensorParallelLayout GptModel::tensor_parallel_layout() const {
  TensorParallelLayout layout;
  if (context_.tensor_parallel_size() == 1) return layout;
  layout = tensor_parallel_layout_of(*this, context_.sequence_parallel);
  layout["embedding.word_embeddings.weight"] = {.dim = 0};  // VocabParallelEmbedding's rows
  return layout;
}

TensorParallelLayout tensor_parallel_layout_of(const nn::Module& model, bool sequence_parallel) {
  TensorParallelLayout layout;
  for (const auto& [name, m] : model.named_modules()) {
    const std::string prefix = name.empty() ? std::string() : name + ".";
    if (auto linear = std::dynamic_pointer_cast<ParallelLinear>(m); linear && linear->tensor_parallel_size == 1) {
      // A linear built without the groups in a tensor-parallel model (MLA's down projections): whole on
      // every rank, applied to this rank's tokens (under sequence parallelism its slice of the sequence).
      layout[prefix + "weight"] = {.sequence_parallel = sequence_parallel};
      if (linear->bias.defined()) layout[prefix + "bias"] = {.sequence_parallel = sequence_parallel};
    } else if (linear) {
      layout[prefix + "weight"] = linear->weight_split();
      if (linear->bias.defined()) layout[prefix + "bias"] = linear->bias_split();
    } else if (auto norm = std::dynamic_pointer_cast<TransformerNorm>(m)) {
      // Applied to this rank's slice of the sequence under sequence parallelism.
      const TensorParallelSplit split{.sequence_parallel = sequence_parallel};
      layout[prefix + "weight"] = split;
      if (norm->bias.defined()) layout[prefix + "bias"] = split;
    } else if (std::dynamic_pointer_cast<TopKRouter>(m)) {
      // MoE (expert tensor parallelism 1): the router is whole on every rank and, under sequence
      // parallelism, routes this rank's slice of the sequence (Megatron marks its weight
      // sequence_parallel).
      layout[prefix + "weight"] = {.sequence_parallel = sequence_parallel};
    } else if (std::dynamic_pointer_cast<GroupedMlp>(m)) {
      // The experts are whole on every tensor-parallel rank; under sequence parallelism each rank's
      // copy sees its own tokens. Split over an expert-parallel group, their gradients are not
      // summed over the tensor-parallel group but scaled as the expert-parallel layout says
      // (train/data_parallel.h); without one they are summed like the router's.
      layout[prefix + "weight1"] = {.sequence_parallel = sequence_parallel};
      layout[prefix + "weight2"] = {.sequence_parallel = sequence_parallel};
    }
  }
  return layout;
}

Tensor GptModel::output_logits(const Tensor& hidden) {
  const dist::Communicator* tp = context_.tensor_parallel_group();
  if (tp == nullptr) return linear(hidden, output_weight());
  // The output layer is column-parallel over the vocabulary: each rank's logits for its rows,
  // gathered along the vocabulary.
  const Tensor input = config_.sequence_parallel ? gather_from_sequence_parallel_region(hidden, *tp)
                                                 : copy_to_tensor_parallel_region(hidden, *tp);
  return gather_from_tensor_parallel_region(linear(input, output_weight()), *tp);
}

const Tensor& GptModel::output_weight() const {
  return output_layer ? output_layer->weight : embedding->word_embeddings->weight;
}

const RopeTable* GptModel::rope_table(Device device, std::int64_t positions) {
  if (config_.position_embedding_type != PositionEmbedding::Rope) return nullptr;
  const std::int64_t rows = config_.max_positions();
  KILN_CHECK(positions <= rows, "GPT model: position {} is beyond --max-position-embeddings ({})", positions, rows);
  if (!rope_.cos.defined() || rope_.cos.device() != device)
    rope_ = context_.ops->make_rope_table(config_.rope_dim(), rows, config_.rotary_base, config_.rope_llama3_scaling,
                                          config_.rope_scaling_factor, device);
  return &rope_;
}

Tensor GptModel::hidden_states(const Tensor& tokens, const PositionContext& positions) {
  KILN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64, "GPT model: expected int64 tokens [B, T], got {}",
             tokens.describe());
  const Device device = output_weight().device();
  KILN_CHECK(tokens.device() == device, "GPT model: tokens are on {}, the model on {}", tokens.device().str(),
             device.str());
  PositionContext p = positions;
  if (const int cp = context_.context_parallel_size(); cp > 1) {
    // This rank's tokens are two chunks of the sequence: the embeddings and rotations at their
    // true positions (RoPE through a table of this rank's rows, read from position 0).
    KILN_CHECK(p.position_offset == 0 && p.cache == nullptr,
               "GPT model: with context parallelism the forward takes whole sequences from position 0");
    const std::int64_t seq = tokens.size(1) * cp;
    const std::vector<std::int64_t> ids = context_parallel_positions(seq, cp, context_.context_parallel_rank());
    const Tensor position_ids = Tensor::from_vector(ids, {tokens.size(1)}, device);
    if (p.rope == nullptr && config_.position_embedding_type == PositionEmbedding::Rope)
      p.rope = &context_parallel_rope(*rope_table(device, seq), seq, cp, context_.context_parallel_rank(),
                                      context_parallel_rope_);
    return decoder->forward(embedding->forward(tokens, 0, position_ids), p);
  }
  if (p.rope == nullptr) p.rope = rope_table(device, p.position_offset + tokens.size(1));
  return decoder->forward(embedding->forward(tokens, p.position_offset), p);
}

Tensor GptModel::forward(const Tensor& tokens) {
  const int cp = context_.context_parallel_size();
  return output_logits(
      hidden_states(context_parallel_slice(tokens, cp, context_.context_parallel_rank()), PositionContext{}));
}

Tensor GptModel::forward(const Tensor& tokens, KvCache& cache) {
  KILN_CHECK(cache.num_layers() == config_.num_layers && cache.batch() == tokens.size(0),
             "GPT model: the KV cache has {} layers and batch {}, the model {} layers and the tokens batch {}",
             cache.num_layers(), cache.batch(), config_.num_layers, tokens.size(0));
  NoGradGuard no_grad;
  PositionContext positions;
  positions.position_offset = cache.length();
  positions.cache = &cache;
  Tensor logits = output_logits(hidden_states(tokens, positions));
  cache.advance(tokens.size(1));
  return logits;
}

Tensor GptModel::loss(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask) {
  KILN_CHECK(labels.shape() == tokens.shape(), "GPT loss: labels {} do not match tokens {}", labels.describe(),
             tokens.describe());
  KILN_CHECK(!loss_mask.defined() || loss_mask.shape() == tokens.shape(),
             "GPT loss: loss_mask {} does not match tokens {}", loss_mask.describe(), tokens.describe());
  // Context parallelism (Megatron's get_batch_on_this_cp_rank): this rank's part of each sequence.
  const int c = context_.context_parallel_size(), r = context_.context_parallel_rank();
  const auto local = [c, r](const Tensor& x) { return c > 1 && x.defined() ? context_parallel_slice(x, c, r) : x; };
  const Tensor hidden = hidden_states(local(tokens), PositionContext{});
  Tensor main = token_loss(hidden, local(labels), local(loss_mask));
  mtp_losses_.clear();
  if (!mtp || !grad_enabled()) return main;
  // MTP: the scaled mean of the depths' losses enters the gradient only (x - x.detach() is 0 in value).
  // The depths shift the whole sequences' tokens, labels and mask, then take this rank's part.
  PositionContext positions;
  positions.rope = c == 1 ? rope_table(output_weight().device(), tokens.size(1))
                   : config_.position_embedding_type == PositionEmbedding::Rope ? &context_parallel_rope_
                                                                                : nullptr;
  std::vector<Tensor> depths = mtp->losses(
      hidden, tokens, labels, loss_mask, *embedding,
      [this](const Tensor& h, const Tensor& l, const Tensor& m) { return token_loss(h, l, m); }, positions, local);
  for (const Tensor& l : depths) mtp_losses_.push_back(l.detach());
  return add_mtp_gradient(main, depths, config_.mtp_loss_scaling_factor);
}

Tensor GptModel::token_loss(const Tensor& hidden, const Tensor& labels, const Tensor& loss_mask) {
  const dist::Communicator* cp = context_.context_parallel_group();
  if (cp == nullptr) return cross_entropy(hidden, labels, loss_mask);
  return context_parallel_token_loss([&](const Tensor& mask) { return cross_entropy(hidden, labels, mask); }, labels,
                                     loss_mask, *cp);
}

Tensor GptModel::cross_entropy(const Tensor& hidden, const Tensor& labels, const Tensor& loss_mask) {
  return output_layer_cross_entropy(hidden, output_weight(), labels, loss_mask, config_, context_);
}

KvCache GptModel::make_kv_cache(std::int64_t batch, std::int64_t max_tokens) const {
  KILN_CHECK(max_tokens <= config_.max_positions(),
             "GPT model: a KV cache of {} tokens is longer than --max-position-embeddings ({})", max_tokens,
             config_.max_positions());
  const Tensor& w = output_weight();
  if (config_.multi_latent_attention)  // MLA: the latent c_kv and the shared rotated key k_pe per token
    return KvCache(config_.num_layers, batch, max_tokens, 1, config_.kv_lora_rank, 1, config_.qk_pos_emb_head_dim,
                   w.dtype(), w.device());
  return KvCache(config_.num_layers, batch, max_tokens, config_.query_groups() / context_.tensor_parallel_size(),
                 config_.head_dim(), w.dtype(), w.device());
}

std::vector<std::shared_ptr<nn::Dropout>> GptModel::dropout_modules() const {
  std::vector<std::shared_ptr<nn::Dropout>> out;
  for (const auto& [name, m] : named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) out.push_back(d);
  return out;
}

}  // namespace kiln::models
