#include "kiln/models/gpt_model.h"

#include <string_view>

#include "kiln/autograd/functions.h"
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
  context_.tensor_parallel_size();

  Generator dropout_seeds(seed ^ kDropoutSeedSalt);
  embedding = register_module("embedding",
                              std::make_shared<LanguageModelEmbedding>(config_, dropout_seeds.next_seed(), context_));
  decoder = register_module("decoder", std::make_shared<TransformerBlock>(config_, dropout_seeds, context_));
  if (config_.untie_embeddings_and_output_weights)
    output_layer = register_module(
        "output_layer", std::make_shared<ParallelLinear>(ParallelLinearKind::Column, config_.hidden_size,
                                                         config_.padded_vocab_size(), /*bias=*/false, context_));
  if (config_.mtp_num_layers > 0)  // MTP
    mtp = register_module("mtp", std::make_shared<MultiTokenPredictionBlock>(config_, dropout_seeds, context_));
  reset_parameters(seed);
}

void GptModel::reset_parameters(std::uint64_t seed) {
  Generator gen(seed);
  const TransformerLayerSpec spec = gpt_layer_spec(config_);
  NoGradGuard no_grad;
  // In registration order, so a seed gives the same weights on every device.
  for (const auto& [name, p] : named_parameters()) {
    if (ends_with(name, ".bias")) {
      nn::init::zeros_(p);
    } else if (name.find("norm.") != std::string::npos) {  // *layernorm. and MTP's enorm. / hnorm.
      nn::init::ones_(p);
    } else if (ends_with(name, "linear_proj.weight") || ends_with(name, "linear_fc2.weight") ||
               ends_with(name, "experts.weight2")) {  // MoE: the experts' linear_fc2
      nn::init::normal_(p, 0.0, spec.init.output_std, &gen);
    } else {
      nn::init::normal_(p, 0.0, spec.init.std, &gen);
    }
  }
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
  if (p.rope == nullptr) p.rope = rope_table(device, p.position_offset + tokens.size(1));
  return decoder->forward(embedding->forward(tokens, p.position_offset), p);
}

Tensor GptModel::forward(const Tensor& tokens) {
  return linear(hidden_states(tokens, PositionContext{}), output_weight());
}

Tensor GptModel::forward(const Tensor& tokens, KvCache& cache) {
  KILN_CHECK(cache.num_layers() == config_.num_layers && cache.batch() == tokens.size(0),
             "GPT model: the KV cache has {} layers and batch {}, the model {} layers and the tokens batch {}",
             cache.num_layers(), cache.batch(), config_.num_layers, tokens.size(0));
  NoGradGuard no_grad;
  PositionContext positions;
  positions.position_offset = cache.length();
  positions.cache = &cache;
  Tensor logits = linear(hidden_states(tokens, positions), output_weight());
  cache.advance(tokens.size(1));
  return logits;
}

Tensor GptModel::loss(const Tensor& tokens, const Tensor& labels, const Tensor& loss_mask) {
  KILN_CHECK(labels.shape() == tokens.shape(), "GPT loss: labels {} do not match tokens {}", labels.describe(),
             tokens.describe());
  KILN_CHECK(!loss_mask.defined() || loss_mask.shape() == tokens.shape(),
             "GPT loss: loss_mask {} does not match tokens {}", loss_mask.describe(), tokens.describe());
  Tensor hidden = hidden_states(tokens, PositionContext{});
  const std::int64_t n = tokens.numel();
  Tensor main =
      context_.ops->linear_cross_entropy(hidden.reshape({n, config_.hidden_size}), output_weight(), labels.reshape({n}),
                                         loss_mask.defined() ? loss_mask.reshape({n}) : Tensor());
  mtp_losses_.clear();
  if (!mtp || !grad_enabled()) return main;
  // MTP: the scaled mean of the depths' losses enters the gradient only (x - x.detach() is 0 in value).
  PositionContext positions;
  positions.rope = rope_table(output_weight().device(), tokens.size(1));
  std::vector<Tensor> depths = mtp->losses(hidden, tokens, labels, loss_mask, *embedding, output_weight(), positions);
  Tensor mtp_sum = depths[0];
  for (std::size_t k = 1; k < depths.size(); ++k) mtp_sum = add(mtp_sum, depths[k]);
  Tensor scaled = mul(mtp_sum, config_.mtp_loss_scaling_factor / static_cast<double>(depths.size()));
  for (const Tensor& l : depths) mtp_losses_.push_back(l.detach());
  return add(main, sub(scaled, scaled.detach()));
}

KvCache GptModel::make_kv_cache(std::int64_t batch, std::int64_t max_tokens) const {
  KILN_CHECK(max_tokens <= config_.max_positions(),
             "GPT model: a KV cache of {} tokens is longer than --max-position-embeddings ({})", max_tokens,
             config_.max_positions());
  const Tensor& w = output_weight();
  if (config_.multi_latent_attention)  // MLA: the latent c_kv and the shared rotated key k_pe per token
    return KvCache(config_.num_layers, batch, max_tokens, 1, config_.kv_lora_rank, 1, config_.qk_pos_emb_head_dim,
                   w.dtype(), w.device());
  return KvCache(config_.num_layers, batch, max_tokens, config_.query_groups(), config_.head_dim(), w.dtype(),
                 w.device());
}

std::vector<std::shared_ptr<nn::Dropout>> GptModel::dropout_modules() const {
  std::vector<std::shared_ptr<nn::Dropout>> out;
  for (const auto& [name, m] : named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) out.push_back(d);
  return out;
}

}  // namespace kiln::models
