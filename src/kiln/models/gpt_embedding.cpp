#include "kiln/models/gpt_embedding.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"
#include "kiln/models/gpt_config.h"
#include "kiln/models/tensor_parallel_mappings.h"
#include "kiln/models/transformer_attention.h"
#include "kiln/models/vocab_parallel.h"
#include "kiln/runtime/error.h"

namespace kiln::models {

EmbeddingTable::EmbeddingTable(std::int64_t num_embeddings, std::int64_t embedding_dim)
    : Module("Embedding"), num_embeddings(num_embeddings), embedding_dim(embedding_dim) {
  weight = register_parameter("weight", Tensor::zeros({num_embeddings, embedding_dim}));
}

Tensor EmbeddingTable::forward(const Tensor& indices) { return embedding(weight, indices); }

std::string EmbeddingTable::extra_repr() const { return fmt::format("{}, {}", num_embeddings, embedding_dim); }

LanguageModelEmbedding::LanguageModelEmbedding(const GptConfig& config, std::uint64_t dropout_seed,
                                               const LayerContext& context)
    : Module("LanguageModelEmbedding"), vocab_size(config.padded_vocab_size()), context_(context) {
  const int tp = context.tensor_parallel_size();
  KILN_CHECK(vocab_size % tp == 0,
             "GPT embedding: the padded vocabulary ({}) is not divisible by --tensor-model-parallel-size ({})",
             vocab_size, tp);
  word_embeddings =
      register_module("word_embeddings", std::make_shared<EmbeddingTable>(vocab_size / tp, config.hidden_size));
  if (config.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    position_embeddings = register_module("position_embeddings",
                                          std::make_shared<EmbeddingTable>(config.max_positions(), config.hidden_size));
  // Under sequence parallelism the dropout acts on this rank's slice of the sequence: masks of its own.
  const bool sliced = context.sequence_parallel && tp > 1;
  embedding_dropout = register_module(
      "embedding_dropout",
      std::make_shared<nn::Dropout>(
          config.hidden_dropout,
          sliced ? tensor_parallel_dropout_seed(dropout_seed, context.tensor_parallel_rank()) : dropout_seed));
}

Tensor LanguageModelEmbedding::forward(const Tensor& tokens, std::int64_t position_offset, const Tensor& position_ids) {
  KILN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64, "GPT embedding: expected int64 tokens [B, T], got {}",
             tokens.describe());
  const dist::Communicator* tp = context_.tensor_parallel_group();
  const bool sequence_parallel = tp != nullptr && context_.sequence_parallel;
  Tensor h;
  if (tp == nullptr) {
    h = word_embeddings->forward(tokens);  // [B, T, H]
  } else {
    // VocabParallelEmbedding: each rank's rows' part, summed over the group. Under sequence
    // parallelism without position embeddings the sum is a reduce-scatter along the sequence
    // straight away (Megatron's reduce_scatter_embeddings); with them, the whole sum first.
    Tensor partial = vocab_parallel_embedding_partial(word_embeddings->weight, tokens, vocab_size, *tp);
    if (sequence_parallel && !position_embeddings)
      return embedding_dropout->forward(reduce_scatter_to_sequence_parallel_region(partial, *tp));
    h = reduce_from_tensor_parallel_region(partial, *tp);
  }
  if (position_embeddings) {
    const std::int64_t t = tokens.size(1);
    KILN_CHECK(position_offset >= 0 && position_offset + t <= position_embeddings->num_embeddings,
               "GPT embedding: positions {} .. {} are beyond --max-position-embeddings ({})", position_offset,
               position_offset + t, position_embeddings->num_embeddings);
    KILN_CHECK(!position_ids.defined() || position_ids.shape() == Shape{t},
               "GPT embedding: position ids {} do not match the {} tokens", position_ids.describe(), t);
    Tensor positions = position_ids.defined()
                           ? position_ids
                           : Tensor::arange(static_cast<double>(position_offset),
                                            static_cast<double>(position_offset + t), 1, DType::I64, tokens.device());
    h = add(h, position_embeddings->forward(positions));  // [T, H] broadcast over the batch
  }
  if (sequence_parallel) h = scatter_to_sequence_parallel_region(h, *tp);
  return embedding_dropout->forward(h);
}

}  // namespace kiln::models
