#pragma once
// The pre-tokenizer of byte-level BPE: a regular expression with Unicode classes cuts text into
// pieces ("words") that BPE then encodes one by one. Compiled with PCRE2 and its JIT.
//
// Text is bytes: invalid UTF-8 never stops matching (PCRE2_MATCH_INVALID_UTF). An invalid
// sequence cannot be part of a match, so it ends up in a gap between matches, and gaps are pieces
// of their own (the "Isolated" split behaviour of Hugging Face), so no byte is ever dropped.
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class Pretokenizer {
 public:
  // The GPT-2 pattern (also the ByteLevel pre-tokenizer's with use_regex=true).
  static constexpr std::string_view kGpt2Pattern =
      R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

  // Per-thread scratch: PCRE2 match data. One Pretokenizer may be shared by threads that each
  // hold their own Scratch.
  class Scratch {
   public:
    Scratch();
    ~Scratch();
    Scratch(const Scratch&) = delete;
    Scratch& operator=(const Scratch&) = delete;
    Scratch(Scratch&&) noexcept;
    Scratch& operator=(Scratch&&) noexcept;

   private:
    friend class Pretokenizer;
    void* match_data_ = nullptr;  // pcre2_match_data_8*
  };

  // Compiles `pattern` (Hugging Face / Rust-regex syntax). \s and \S are rewritten to the
  // Unicode White_Space set, which Rust's regex and Oniguruma use and PCRE2's \s does not quite
  // (PCRE2 leaves out U+0085). Throws kiln::Error naming the pattern when it does not compile.
  explicit Pretokenizer(std::string_view pattern);
  ~Pretokenizer();
  Pretokenizer(const Pretokenizer&) = delete;
  Pretokenizer& operator=(const Pretokenizer&) = delete;
  Pretokenizer(Pretokenizer&&) noexcept;
  Pretokenizer& operator=(Pretokenizer&&) noexcept;

  // Replaces `pieces` with the pieces of `text`, in order; they cover `text` exactly.
  void split(std::string_view text, Scratch& scratch, std::vector<std::string_view>& pieces) const;

  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

  // The pattern after the \s / \S rewrite, as handed to PCRE2 (exposed for tests).
  static std::string to_pcre2(std::string_view pattern);

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace kiln::data
