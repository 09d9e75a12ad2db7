// Kiln's tokenizers and Megatron files against what the reference implementations produced, kept
// as fixtures so CI checks them without the network peers or a GPU machine:
// - fixtures/tokenizer_ids.jsonl: ids of tiktoken and Hugging Face `tokenizers` (which agree with
//   each other) for 214 varied documents, GPT-2 and Llama 3 (tests/data/make_tokenizer_fixture.py,
//   run on the H200 machine with tiktoken 0.14.0 and tokenizers 0.23.2);
// - fixtures/megatron/: Kiln's preprocess-data output that Megatron-LM's own IndexedDataset read
//   back identically, and the files Megatron-LM's IndexedDatasetBuilder wrote for the same ids
//   (tests/data/megatron_interop.py; ids.json names the Megatron-LM commit).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "kiln/data/indexed_dataset.h"
#include "kiln/data/indexed_dataset_writer.h"
#include "kiln/data/tokenizer_factory.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace reference_fixtures_test {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

const fs::path kFixtures = fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "fixtures";

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << "cannot open " << p;
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

TEST(TokenizerFixture, KilnIdsEqualTiktokenAndHuggingFace) {
  std::string why;
  auto files = testing::real_tokenizers(&why);
  if (!files) GTEST_SKIP() << "no real tokenizer files (run `kiln data tokenizers`): " << why;
  auto gpt2 = make_tokenizer({"GPT2BPETokenizer", {}, files->gpt2_vocab, files->gpt2_merges});
  auto llama3 = make_tokenizer({"HuggingFaceTokenizer", files->llama3_tokenizer_json, {}, {}});
  std::ifstream in(kFixtures / "tokenizer_ids.jsonl");
  ASSERT_TRUE(in) << "missing fixture tokenizer_ids.jsonl";
  std::string line;
  ASSERT_TRUE(std::getline(in, line));
  const auto header = nlohmann::json::parse(line);
  int documents = 0, gpt2_bad = 0, llama3_bad = 0;
  std::int64_t ids = 0;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    const auto text = row.at("text").get<std::string>();
    const auto want_gpt2 = row.at("gpt2").get<Ids>();
    const auto want_llama3 = row.at("llama3").get<Ids>();
    if (gpt2->encode(text) != want_gpt2 && ++gpt2_bad <= 3)
      ADD_FAILURE() << "GPT-2 ids differ for document " << documents;
    if (llama3->encode(text) != want_llama3 && ++llama3_bad <= 3)
      ADD_FAILURE() << "Llama 3 ids differ for document " << documents;
    ids += static_cast<std::int64_t>(want_gpt2.size() + want_llama3.size());
    ++documents;
  }
  EXPECT_EQ(documents, header.at("documents").get<int>());
  EXPECT_GT(documents, 200);
  EXPECT_EQ(gpt2_bad, 0);
  EXPECT_EQ(llama3_bad, 0);
  RecordProperty("ids", std::to_string(ids));
}

struct MegatronIds {
  std::vector<Ids> documents;
  std::vector<std::vector<std::int32_t>> sequence_lengths;
};

MegatronIds megatron_ids() {
  const auto j = nlohmann::json::parse(slurp(kFixtures / "megatron" / "ids.json"));
  return {j.at("documents").get<std::vector<Ids>>(),
          j.at("sequence_lengths").get<std::vector<std::vector<std::int32_t>>>()};
}

TEST(MegatronFixture, KilnReadsWhatMegatronsBuilderWrote) {
  const auto ref = megatron_ids();
  IndexedDataset ds(kFixtures / "megatron" / "megatron_text_document");
  EXPECT_EQ(ds.dtype(), TokenDtype::UInt16);
  ASSERT_EQ(ds.document_count(), static_cast<std::int64_t>(ref.documents.size()));
  std::int64_t sequence = 0;
  for (std::size_t d = 0; d < ref.documents.size(); ++d) {
    EXPECT_EQ(ds.document(static_cast<std::int64_t>(d)), ref.documents[d]) << "document " << d;
    EXPECT_EQ(ds.document_indices()[d], sequence) << "document " << d;
    for (auto length : ref.sequence_lengths[d]) EXPECT_EQ(ds.sequence_lengths()[sequence++], length);
  }
  EXPECT_EQ(sequence, ds.sequence_count());
}

TEST(MegatronFixture, KilnWritesMegatronsBytes) {
  const auto ref = megatron_ids();
  const fs::path dir = fs::path(KILN_BINARY_DIR) / "megatron-fixture-test";
  fs::create_directories(dir);
  IndexedDatasetWriter split(dir / "split", TokenDtype::UInt16), whole(dir / "whole", TokenDtype::UInt16);
  for (std::size_t d = 0; d < ref.documents.size(); ++d) {
    split.add_document(ref.documents[d], ref.sequence_lengths[d]);
    whole.add_document(ref.documents[d]);
  }
  split.finish();
  whole.finish();
  // Megatron's builder, with every third document in two sequences.
  EXPECT_EQ(slurp(dir / "split.idx"), slurp(kFixtures / "megatron" / "megatron_text_document.idx"));
  EXPECT_EQ(slurp(dir / "split.bin"), slurp(kFixtures / "megatron" / "megatron_text_document.bin"));
  // Kiln's preprocess-data output, which Megatron's IndexedDataset read back identically.
  EXPECT_EQ(slurp(dir / "whole.idx"), slurp(kFixtures / "megatron" / "kiln_text_document.idx"));
  EXPECT_EQ(slurp(dir / "whole.bin"), slurp(kFixtures / "megatron" / "kiln_text_document.bin"));
}

}  // namespace reference_fixtures_test
}  // namespace kiln::data
