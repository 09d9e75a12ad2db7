#include <gtest/gtest.h>

#include <random>

#include "kiln/data/bpe_tokenizer.h"
#include "kiln/data/byte_level.h"
#include "kiln/data/gpt2_tokenizer_json.h"
#include "kiln/data/pretokenizer.h"
#include "kiln/data/tokenizer_factory.h"
#include "kiln/data/tokenizer_files.h"
#include "kiln/runtime/error.h"
#include "test_tokenizers.h"

namespace kiln::data {
namespace tokenizer_test {

using ::kiln::data::testing::kLlama3Pattern;
namespace fs = std::filesystem;
using Ids = std::vector<std::int32_t>;

std::vector<std::string> split(const Pretokenizer& p, std::string_view text) {
  Pretokenizer::Scratch scratch;
  std::vector<std::string_view> pieces;
  p.split(text, scratch, pieces);
  return {pieces.begin(), pieces.end()};
}

std::string random_bytes(std::mt19937& rng, std::size_t n) {
  std::string s(n, '\0');
  for (auto& c : s) c = static_cast<char>(rng() & 0xFF);
  return s;
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

std::shared_ptr<const BpeTokenizer> tiny_gpt2() {
  auto files = testing::write_tiny_gpt2(testing::scratch_dir("tiny-gpt2"));
  return make_tokenizer({"GPT2BPETokenizer", {}, files.vocab, files.merges});
}

std::shared_ptr<const BpeTokenizer> tiny_hugging_face() {
  auto path = testing::write_tiny_hugging_face(testing::scratch_dir("tiny-hf"));
  return make_tokenizer({"HuggingFaceTokenizer", path, {}, {}});
}

// Text that is hard on a tokenizer: every kind of piece, and bytes that are not UTF-8.
std::vector<std::string> hard_texts() {
  std::mt19937 rng(7);
  std::vector<std::string> texts = {
      "",
      "Hello world, I'm here   now!\n\n",
      "日本語のテキスト 😀👨‍👩‍👧 Привет  \t\t\n",
      std::string(5000, ' ') + "x" + std::string(3000, '\n'),
      "\xC2\x85\xE2\x80\xA8\xE3\x80\x80 NEL, LINE SEPARATOR, IDEOGRAPHIC SPACE",
      "\xFF\xFE broken \xC3 utf-8 \xED\xA0\x80 surrogate \xE0\x80\xAF overlong \x80",
      "<|endoftext|> <|begin_of_text|> <|end_of_text|><|",
  };
  for (int i = 0; i < 50; ++i) texts.push_back(random_bytes(rng, 1 + rng() % 300));
  return texts;
}

TEST(ByteLevel, MatchesGpt2Alphabet) {
  EXPECT_EQ(byte_to_code_point(' '), U'\u0120');   // "Ġ"
  EXPECT_EQ(byte_to_code_point('\n'), U'\u010A');  // "Ċ"
  EXPECT_EQ(byte_to_code_point('A'), U'A');
  EXPECT_EQ(byte_to_code_point(0xAD), U'\u0143');  // the soft hyphen is not printable: moved
  EXPECT_EQ(bytes_to_byte_level(" the"), "\xC4\xA0the");
  std::string all;
  for (int b = 0; b < 256; ++b) all.push_back(static_cast<char>(b));
  EXPECT_EQ(byte_level_to_bytes(bytes_to_byte_level(all)), all);
  EXPECT_FALSE(byte_level_to_bytes("\xE6\x97\xA5").has_value());  // a CJK character is not in the alphabet
}

TEST(Pretokenizer, Gpt2PatternSplitsLikeGpt2) {
  Pretokenizer p(Pretokenizer::kGpt2Pattern);
  EXPECT_TRUE(p.jit());
  EXPECT_EQ(split(p, "Hello world, I'm here   now!\n\n"),
            (std::vector<std::string>{"Hello", " world", ",", " I", "'m", " here", "  ", " now", "!", "\n\n"}));
  EXPECT_EQ(split(p, "x 123 4567"), (std::vector<std::string>{"x", " 123", " 4567"}));
}

TEST(Pretokenizer, Llama3PatternGroupsDigitsByThreeAndFoldsContractionCase) {
  Pretokenizer p(kLlama3Pattern);
  EXPECT_EQ(split(p, "1234567 I'LL"), (std::vector<std::string>{"123", "456", "7", " I", "'LL"}));
}

TEST(Pretokenizer, WhitespaceIsUnicodeWhiteSpaceIncludingNel) {
  // PCRE2's own \s leaves out U+0085 (NEL); Rust's regex and Oniguruma, under tiktoken and
  // tokenizers, include it. With PCRE2's \s the two NELs would be one punctuation piece.
  Pretokenizer p(Pretokenizer::kGpt2Pattern);
  EXPECT_EQ(split(p,
                  "a\xC2\x85\xC2\x85"
                  "b"),
            (std::vector<std::string>{"a", "\xC2\x85", "\xC2\x85", "b"}));
  EXPECT_EQ(Pretokenizer::to_pcre2(R"([^\s\p{L}]|\s+(?!\S))").find("\\s"), std::string::npos);
}

TEST(Pretokenizer, InvalidUtf8BecomesPiecesOfItsOwnAndNothingIsLost) {
  Pretokenizer p(kLlama3Pattern);
  for (const auto& text : hard_texts()) {
    std::string joined;
    for (const auto& piece : split(p, text)) joined += piece;
    EXPECT_EQ(joined, text);
  }
  auto pieces = split(p,
                      "ab\xFF"
                      "cd");
  EXPECT_EQ(pieces, (std::vector<std::string>{"ab", "\xFF", "cd"}));
}

TEST(Pretokenizer, BadPatternNamesThePattern) {
  EXPECT_NE(error_of([] { Pretokenizer p("(unclosed"); }).find("(unclosed"), std::string::npos);
}

TEST(BpeTokenizer, LowestRankFirstLeftmostOnTiesInShortAndLongPieces) {
  BpeDefinition def;
  def.source = "test";
  for (int b = 0; b < 256; ++b) def.vocab.emplace_back(std::string(1, static_cast<char>(b)), b);
  def.vocab.emplace_back("aa", 256);
  def.vocab.emplace_back("aaaa", 257);
  def.merges = {{"a", "a"}, {"aa", "aa"}};
  BpeTokenizer tok(std::move(def));
  EXPECT_EQ(tok.encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(tok.encode("aaaaaaaaa"), (Ids{257, 257, 'a'}));
  // 1001 letters are one piece, merged by the heap path: the same rule gives the same ids.
  Ids expected(250, 257);
  expected.push_back('a');
  EXPECT_EQ(tok.encode(std::string(1001, 'a')), expected);
}

TEST(BpeTokenizer, ARepeatedMergeTakesItsLastRankAsTheReferencesDo) {
  BpeDefinition def;
  def.source = "test";
  for (int b = 0; b < 256; ++b) def.vocab.emplace_back(std::string(1, static_cast<char>(b)), b);
  def.vocab.emplace_back("ab", 256);
  def.vocab.emplace_back("bc", 257);
  // "a b" is listed first and again after "b c": with its last rank, "b c" wins on "abc".
  def.merges = {{"a", "b"}, {"b", "c"}, {"a", "b"}};
  BpeTokenizer tok(std::move(def));
  EXPECT_EQ(tok.encode("abc"), (Ids{'a', 257}));
}

// The tokenizer.json written from GPT-2's files, read back by Kiln's HuggingFaceTokenizer: the same
// ids as the files themselves on every text without the literal <|endoftext|> (which the Hugging
// Face tokenizer matches as its special token, and Megatron's GPT2BPETokenizer spells as text).
void expect_tokenizer_json_matches_gpt2_files(const fs::path& vocab, const fs::path& merges, const fs::path& dir) {
  const fs::path json_path = dir / "tokenizer.json";
  testing::write_file(json_path, gpt2_tokenizer_json(vocab, merges));
  auto files = make_tokenizer({"GPT2BPETokenizer", {}, vocab, merges});
  auto from_json = make_tokenizer({"HuggingFaceTokenizer", json_path, {}, {}});
  EXPECT_EQ(from_json->vocab_size(), files->vocab_size());
  EXPECT_EQ(from_json->eod(), files->eod());
  for (const std::string& text : hard_texts()) {
    if (text.find("<|endoftext|>") != std::string::npos) continue;
    EXPECT_EQ(from_json->encode(text), files->encode(text)) << "text: " << text.substr(0, 60);
  }
  ASSERT_TRUE(files->eod().has_value());
  EXPECT_EQ(from_json->encode("a<|endoftext|>"), (Ids{files->encode("a")[0], *files->eod()}));
}

TEST(Gpt2TokenizerJson, ReadsBackToTheIdsOfTheFiles) {
  const fs::path dir = testing::scratch_dir("tiny-gpt2-json");
  auto files = testing::write_tiny_gpt2(dir);
  expect_tokenizer_json_matches_gpt2_files(files.vocab, files.merges, dir);
}

TEST(Gpt2TokenizerJson, MalformedInputsAreRefusedNamingTheFile) {
  const fs::path dir = testing::scratch_dir("bad-gpt2-json");
  auto files = testing::write_tiny_gpt2(dir);
  testing::write_file(dir / "bad_merges.txt", "#version: 0.2\na b\nabc\n");
  std::string message = error_of([&] { gpt2_tokenizer_json(files.vocab, dir / "bad_merges.txt"); });
  EXPECT_NE(message.find("bad_merges.txt: line 3 is not a merge 'left right': 'abc'"), std::string::npos) << message;
  testing::write_file(dir / "bad_vocab.json", "[1, 2]");
  message = error_of([&] { gpt2_tokenizer_json(dir / "bad_vocab.json", files.merges); });
  EXPECT_NE(message.find("bad_vocab.json: not a JSON object of token -> id"), std::string::npos) << message;
}

TEST(BpeTokenizer, TinyGpt2EncodesDecodesAndKeepsEndOfTextAsText) {
  auto tok = tiny_gpt2();
  testing::TinyVocabulary tiny;
  ASSERT_EQ(tok->eod(), tiny.endoftext);
  Ids ids = tok->encode(" the cat");
  auto the = tok->token_to_id(" the");
  ASSERT_TRUE(the.has_value());
  // " the" is a word of the vocabulary; " cat" is not, and no merge joins its bytes.
  EXPECT_EQ(ids, (Ids{*the, ' ', 'c', 'a', 't'}));
  EXPECT_EQ(tok->decode(ids), " the cat");
  Ids eot = tok->encode("<|endoftext|>");
  EXPECT_GT(eot.size(), 1u) << "GPT2BPETokenizer encodes the spelling of <|endoftext|> as text, as Megatron does";
  EXPECT_EQ(tok->decode(Ids{tiny.endoftext}), "<|endoftext|>");
}

TEST(BpeTokenizer, TinyHuggingFaceMatchesAddedTokensAndIgnoresMergesForWholeWords) {
  auto tok = tiny_hugging_face();
  testing::TinyVocabulary tiny;
  auto begin = tok->token_to_id("<|begin_of_text|>");
  auto end = tok->token_to_id("<|end_of_text|>");
  ASSERT_TRUE(begin && end);
  EXPECT_EQ(tok->eod(), *end);
  EXPECT_EQ(tok->vocab_size(), static_cast<int>(tiny.vocab.size()) + 2);
  Ids ids = tok->encode("<|begin_of_text|> the<|end_of_text|>");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.front(), *begin);
  EXPECT_EQ(ids.back(), *end);
  EXPECT_EQ(tok->decode(ids), "<|begin_of_text|> the<|end_of_text|>");
  EXPECT_EQ(tok->decode(ids, /*skip_special=*/true), " the");
}

TEST(BpeTokenizer, DecodeOfEncodeIsIdentityEvenForBrokenUtf8) {
  for (const auto& tok : {tiny_gpt2(), tiny_hugging_face()}) {
    BpeTokenizer::State state;
    for (const auto& text : hard_texts()) {
      Ids ids;
      tok->encode(text, state, ids);
      EXPECT_EQ(tok->decode(ids), text);
      EXPECT_EQ(ids, tok->encode(text)) << "a warm piece cache must not change the ids";
    }
  }
}

TEST(BpeTokenizer, DecodeRejectsIdsOutsideTheVocabulary) {
  auto tok = tiny_gpt2();
  EXPECT_NE(error_of([&] { tok->decode(Ids{tok->vocab_size()}); }).find("outside the vocabulary"), std::string::npos);
  EXPECT_THROW(tok->decode(Ids{-1}), Error);
}

TEST(TokenizerFiles, ErrorsNameTheFileAndTheProblem) {
  auto dir = testing::scratch_dir("tokenizer-errors");
  EXPECT_NE(error_of([&] {
              make_tokenizer({"SentencePieceTokenizer", {}, {}, {}});
            }).find("GPT2BPETokenizer"),
            std::string::npos);
  EXPECT_NE(error_of([&] {
              make_tokenizer({"GPT2BPETokenizer", {}, dir / "nope.json", dir / "m.txt"});
            }).find("nope.json"),
            std::string::npos);
  testing::write_file(dir / "bad.json", "{\"a\": ");
  testing::write_file(dir / "merges.txt", "#version: 0.2\nx y\n");
  EXPECT_NE(error_of([&] {
              make_tokenizer({"GPT2BPETokenizer", {}, dir / "bad.json", dir / "merges.txt"});
            }).find("bad.json is not valid JSON"),
            std::string::npos);
  auto files = testing::write_tiny_gpt2(dir / "tiny");
  testing::write_file(files.merges, "#version: 0.2\n\xC4\xA0t h\xC3\xA9llo\n");
  auto message = error_of([&] { make_tokenizer({"GPT2BPETokenizer", {}, files.vocab, files.merges}); });
  EXPECT_NE(message.find("merge 1 ('\xC4\xA0t' + 'h\xC3\xA9llo')"), std::string::npos) << message;
  EXPECT_NE(message.find("merges.txt"), std::string::npos) << message;
}

// Found by fuzz/tokenizer_json_fuzz: PCRE2's refusal of a Split pattern named the pattern only.
TEST(TokenizerFiles, ABadSplitPatternNamesTheFile) {
  auto path = testing::write_tiny_hugging_face(testing::scratch_dir("bad-pattern"));
  auto root = nlohmann::json::parse(read_text_file(path));
  root["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "(unclosed";
  testing::write_file(path, root.dump());
  auto message = error_of([&] { make_tokenizer({"HuggingFaceTokenizer", path, {}, {}}); });
  EXPECT_NE(message.find(path.string()), std::string::npos) << message;
  EXPECT_NE(message.find("(unclosed"), std::string::npos) << message;
}

// Found by fuzz/tokenizer_json: a missing model.vocab or Sequence.pretokenizers was read through
// a const json's operator[], undefined behaviour (an assertion in debug builds).
TEST(TokenizerFiles, MissingVocabOrPretokenizersNameTheFile) {
  auto path = testing::write_tiny_hugging_face(testing::scratch_dir("missing-fields"));
  const auto good = nlohmann::json::parse(read_text_file(path));
  auto no_vocab = good;
  no_vocab["model"].erase("vocab");
  testing::write_file(path, no_vocab.dump());
  auto message = error_of([&] { read_hugging_face_tokenizer(path); });
  EXPECT_NE(message.find(path.string() + ": model has no vocab"), std::string::npos) << message;
  auto no_steps = good;
  no_steps["pre_tokenizer"].erase("pretokenizers");
  testing::write_file(path, no_steps.dump());
  message = error_of([&] { read_hugging_face_tokenizer(path); });
  EXPECT_NE(message.find(path.string() + ": pre_tokenizer Sequence has no pretokenizers array"), std::string::npos)
      << message;
}

class RealTokenizers : public ::testing::Test {
 protected:
  void SetUp() override {
    std::string why;
    files_ = testing::real_tokenizers(&why);
    if (!files_) GTEST_SKIP() << "no real tokenizer files (run `kiln data tokenizers`): " << why;
  }
  std::optional<FetchedTokenizers> files_;
};

TEST_F(RealTokenizers, Gpt2IdsAreTiktokens) {
  auto tok = make_tokenizer({"GPT2BPETokenizer", {}, files_->gpt2_vocab, files_->gpt2_merges});
  EXPECT_EQ(tok->vocab_size(), 50257);
  EXPECT_EQ(tok->eod(), 50256);
  // Reference ids: tiktoken's r50k_base (GPT-2) encode_ordinary.
  EXPECT_EQ(tok->encode("Hello world"), (Ids{15496, 995}));
  EXPECT_EQ(tok->encode("<|endoftext|>"), (Ids{27, 91, 437, 1659, 5239, 91, 29}));
  EXPECT_EQ(tok->encode("I'm   \n\n  spaced"), (Ids{40, 1101, 220, 220, 220, 628, 220, 38980}));
  EXPECT_EQ(tok->encode("日本語😀"), (Ids{33768, 98, 17312, 105, 45739, 252, 47249, 222}));
}

TEST_F(RealTokenizers, Gpt2TokenizerJsonGivesTheIdsOfTheFiles) {
  expect_tokenizer_json_matches_gpt2_files(files_->gpt2_vocab, files_->gpt2_merges,
                                           testing::scratch_dir("real-gpt2-json"));
}

TEST_F(RealTokenizers, Llama3IdsAreHuggingFaces) {
  auto tok = make_tokenizer({"HuggingFaceTokenizer", files_->llama3_tokenizer_json, {}, {}});
  EXPECT_EQ(tok->vocab_size(), 128256);
  EXPECT_EQ(tok->eod(), 128001);  // <|end_of_text|>
  // Reference ids: Hugging Face tokenizers, add_special_tokens=False.
  EXPECT_EQ(tok->encode("Hello world"), (Ids{9906, 1917}));
  EXPECT_EQ(tok->encode("<|begin_of_text|>Hi<|end_of_text|>"), (Ids{128000, 13347, 128001}));
  EXPECT_EQ(tok->encode("I'm   \n\n  spaced"), (Ids{40, 2846, 35033, 220, 64928}));
  EXPECT_EQ(tok->encode("日本語😀"), (Ids{102433, 102158, 76460, 222}));
  EXPECT_EQ(tok->encode("  12345 tokens"), (Ids{220, 220, 4513, 1774, 11460}));
}

TEST_F(RealTokenizers, RoundTripBrokenUtf8) {
  for (const auto& tok : {make_tokenizer({"GPT2BPETokenizer", {}, files_->gpt2_vocab, files_->gpt2_merges}),
                          make_tokenizer({"HuggingFaceTokenizer", files_->llama3_tokenizer_json, {}, {}})}) {
    BpeTokenizer::State state;
    for (const auto& text : hard_texts()) {
      Ids ids;
      tok->encode(text, state, ids);
      EXPECT_EQ(tok->decode(ids), text);
    }
  }
}

}  // namespace tokenizer_test
}  // namespace kiln::data
