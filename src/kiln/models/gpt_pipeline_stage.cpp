#include "kiln/models/gpt_pipeline_stage.h"

#include <algorithm>
#include <string_view>

#include "kiln/autograd/functions.h"
#include "kiln/models/context_parallel_layout.h"
#include "kiln/models/output_layer_loss.h"
#include "kiln/runtime/error.h"
#include "kiln/tensor/grad_mode.h"

namespace kiln::models {

int PipelineSplit::chunks(std::int64_t num_layers) const {
  if (dualpipe) return 2;
  if (layers_per_virtual_stage <= 0) return 1;
  return static_cast<int>(num_layers / (static_cast<std::int64_t>(stages) * layers_per_virtual_stage));
}

std::vector<std::pair<std::int64_t, std::int64_t>> pipeline_layer_ranges(std::int64_t L, const PipelineSplit& s) {
  const int p = s.stages;
  KILN_CHECK(p >= 1, "--pipeline-model-parallel-size must be at least 1, got {}", p);
  std::vector<std::pair<std::int64_t, std::int64_t>> out;
  const bool uneven = s.first_stage_layers > 0 || s.last_stage_layers > 0;
  if (s.layers_per_virtual_stage > 0) {
    KILN_CHECK(!uneven,
               "--num-layers-per-virtual-pipeline-stage does not combine with --decoder-first-pipeline-num-layers / "
               "--decoder-last-pipeline-num-layers (give an even split for the interleaved schedule)");
    KILN_CHECK(p > 1, "--num-layers-per-virtual-pipeline-stage needs --pipeline-model-parallel-size above 1");
    const std::int64_t per_rank = L / p;
    KILN_CHECK(L % p == 0 && per_rank % s.layers_per_virtual_stage == 0,
               "--num-layers ({}) must be divisible by --pipeline-model-parallel-size ({}) x "
               "--num-layers-per-virtual-pipeline-stage ({}): every model chunk holds the same layers",
               L, p, s.layers_per_virtual_stage);
    KILN_CHECK(per_rank / s.layers_per_virtual_stage >= 2,
               "--num-layers-per-virtual-pipeline-stage ({}) leaves one model chunk per rank ({} layers over {} "
               "stages): the interleaved schedule needs at least 2 (lower it, or leave it out for 1F1B)",
               s.layers_per_virtual_stage, L, p);
    const std::int64_t n = L / s.layers_per_virtual_stage;
    for (std::int64_t k = 0; k < n; ++k)
      out.emplace_back(k * s.layers_per_virtual_stage, (k + 1) * s.layers_per_virtual_stage);
    return out;
  }
  if (!uneven) {
    KILN_CHECK(L % p == 0,
               "--num-layers ({}) must be divisible by --pipeline-model-parallel-size ({}) (or give "
               "--decoder-first-pipeline-num-layers / --decoder-last-pipeline-num-layers for an uneven split)",
               L, p);
    for (int r = 0; r < p; ++r) out.emplace_back(r * (L / p), (r + 1) * (L / p));
    return out;
  }
  KILN_CHECK(p > 1, "--decoder-first/last-pipeline-num-layers need --pipeline-model-parallel-size above 1");
  const std::int64_t first = s.first_stage_layers, last = s.last_stage_layers;
  const int others = p - (first > 0 ? 1 : 0) - (last > 0 ? 1 : 0);
  const std::int64_t rest = L - first - last;
  KILN_CHECK(rest >= 0 && (others == 0 ? rest == 0 : rest % others == 0 && rest / others > 0),
             "--num-layers ({}) minus --decoder-first-pipeline-num-layers ({}) and --decoder-last-pipeline-num-layers "
             "({}) leaves {} layers, which do not divide into {} other stage(s) of at least one layer "
             "(--pipeline-model-parallel-size {})",
             L, first, last, rest, others, p);
  const std::int64_t middle = others > 0 ? rest / others : 0;
  std::int64_t begin = 0;
  for (int r = 0; r < p; ++r) {
    const std::int64_t n = r == 0 && first > 0 ? first : r == p - 1 && last > 0 ? last : middle;
    out.emplace_back(begin, begin + n);
    begin += n;
  }
  return out;
}

GptPipelineStage::GptPipelineStage(GptConfig config, std::uint64_t seed, int pipeline_rank, const PipelineSplit& split,
                                   const dist::ProcessGroups* groups)
    : Module("GPTModel"), config_(std::move(config)), split_(split), rank_(pipeline_rank) {
  config_.validate();
  const int p = split_.stages;
  KILN_CHECK(rank_ >= 0 && rank_ < p, "pipeline stage: rank {} of {} stages", rank_, p);
  // DualPipe's last stages are ranks 0 and p - 1, one per direction: each would need the MTP block
  // (a copy of the other's) and the pair's sums of its gradients.
  KILN_CHECK(config_.mtp_num_layers == 0 || !split_.dualpipe,
             "--mtp-num-layers does not combine with --pipeline-schedule dualpipe (the MTP block would be held by "
             "both ends of the pipeline); use 1f1b, interleaved or zero-bubble");
  KILN_CHECK(!split_.dualpipe || (split_.layers_per_virtual_stage == 0 && p % 2 == 0),
             "--pipeline-schedule dualpipe holds two model chunks per rank of its own (stage r and a copy of stage "
             "p - 1 - r): it needs an even --pipeline-model-parallel-size (got {}) and no "
             "--num-layers-per-virtual-pipeline-stage (got {})",
             p, split_.layers_per_virtual_stage);
  const auto all = pipeline_layer_ranges(config_.num_layers, split_);
  if (split_.dualpipe) {
    chunks_ = 2;
    ranges_ = {all[static_cast<std::size_t>(rank_)], all[static_cast<std::size_t>(p - 1 - rank_)]};
  } else {
    chunks_ = static_cast<int>(all.size()) / p;
    for (int c = 0; c < chunks_; ++c) ranges_.push_back(all[static_cast<std::size_t>(c * p + rank_)]);
  }

  // The whole model from the seed (the weights and dropout seeds of one process), of which this
  // stage keeps its modules; the rest is freed when `whole` goes.
  // Over the groups when the layers split over them (tensor parallelism, the experts over an
  // expert-parallel group): the stage's modules are the whole model's, built as one rank of that layout.
  const bool distributed = config_.tensor_model_parallel_size > 1 || config_.expert_model_parallel_size > 1 ||
                           config_.context_parallel_size > 1;
  GptModel whole(config_, seed, distributed ? groups : nullptr);
  const TensorParallelLayout whole_experts = whole.expert_parallel_layout();
  const TensorParallelLayout whole_expert_slices = whole.expert_tensor_parallel_layout();
  for (const auto& [name, t] : whole.named_parameters()) whole_parameters_.emplace_back(name, t.dim());
  for (const auto& [name, m] : whole.named_modules())
    if (std::dynamic_pointer_cast<nn::Dropout>(m)) whole_dropout_names_.push_back(name);
  ops_ = &core_ops_for(config_.transformer_impl);
  context_.ops = ops_;
  context_.groups = config_.tensor_model_parallel_size > 1 || config_.context_parallel_size > 1 ? groups : nullptr;
  context_.sequence_parallel = config_.sequence_parallel;
  context_.tp_comm_overlap = config_.tp_comm_overlap;

  // DualPipe: ranks 0 and p - 1 are each the first stage of one direction and the last of the other.
  bool first = false, last = false;
  for (int c = 0; c < chunks_; ++c) {
    first = first || is_first_virtual_stage(c);
    last = last || is_last_virtual_stage(c);
  }
  if (first) embedding = register_module("embedding", whole.embedding);
  auto decoder = register_module("decoder", std::make_shared<nn::Module>("TransformerBlock"));
  auto layers = decoder->register_module("layers", std::make_shared<nn::Module>("ModuleList"));
  first_layer_ = ranges_.front().first;
  for (const auto& range : ranges_) first_layer_ = std::min(first_layer_, range.first);
  for (const auto& [begin, end] : ranges_)
    for (std::int64_t i = begin; i < end; ++i) {
      // Registered under the global index: the one-process model's names.
      layers->register_module(std::to_string(i), whole.decoder->layer(i));
      layers_.resize(std::max(layers_.size(), static_cast<std::size_t>(i - first_layer_ + 1)));
      layers_[static_cast<std::size_t>(i - first_layer_)] = whole.decoder->layer(i);
    }
  if (last) {
    final_layernorm = decoder->register_module("final_layernorm", whole.decoder->final_layernorm);
    if (config_.mtp_num_layers > 0) {
      // MTP embeds the shifted tokens here: a copy of the first stage's embedding (the whole model's,
      // made from the same seed: equal weights), and the block itself.
      if (!embedding) {
        embedding = register_module("embedding", whole.embedding);
        embedding_copy_ = true;
      }
      mtp = register_module("mtp", whole.mtp);
    }
    if (whole.output_layer) {
      output_layer = register_module("output_layer", whole.output_layer);
    } else if (embedding_copy_) {
      // Tied, with MTP: the copy's word embeddings are the output layer's weight too (one copy here).
      tied_copy_ = embedding->word_embeddings->weight;
      tied_copy_name_ = "embedding.word_embeddings.weight";
    } else {
      // Tied: this stage's own copy of the word embeddings (Megatron's shared embedding).
      auto holder = register_module("output_layer", std::make_shared<nn::Module>("SharedEmbedding"));
      tied_copy_ = holder->register_parameter("weight", whole.embedding->word_embeddings->weight.detach().clone());
    }
  }
  // MoE: this stage's routed experts, split as the whole model's over the expert-parallel group.
  for (const auto& [name, p] : named_parameters())
    if (whole_experts.contains(name)) expert_layout_[name] = whole_experts.at(name);
  // Expert tensor parallelism: this stage's experts' slices, as the whole model's.
  for (const auto& [name, p] : named_parameters())
    if (whole_expert_slices.contains(name)) expert_tensor_layout_[name] = whole_expert_slices.at(name);
}

bool GptPipelineStage::is_first_virtual_stage(int chunk) const {
  if (split_.dualpipe) return rank_ == (chunk == 0 ? 0 : split_.stages - 1);
  return rank_ == 0 && chunk == 0;
}

bool GptPipelineStage::is_last_virtual_stage(int chunk) const {
  if (split_.dualpipe) return rank_ == (chunk == 0 ? split_.stages - 1 : 0);
  return rank_ == split_.stages - 1 && chunk == chunks_ - 1;
}

int GptPipelineStage::stage_of_chunk(int chunk) const {
  KILN_CHECK(split_.dualpipe && (chunk == 0 || chunk == 1), "pipeline stage: stage_of_chunk({}) outside DualPipe",
             chunk);
  return chunk == 0 ? rank_ : split_.stages - 1 - rank_;
}

bool GptPipelineStage::in_chunk(const std::string& name, int chunk) const {
  const auto [begin, end] = layers_of_chunk(chunk);
  static constexpr std::string_view kLayers = "decoder.layers.";
  if (name.starts_with(kLayers)) {
    const std::string_view rest = std::string_view(name).substr(kLayers.size());
    const std::int64_t layer = std::stoll(std::string(rest.substr(0, rest.find('.'))));
    return layer >= begin && layer < end;
  }
  if (name == "embedding" || name.starts_with("embedding.")) return is_first_virtual_stage(chunk);
  if (name == "decoder.final_layernorm" || name.starts_with("decoder.final_layernorm.") || name == "output_layer" ||
      name.starts_with("output_layer."))
    return is_last_virtual_stage(chunk);
  return false;
}

std::pair<std::int64_t, std::int64_t> GptPipelineStage::layers_of_chunk(int chunk) const {
  KILN_CHECK(chunk >= 0 && chunk < chunks_, "pipeline stage: chunk {} of {}", chunk, chunks_);
  return ranges_[static_cast<std::size_t>(chunk)];
}

Tensor GptPipelineStage::word_embeddings() const { return embedding ? embedding->word_embeddings->weight : Tensor(); }

const RopeTable* GptPipelineStage::rope_table(Device device) {
  if (config_.position_embedding_type != PositionEmbedding::Rope) return nullptr;
  if (!rope_.cos.defined() || rope_.cos.device() != device)
    rope_ = ops_->make_rope_table(config_.rope_dim(), config_.max_positions(), config_.rotary_base,
                                  config_.rope_llama3_scaling, config_.rope_scaling_factor, device);
  return &rope_;
}

Tensor GptPipelineStage::forward_chunk(int chunk, const Tensor& input, const Tensor& tokens, const Tensor& labels,
                                       const Tensor& loss_mask) {
  const auto [begin, end] = layers_of_chunk(chunk);
  Tensor hidden;
  if (is_first_virtual_stage(chunk)) {
    KILN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64,
               "GPT pipeline stage: expected int64 tokens [B, T], got {}", tokens.describe());
    if (context_.context_parallel_size() > 1) {
      // This rank's two chunks of each sequence, embedded at their true positions (GptModel's).
      const int cp = context_.context_parallel_size(), r = context_.context_parallel_rank();
      KILN_CHECK(tokens.size(1) == config_.seq_length,
                 "GPT pipeline stage: context parallelism takes whole sequences "
                 "of --seq-length {} tokens, got {}",
                 config_.seq_length, tokens.describe());
      const std::vector<std::int64_t> ids = context_parallel_positions(config_.seq_length, cp, r);
      hidden = embedding->forward(context_parallel_slice(tokens, cp, r), 0,
                                  Tensor::from_vector(ids, {static_cast<std::int64_t>(ids.size())}, tokens.device()));
    } else {
      hidden = embedding->forward(tokens, 0);
    }
    // MTP: the depths embed on the last stage, with a copy of this embedding whose dropout draws
    // follow this one's; this stream skips theirs (in one process they come after it).
    if (config_.mtp_num_layers > 0 && grad_enabled())
      skip_embedding_dropout(hidden.numel(), hidden.device(), config_.mtp_num_layers);
  } else {
    KILN_CHECK(input.defined() && input.dim() == 3, "GPT pipeline stage: chunk {} needs the hidden states [B, T, H]",
               chunk);
    hidden = input;
  }
  PositionContext positions;
  positions.rope = rope_table(hidden.device());
  if (positions.rope != nullptr && context_.context_parallel_size() > 1)
    positions.rope = &context_parallel_rope(*positions.rope, config_.seq_length, context_.context_parallel_size(),
                                            context_.context_parallel_rank(), context_parallel_rope_);
  // --recompute-granularity full: counted over the chunk's layers (Megatron's per pipeline rank).
  const auto first = layers_.begin() + (begin - first_layer_), last = layers_.begin() + (end - first_layer_);
  hidden = forward_layers({first, last}, hidden, positions,
                          {.granularity = config_.recompute_granularity,
                           .method = config_.recompute_method,
                           .num_layers = config_.recompute_num_layers});
  if (!is_last_virtual_stage(chunk)) return hidden;
  hidden = final_layernorm->forward(hidden).first;
  const int cp = context_.context_parallel_size(), cp_rank = context_.context_parallel_rank();
  const auto local = [cp, cp_rank](const Tensor& x) {
    return cp > 1 && x.defined() ? context_parallel_slice(x, cp, cp_rank) : x;
  };
  const Tensor local_labels = local(labels), local_mask = local(loss_mask);
  const Tensor& weight = output_layer ? output_layer->weight : tied_copy_;
  const auto mean_loss = [&](const Tensor& mask) {
    return output_layer_cross_entropy(hidden, weight, local_labels, mask, config_, context_);
  };
  if (!mtp || !grad_enabled()) {
    if (cp > 1)
      return context_parallel_token_loss(mean_loss, local_labels, local_mask, *context_.context_parallel_group());
    return mean_loss(local_mask);
  }
  // MTP, as GptModel::loss: the output layer's loss of the main positions and of each depth's.
  const auto token_loss = [&](const Tensor& h, const Tensor& l, const Tensor& m) {
    const auto mean = [&](const Tensor& mask) {
      return output_layer_cross_entropy(h, weight, l, mask, config_, context_);
    };
    return cp > 1 ? context_parallel_token_loss(mean, l, m, *context_.context_parallel_group()) : mean(m);
  };
  const Tensor main = token_loss(hidden, local_labels, local_mask);
  // The copy's dropout stream: past the first stage's draw for this micro-batch (its hidden states
  // have the shape the embedding gave there), then the depths'.
  if (embedding_copy_) skip_embedding_dropout(hidden.numel(), hidden.device(), 1);
  const std::vector<Tensor> depths = mtp->losses(hidden, tokens, labels, loss_mask, *embedding, token_loss, positions,
                                                 [&local](const Tensor& x) { return local(x); });
  {
    NoGradGuard no_grad;
    std::vector<Tensor> values;
    for (const Tensor& l : depths) values.push_back(l.detach().to(DType::F32).reshape({1}));
    const Tensor now = cat(values, 0);
    if (!mtp_loss_sums_.defined() || mtp_loss_sums_.device() != now.device())
      mtp_loss_sums_ = Tensor::zeros({static_cast<std::int64_t>(depths.size())}, DType::F32, now.device());
    mtp_loss_sums_.add_(now);
  }
  return add_mtp_gradient(main, depths, config_.mtp_loss_scaling_factor);
}

