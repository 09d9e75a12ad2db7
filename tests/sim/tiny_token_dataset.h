#pragma once
// A small Megatron .bin/.idx dataset (40 documents of 300 tokens < 100) under the build tree's
// test_scratch/<folder>, for the memory tests that run train::pretrain_gpt in-process; returns its
// prefix. Each MPI rank passes its own folder, so no rank reads a file another is writing.
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/data/indexed_dataset_writer.h"

namespace kiln::sim::testing {

inline std::string tiny_token_dataset(const std::string& folder) {
  const std::filesystem::path dir = std::filesystem::path(KILN_BINARY_DIR) / "test_scratch" / folder;
  std::filesystem::create_directories(dir);
  const std::filesystem::path prefix = dir / "tokens";
  data::IndexedDatasetWriter writer(prefix, data::TokenDtype::UInt16);
  for (int d = 0; d < 40; ++d) {
    std::vector<std::int32_t> tokens;
    for (int i = 0; i < 300; ++i) tokens.push_back((d * 31 + i * 7) % 100);
    writer.add_document(tokens);
  }
  writer.finish();
  return prefix.string();
}

}  // namespace kiln::sim::testing
