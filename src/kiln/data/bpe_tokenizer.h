#pragma once
// Byte-level BPE, as GPT-2, Llama 3 and most current LLMs use it: text is cut into pieces by a
// regex (Pretokenizer), each piece's bytes start as one symbol each, and the lowest-ranked merge
// of two adjacent symbols is applied until none applies. The same rules as Hugging Face
// `tokenizers` and `tiktoken`, so the ids are the same.
//
// Speed: pieces repeat (Zipf), so each thread caches the ids of the pieces it has encoded; the
// merge table is an open-addressing hash of (left id, right id); encode appends to the caller's
// vector and allocates nothing once its scratch has warmed up.
#include <cstdint>
#include <functional>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kiln/data/piece_cache.h"
#include "kiln/data/pretokenizer.h"

namespace kiln::data {

// A token matched in the text before pre-tokenization (Hugging Face's added tokens, such as
// "<|begin_of_text|>"), or only known by id (GPT-2's "<|endoftext|>").
struct AddedToken {
  std::string content;
  std::int32_t id = 0;
  bool special = true;
};

// What a tokenizer file says, in raw bytes (the byte-level alphabet already undone); the loaders
// in tokenizer_files.h produce it.
struct BpeDefinition {
  std::string source;  // the file(s) it came from, for messages
  std::vector<std::pair<std::string, std::int32_t>> vocab;
  std::vector<std::pair<std::string, std::string>> merges;  // rank order
  std::vector<AddedToken> added_tokens;
  bool split_added_tokens = true;  // match added tokens in the text (Hugging Face) or not (Megatron's GPT-2)
  std::string pattern{Pretokenizer::kGpt2Pattern};
  bool ignore_merges = false;     // a piece that is itself in the vocabulary is one token (Llama 3)
  bool add_prefix_space = false;  // ByteLevel(add_prefix_space=true): " " before text not starting with one
  std::optional<std::int32_t> eod;
};

class BpeTokenizer {
 public:
  // Per-thread encoding state: regex match data, the piece cache and BPE work buffers. A
  // BpeTokenizer is immutable and may be shared; each thread encodes with its own State.
  class State {
   public:
    State() = default;
    std::size_t cached_pieces() const { return cache_.size(); }

   private:
    friend class BpeTokenizer;
    struct Candidate {  // a possible merge of the symbol at `pos` with the next one
      std::int32_t rank;
      std::int32_t pos;
      std::int32_t left;
      std::int32_t right;
      std::int32_t merged;
    };
    Pretokenizer::Scratch scratch_;
    std::vector<std::string_view> pieces_;
    std::string prefixed_;
    PieceCache cache_;
    std::vector<std::int32_t> symbols_;
    std::vector<std::int32_t> ranks_;
    std::vector<std::int32_t> merged_;
    std::vector<std::int32_t> next_;
    std::vector<std::int32_t> prev_;
    std::vector<Candidate> heap_;
  };

  explicit BpeTokenizer(BpeDefinition definition);

  // Appends the ids of `text` to `out`.
  void encode(std::string_view text, State& state, std::vector<std::int32_t>& out) const;
  // Convenience for tests and one-off calls (builds a fresh State: no cache).
  std::vector<std::int32_t> encode(std::string_view text) const;

  // The bytes the ids stand for (added tokens as their content; with skip_special, special added
  // tokens are left out). Throws kiln::Error on an id outside the vocabulary.
  std::string decode(std::span<const std::int32_t> ids, bool skip_special = false) const;

  // One more than the largest id, added tokens included (Megatron's vocab_size).
  std::int32_t vocab_size() const { return static_cast<std::int32_t>(id_bytes_.size()); }
  std::optional<std::int32_t> eod() const { return eod_; }
  std::optional<std::int32_t> token_to_id(std::string_view bytes) const;
  // The bytes of one id (empty for an id no token has).
  std::string_view id_to_bytes(std::int32_t id) const;
  const std::string& source() const { return source_; }
  const Pretokenizer& pretokenizer() const { return pretokenizer_; }
  const std::vector<AddedToken>& added_tokens() const { return added_; }

 private:
  struct MergeSlot {
    std::uint64_t key = kEmpty;
    std::int32_t rank = 0;
    std::int32_t merged = 0;
  };
  static constexpr std::uint64_t kEmpty = ~std::uint64_t{0};

  void build_merge_table(const std::vector<std::pair<std::string, std::string>>& merges);
  const MergeSlot* find_merge(std::int32_t left, std::int32_t right) const;
  void encode_segment(std::string_view text, State& state, std::vector<std::int32_t>& out) const;
  void encode_piece(std::string_view piece, State& state, std::vector<std::int32_t>& out) const;
  // BPE of one piece whose symbols (its bytes' ids) are in state.symbols_; leaves the result there.
  void merge_short(std::string_view piece, State& state) const;
  void merge_long(std::string_view piece, State& state) const;
  // The next added token at or after `from`: (position, index into added_), or npos.
  std::pair<std::size_t, std::size_t> find_added(std::string_view text, std::size_t from) const;

  std::string source_;
  Pretokenizer pretokenizer_;
  struct StringHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, std::int32_t, StringHash, std::equal_to<>> vocab_;
  std::vector<std::string> id_bytes_;
  std::vector<bool> id_special_;
  std::int32_t byte_ids_[256];
  std::vector<MergeSlot> merge_table_;
  // The merges of two single-byte tokens, by (first byte << 8 | second byte): every piece starts
  // with these lookups, and this table stays in cache where merge_table_ does not.
  struct BytePairMerge {
    std::int32_t rank;
    std::int32_t merged;
  };
  std::vector<BytePairMerge> byte_pairs_;
  // ignore_merges: the whole-piece lookup, in a flat table (vocab_ is node-based and cold).
  PieceCache whole_pieces_;
  int merge_shift_ = 64;
  std::vector<AddedToken> added_;
  // Per first byte, the added tokens starting with it, longest first (leftmost-longest matching).
  std::vector<std::vector<std::uint32_t>> added_by_first_byte_;
  // The distinct first bytes of the added tokens: with one (Llama 3: '<'), memchr finds candidates.
  std::string added_first_bytes_;
  bool split_added_ = true;
  bool ignore_merges_ = false;
  bool add_prefix_space_ = false;
  std::optional<std::int32_t> eod_;
};

}  // namespace kiln::data
