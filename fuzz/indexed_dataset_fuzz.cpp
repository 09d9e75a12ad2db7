// IndexedDataset (Megatron's .idx/.bin) on arbitrary bytes. The input is both files:
//   uint32 little-endian n, then n bytes of .idx, then the .bin (the rest).
// It opens, or refuses with a kiln::Error naming the .idx or .bin; what it opens can be read
// whole, every sequence and document, inside the .bin.
#include <algorithm>
#include <cstring>
#include <optional>

#include "fuzz_support.h"
#include "kiln/data/indexed_dataset.h"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static const std::filesystem::path prefix = kiln::fuzz::scratch_path("tokens");
  std::uint32_t idx_size = 0;
  if (size >= 4) std::memcpy(&idx_size, data, 4);
  const std::size_t rest = size >= 4 ? size - 4 : 0;
  const std::size_t idx_bytes = std::min<std::size_t>(idx_size, rest);
  const std::uint8_t* idx = data + (size >= 4 ? 4 : size);
  kiln::fuzz::write_file(prefix.string() + ".idx", {idx, idx_bytes});
  kiln::fuzz::write_file(prefix.string() + ".bin", {idx + idx_bytes, rest - idx_bytes});

  std::optional<kiln::data::IndexedDataset> ds;
  if (!kiln::fuzz::parses(prefix.string(), [&] { ds.emplace(prefix); })) return 0;
  std::int64_t tokens = 0;
  for (std::int64_t s = 0; s < ds->sequence_count(); ++s) tokens += static_cast<std::int64_t>(ds->sequence(s).size());
  if (tokens != ds->token_count()) kiln::fuzz::fail(".idx/.bin: the sequences do not add up to token_count()");
  std::int64_t document_tokens = 0;
  for (std::int64_t d = 0; d < ds->document_count(); ++d)
    document_tokens += static_cast<std::int64_t>(ds->document(d).size());
  if (document_tokens != tokens) kiln::fuzz::fail(".idx/.bin: the documents do not hold every sequence once");
  return 0;
}
