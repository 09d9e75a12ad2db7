#include "kiln/models/gpt_embedding.h"

#include <fmt/format.h>

#include "kiln/autograd/functions.h"
#include "kiln/models/gpt_config.h"
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
    : Module("LanguageModelEmbedding") {
  context.tensor_parallel_size();  // a larger group splits the vocabulary rows (VocabParallelEmbedding)
  word_embeddings = register_module("word_embeddings",
                                    std::make_shared<EmbeddingTable>(config.padded_vocab_size(), config.hidden_size));
  if (config.position_embedding_type == PositionEmbedding::LearnedAbsolute)
    position_embeddings = register_module("position_embeddings",
                                          std::make_shared<EmbeddingTable>(config.max_positions(), config.hidden_size));
  embedding_dropout =
      register_module("embedding_dropout", std::make_shared<nn::Dropout>(config.hidden_dropout, dropout_seed));
}

Tensor LanguageModelEmbedding::forward(const Tensor& tokens, std::int64_t position_offset) {
  KILN_CHECK(tokens.dim() == 2 && tokens.dtype() == DType::I64, "GPT embedding: expected int64 tokens [B, T], got {}",
             tokens.describe());
  Tensor h = word_embeddings->forward(tokens);  // [B, T, H]
  if (position_embeddings) {
    const std::int64_t t = tokens.size(1);
    KILN_CHECK(position_offset >= 0 && position_offset + t <= position_embeddings->num_embeddings,
               "GPT embedding: positions {} .. {} are beyond --max-position-embeddings ({})", position_offset,
               position_offset + t, position_embeddings->num_embeddings);
    Tensor positions = Tensor::arange(static_cast<double>(position_offset), static_cast<double>(position_offset + t), 1,
                                      DType::I64, tokens.device());
    h = add(h, position_embeddings->forward(positions));  // [T, H] broadcast over the batch
  }
  return embedding_dropout->forward(h);
}

}  // namespace kiln::models
