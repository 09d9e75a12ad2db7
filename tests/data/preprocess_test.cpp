#include "kiln/data/preprocess.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <set>

#include "kiln/data/gpt_dataset.h"
#include "kiln/data/indexed_dataset.h"
#include "kiln/data/tokenizer_factory.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace preprocess_test {

namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

fs::path shakespeare() { return fs::path(KILN_SOURCE_DIR) / "tests" / "data" / "tinyshakespeare_100k.txt"; }

// GPT-2 and Llama 3: the real files when they can be had, else the tiny ones of the same formats.
std::vector<std::shared_ptr<const BpeTokenizer>> both_tokenizers() {
  if (auto real = testing::real_tokenizers()) {
    return {make_tokenizer({"GPT2BPETokenizer", {}, real->gpt2_vocab, real->gpt2_merges}),
            make_tokenizer({"HuggingFaceTokenizer", real->llama3_tokenizer_json, {}, {}})};
  }
  auto gpt2 = testing::write_tiny_gpt2(testing::scratch_dir("pre-tiny-gpt2"));
  return {make_tokenizer({"GPT2BPETokenizer", {}, gpt2.vocab, gpt2.merges}),
          make_tokenizer(
              {"HuggingFaceTokenizer", testing::write_tiny_hugging_face(testing::scratch_dir("pre-tiny-hf")), {}, {}})};
}

std::shared_ptr<const BpeTokenizer> tiny() {
  auto gpt2 = testing::write_tiny_gpt2(testing::scratch_dir("pre-tiny"));
  return make_tokenizer({"GPT2BPETokenizer", {}, gpt2.vocab, gpt2.merges});
}