void GptPipelineStage::skip_embedding_dropout(std::int64_t count, Device device, std::int64_t times) {
  nn::Dropout& d = *embedding->embedding_dropout;
  if (!d.is_training() || d.p == 0) return;  // where forward() draws nothing
  for (std::int64_t i = 0; i < times; ++i) d.reserve(count, device);
}

Tensor GptPipelineStage::embedding_group_tensor() const {
  if (split_.dualpipe) return {};
  // The first stage's word embeddings when the last stage holds a copy (tied, or MTP; MTP refuses
  // learned positions, so the word embeddings are the only shared table), or that copy.
  if (embedding)
    return config_.untie_embeddings_and_output_weights && config_.mtp_num_layers == 0
               ? Tensor()
               : embedding->word_embeddings->weight;
  return tied_copy_;
}

std::vector<std::string> GptPipelineStage::embedding_copy_state_names() const {
  std::vector<std::string> out;
  if (!embedding_copy_) return out;
  for (const auto& [name, t] : state_dict())
    if (name.starts_with("embedding.")) out.push_back(name);
  return out;
}

std::vector<std::string> GptPipelineStage::embedding_copy_dropout_names() const {
  std::vector<std::string> out;
  if (!embedding_copy_) return out;
  for (const auto& [name, m] : named_modules())
    if (std::dynamic_pointer_cast<nn::Dropout>(m) && name.starts_with("embedding.")) out.push_back(name);
  return out;
}

