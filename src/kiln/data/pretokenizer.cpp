#define PCRE2_CODE_UNIT_WIDTH 8
#include "kiln/data/pretokenizer.h"

#include <pcre2.h>

#include <utility>

#include "kiln/runtime/error.h"

namespace kiln::data {

namespace {

// Unicode's White_Space property, as a class body: what \s means in Rust's regex and Oniguruma.
constexpr std::string_view kWhiteSpace =
    R"(\x{9}-\x{d}\x{20}\x{85}\x{a0}\x{1680}\x{2000}-\x{200a}\x{2028}\x{2029}\x{202f}\x{205f}\x{3000})";

std::string pcre2_message(int code) {
  PCRE2_UCHAR buffer[256];
  pcre2_get_error_message(code, buffer, sizeof(buffer));
  return reinterpret_cast<const char*>(buffer);
}

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }
pcre2_match_data* as_match_data(void* p) { return static_cast<pcre2_match_data*>(p); }

}  // namespace

std::string Pretokenizer::to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 64);
  bool in_class = false;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    char c = pattern[i];
    if (c == '\\' && i + 1 < pattern.size()) {
      char e = pattern[i + 1];
      ++i;
      if (e == 's') {
        out += in_class ? std::string(kWhiteSpace) : "[" + std::string(kWhiteSpace) + "]";
      } else if (e == 'S') {
        KILN_CHECK(!in_class, "pre-tokenizer pattern '{}': \\S inside a character class is not supported", pattern);
        out += "[^" + std::string(kWhiteSpace) + "]";
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (!in_class && c == '[') {
      in_class = true;
      out += c;
      // A ']' right after '[' or '[^' is a literal, not the end of the class.
      if (i + 1 < pattern.size() && pattern[i + 1] == '^') out += pattern[++i];
      if (i + 1 < pattern.size() && pattern[i + 1] == ']') out += pattern[++i];
      continue;
    }
    if (in_class && c == ']') in_class = false;
    out += c;
  }
  return out;
}

Pretokenizer::Pretokenizer(std::string_view pattern) : pattern_(pattern) {
  std::string translated = to_pcre2(pattern);
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                                   PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  KILN_CHECK(code != nullptr, "pre-tokenizer pattern '{}' does not compile at offset {}: {}", pattern, offset,
             pcre2_message(error));
  code_ = code;
  // Without the JIT (a PCRE2 built without it) the interpreter gives the same pieces, slower.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

Pretokenizer::~Pretokenizer() {
  if (code_) pcre2_code_free(as_code(code_));
}

Pretokenizer::Pretokenizer(Pretokenizer&& other) noexcept
    : pattern_(std::move(other.pattern_)), code_(std::exchange(other.code_, nullptr)), jit_(other.jit_) {}

Pretokenizer& Pretokenizer::operator=(Pretokenizer&& other) noexcept {
  if (this != &other) {
    if (code_) pcre2_code_free(as_code(code_));
    pattern_ = std::move(other.pattern_);
    code_ = std::exchange(other.code_, nullptr);
    jit_ = other.jit_;
  }
  return *this;
}

Pretokenizer::Scratch::Scratch() {
  // Two ovector pairs: the patterns Kiln uses report only the whole match.
  match_data_ = pcre2_match_data_create(2, nullptr);
  KILN_CHECK(match_data_ != nullptr, "pre-tokenizer: out of memory for PCRE2 match data");
}

Pretokenizer::Scratch::~Scratch() {
  if (match_data_) pcre2_match_data_free(as_match_data(match_data_));
}

Pretokenizer::Scratch::Scratch(Scratch&& other) noexcept : match_data_(std::exchange(other.match_data_, nullptr)) {}

Pretokenizer::Scratch& Pretokenizer::Scratch::operator=(Scratch&& other) noexcept {
  if (this != &other) {
    if (match_data_) pcre2_match_data_free(as_match_data(match_data_));
    match_data_ = std::exchange(other.match_data_, nullptr);
  }
  return *this;
}

void Pretokenizer::split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const {
  pieces.clear();
  auto* code = as_code(code_);
  auto* md = as_match_data(scratch.match_data_);
  auto subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  PCRE2_SIZE start = 0;
  PCRE2_SIZE gap_start = 0;
  const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(md);
  while (start < text.size()) {
    int rc = jit_ ? pcre2_jit_match(code, subject, text.size(), start, 0, md, nullptr)
                  : pcre2_match(code, subject, text.size(), start, 0, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    KILN_CHECK(rc >= 0, "pre-tokenizer pattern '{}': matching failed at byte {}: {}", pattern_, start,
               pcre2_message(rc));
    PCRE2_SIZE begin = ovector[0];
    PCRE2_SIZE end = ovector[1];
    if (begin > gap_start) pieces.push_back(text.substr(gap_start, begin - gap_start));
    if (end == begin) {
      // An empty match adds nothing; step over one byte so the scan moves on (that byte joins the
      // next gap).
      start = begin + 1;
      continue;
    }
    pieces.push_back(text.substr(begin, end - begin));
    start = gap_start = end;
  }
  if (gap_start < text.size()) pieces.push_back(text.substr(gap_start));
}

}  // namespace kiln::data