PreprocessOptions options_for(const fs::path& input, const fs::path& prefix) {
  PreprocessOptions o;
  o.inputs = {input};
  o.output_prefix = prefix;
  o.append_eod = true;
  return o;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

TEST(Preprocess, ShakespeareWithBothTokenizersReadsBackThroughTheDataset) {
  std::string text = read_text_file(shakespeare());
  ASSERT_GT(text.size(), 90000u);
  for (const auto& tok : both_tokenizers()) {
    auto dir = testing::scratch_dir("pre-shakespeare");
    auto result = preprocess_data(*tok, options_for(shakespeare(), dir / "ts"));
    ASSERT_EQ(result.outputs.size(), 1u);
    EXPECT_EQ(result.outputs[0].prefix, dir / "ts_text_document");
    EXPECT_EQ(result.inputs[0].documents, 1);
    IndexedDataset ds(dir / "ts_text_document");
    EXPECT_EQ(ds.dtype(), optimal_token_dtype(tok->vocab_size()));
    Ids doc = ds.document(0);
    ASSERT_EQ(doc.back(), *tok->eod());
    EXPECT_EQ(ds.token_count(), result.outputs[0].tokens);
    doc.pop_back();
    EXPECT_EQ(tok->decode(doc), text);
    EXPECT_EQ(doc, tok->encode(text));

    // One document: the samples are its consecutive windows, in some order.
    constexpr int kLength = 64;
    GptDataset gpt(std::make_shared<const IndexedDataset>(dir / "ts_text_document"), {0, 1}, 0,
                   {kLength, 1234, dir / "cache"});
    doc.push_back(*tok->eod());
    std::multiset<Ids> windows, samples;
    for (std::int64_t k = 0; k < gpt.size(); ++k) {
      windows.emplace(doc.begin() + k * kLength, doc.begin() + (k + 1) * kLength + 1);
      samples.insert(gpt.sample(k));
    }
    EXPECT_EQ(samples, windows);

    PreprocessOptions lines = options_for(shakespeare(), dir / "lines");
    lines.text_documents = TextDocuments::Line;
    lines.workers = 3;
    auto by_line = preprocess_data(*tok, lines);
    std::int64_t non_blank = 0;
    for (std::size_t pos = 0; pos < text.size();) {
      std::size_t end = text.find('\n', pos);
      non_blank += text.substr(pos, end - pos).find_first_not_of(" \t\r") != std::string::npos;
      pos = end + 1;
    }
    EXPECT_EQ(by_line.outputs[0].documents, non_blank);
  }
}

TEST(Preprocess, OutputIsTheSameWhateverTheWorkers) {
  auto dir = testing::scratch_dir("pre-workers");
  // Enough lines for several batches.
  std::string jsonl;
  std::string text = read_text_file(shakespeare());
  for (int copy = 0; copy < 25; ++copy) {
    for (std::size_t pos = 0; pos < text.size(); pos += 500) {
      nlohmann::json line = {{"text", text.substr(pos, 500)}, {"title", std::to_string(copy * 1000 + pos)}};
      jsonl += line.dump() + "\n";
    }
  }
  testing::write_file(dir / "in.jsonl", jsonl);
  auto tok = tiny();
  std::vector<std::string> bins;
  for (int workers : {1, 4}) {
    auto o = options_for(dir / "in.jsonl", dir / fmt::format("w{}", workers));
    o.workers = workers;
    o.json_keys = {"text", "title"};
    auto result = preprocess_data(*tok, o);
    ASSERT_EQ(result.outputs.size(), 2u);
    EXPECT_EQ(result.outputs[1].prefix, dir / fmt::format("w{}_title_document", workers));
    EXPECT_EQ(result.outputs[0].documents, result.outputs[1].documents);
    bins.push_back(read_text_file(dir / fmt::format("w{}_text_document.bin", workers)) +
                   read_text_file(dir / fmt::format("w{}_text_document.idx", workers)) +
                   read_text_file(dir / fmt::format("w{}_title_document.idx", workers)));
    EXPECT_EQ(data_path_argument(result),
              fmt::format("--data-path {} {} {} {}", result.outputs[0].tokens, result.outputs[0].prefix.string(),
                          result.outputs[1].tokens, result.outputs[1].prefix.string()));
  }
  ASSERT_GT(bins[0].size(), 2u << 20) << "several batches";
  EXPECT_EQ(bins[0], bins[1]);
}

TEST(Preprocess, MalformedJsonlNamesFileAndLineOrIsSkipped) {
  auto dir = testing::scratch_dir("pre-bad");
  testing::write_file(
      dir / "in.jsonl",
      "{\"text\": \"one\"}\n\n{\"text\": \"two\"\n{\"title\": \"x\"}\n{\"text\": 3}\n[1]\n{\"text\": \"\"}\n"
      "{\"text\": \"\xFF\"}\n{\"text\": \"end\"}");
  auto tok = tiny();
  auto o = options_for(dir / "in.jsonl", dir / "out");
  std::string message = error_of([&] { preprocess_data(*tok, o); });
  EXPECT_NE(message.find((dir / "in.jsonl").string() + ":3: malformed JSON"), std::string::npos) << message;
  EXPECT_NE(message.find("--skip-bad"), std::string::npos) << message;
  EXPECT_FALSE(fs::exists(dir / "out_text_document.idx")) << "no output after an error";

  o.skip_bad = true;
  o.workers = 2;
  auto result = preprocess_data(*tok, o);
  EXPECT_EQ(result.skipped, 5);
  ASSERT_EQ(result.skipped_examples.size(), 5u);
  EXPECT_NE(result.skipped_examples[1].find(":4: no key \"text\""), std::string::npos) << result.skipped_examples[1];
  EXPECT_NE(result.skipped_examples[2].find(":5: \"text\" is not a string"), std::string::npos);
  EXPECT_NE(result.skipped_examples[3].find(":6: the line is not a JSON object"), std::string::npos);
  EXPECT_NE(result.skipped_examples[4].find(":8: malformed JSON"), std::string::npos) << "invalid UTF-8 in JSON";
  IndexedDataset ds(dir / "out_text_document");
  // "one", "" (an empty document: a boundary without a sequence, as Megatron), "end".
  EXPECT_EQ(ds.document_count(), 3);
  EXPECT_EQ(ds.sequence_count(), 2);
  EXPECT_EQ(tok->decode(ds.document(2)), "end<|endoftext|>");
}

TEST(Preprocess, DirectoriesOfTextFilesAndBadArguments) {
  auto dir = testing::scratch_dir("pre-dir");
  fs::create_directories(dir / "in" / "sub");
  fs::create_directories(dir / "in" / ".hidden");
  testing::write_file(dir / "in" / "b.txt", "second\xFF file");
  testing::write_file(dir / "in" / "sub" / "c.txt", "third");
  testing::write_file(dir / "in" / "a.txt", "first");
  testing::write_file(dir / "in" / ".hidden" / "x.txt", "never");
  auto tok = tiny();
  auto o = options_for(dir / "in", dir / "out");
  o.append_eod = false;
  auto result = preprocess_data(*tok, o);
  ASSERT_EQ(result.inputs.size(), 3u);
  EXPECT_EQ(result.inputs[0].path.filename(), "a.txt");
  EXPECT_EQ(result.inputs[2].path.filename(), "c.txt");
  IndexedDataset ds(dir / "out_text_document");
  ASSERT_EQ(ds.document_count(), 3);
  EXPECT_EQ(tok->decode(ds.document(1)), "second\xFF file") << "plain text is bytes: invalid UTF-8 kept";

  EXPECT_NE(error_of([&] {
              preprocess_data(*tok, options_for(dir / "missing.jsonl", dir / "x"));
            }).find("missing.jsonl does not exist"),
            std::string::npos);
  o.json_keys = {"text", "title"};
  EXPECT_NE(error_of([&] { preprocess_data(*tok, o); }).find("plain-text inputs have one field"), std::string::npos);
}

TEST(PreprocessCommand, RunsEndToEndAndReportsBadInput) {
  auto dir = testing::scratch_dir("pre-cli");
  auto gpt2 = testing::write_tiny_gpt2(dir / "tok");
  fs::path kiln = fs::path(KILN_BINARY_DIR) / "apps" / "kiln" / "kiln";
  ASSERT_TRUE(fs::exists(kiln));
  auto run = [&](const std::string& args, std::string& output) {
    std::string command = kiln.string() + " " + args + " > " + (dir / "out.txt").string() + " 2>&1";
    int status = std::system(command.c_str());
    output = read_text_file(dir / "out.txt");
    return status;
  };
  std::string tokenizer = fmt::format("--tokenizer-type GPT2BPETokenizer --vocab-file {} --merge-file {}",
                                      gpt2.vocab.string(), gpt2.merges.string());
  std::string out;
  ASSERT_EQ(run(fmt::format("preprocess-data --input {} {} --output-prefix {} --append-eod --workers 2",
                            shakespeare().string(), tokenizer, (dir / "ts").string()),
                out),
            0)
      << out;
  EXPECT_NE(out.find("--data-path "), std::string::npos) << out;
  EXPECT_NE(out.find(shakespeare().string() + ": 1 documents"), std::string::npos) << out;
  ASSERT_EQ(run(fmt::format("inspect-data {} {}", (dir / "ts_text_document").string(), tokenizer), out), 0) << out;
  EXPECT_NE(out.find("First Citizen:"), std::string::npos) << out;
  EXPECT_NE(out.find("1 documents, 1 sequences"), std::string::npos) << out;

  testing::write_file(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{oops}\n");
  EXPECT_NE(run(fmt::format("preprocess-data --input {} {} --output-prefix {}", (dir / "bad.jsonl").string(), tokenizer,
                            (dir / "bad").string()),
                out),
            0);
  EXPECT_NE(out.find("bad.jsonl:2: malformed JSON"), std::string::npos) << out;
  testing::write_file(dir / "junk.idx", "not an index");
  testing::write_file(dir / "junk.bin", "");
  EXPECT_NE(run("inspect-data " + (dir / "junk").string(), out), 0);
  EXPECT_NE(out.find("junk.idx is not a Megatron indexed dataset index"), std::string::npos) << out;
}

}  // namespace preprocess_test
}  // namespace kiln::data