Tensor GptPipelineStage::take_mtp_loss_sums() {
  Tensor out = mtp_loss_sums_.defined() ? mtp_loss_sums_.clone() : Tensor();
  if (mtp_loss_sums_.defined()) mtp_loss_sums_.zero_();
  return out;
}

TensorParallelLayout GptPipelineStage::tensor_parallel_layout() const {
  if (context_.tensor_parallel_size() == 1) return {};
  TensorParallelLayout layout = tensor_parallel_layout_of(*this, config_.sequence_parallel);
  if (embedding) layout["embedding.word_embeddings.weight"] = {.dim = 0};  // VocabParallelEmbedding's rows
  if (tied_copy_.defined()) layout[kTiedCopyName] = {.dim = 0};            // the same rows
  return layout;
}

void GptPipelineStage::reseed_tensor_parallel_dropout() {
  reseed_tensor_parallel_dropout_of(*this, context_.tensor_parallel_size(), context_.tensor_parallel_rank(),
                                    config_.sequence_parallel);
}

std::vector<std::shared_ptr<nn::Dropout>> GptPipelineStage::dropout_modules() const {
  std::vector<std::shared_ptr<nn::Dropout>> out;
  for (const auto& [name, m] : named_modules())
    if (auto d = std::dynamic_pointer_cast<nn::Dropout>(m)) out.push_back(d);
  return out;
}

}  // namespace kiln::models
