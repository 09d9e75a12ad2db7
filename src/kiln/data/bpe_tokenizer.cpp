#include "kiln/data/bpe_tokenizer.h"

#include <algorithm>
#include <bit>
#include <climits>
#include <cstring>

#include "kiln/data/byte_level.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace {

constexpr std::int32_t kNoMerge = INT32_MAX;
// Pieces up to this many bytes are merged by scanning an array (fast for the short words that
// dominate text); longer ones (runs of spaces, minified code) with a heap, in O(n log n).
constexpr std::size_t kShortPiece = 48;
// Pieces longer than this are not cached: they rarely repeat and would crowd out the rest.
constexpr std::size_t kMaxCachedPiece = 128;

std::uint64_t pair_key(std::int32_t left, std::int32_t right) {
  return (static_cast<std::uint64_t>(static_cast<std::uint32_t>(left)) << 32) | static_cast<std::uint32_t>(right);
}

// A pattern from a tokenizer file that PCRE2 refuses: the error names the file too.
Pretokenizer compile_pattern(const std::string& pattern, const std::string& source) {
  try {
    return Pretokenizer(pattern);
  } catch (const Error& e) {
    KILN_FAIL("tokenizer {}: {}", source, e.what());
  }
}

}  // namespace

BpeTokenizer::BpeTokenizer(BpeDefinition def)
    : source_(std::move(def.source)),
      pretokenizer_(compile_pattern(def.pattern, source_)),
      split_added_(def.split_added_tokens),
      ignore_merges_(def.ignore_merges),
      add_prefix_space_(def.add_prefix_space),
      eod_(def.eod) {
  KILN_CHECK(!def.vocab.empty(), "tokenizer {}: the vocabulary is empty", source_);
  std::int32_t max_id = -1;
  for (const auto& [bytes, id] : def.vocab) {
    KILN_CHECK(id >= 0, "tokenizer {}: token '{}' has negative id {}", source_, bytes, id);
    max_id = std::max(max_id, id);
  }
  for (const auto& added : def.added_tokens) {
    KILN_CHECK(added.id >= 0, "tokenizer {}: added token '{}' has negative id {}", source_, added.content, added.id);
    KILN_CHECK(!added.content.empty(), "tokenizer {}: added token {} is empty", source_, added.id);
    max_id = std::max(max_id, added.id);
  }
  // Ids number the tokens, and id -> bytes is a table of max_id + 1 entries: a stray id near 2^31
  // would ask for tens of GB (bad_alloc). Allow gaps (reserved ids), not a table mostly empty.
  const std::int64_t defined = static_cast<std::int64_t>(def.vocab.size() + def.added_tokens.size());
  const std::int64_t id_limit = 2 * defined + 1024;
  if (max_id >= id_limit) {
    std::string token;
    for (const auto& [bytes, id] : def.vocab) {
      if (id == max_id) token = bytes_to_byte_level(bytes);
    }
    for (const auto& added : def.added_tokens) {
      if (added.id == max_id) token = added.content;
    }
    KILN_FAIL(
        "tokenizer {}: token '{}' has id {}, far beyond the {} tokens the file defines (ids must number the "
        "tokens, below {} here)",
        source_, token, max_id, defined, id_limit);
  }
  id_bytes_.resize(static_cast<std::size_t>(max_id) + 1);
  id_special_.assign(id_bytes_.size(), false);
  vocab_.reserve(def.vocab.size());
  for (auto& [bytes, id] : def.vocab) {
    id_bytes_[id] = bytes;
    vocab_.emplace(std::move(bytes), id);
  }
  for (int b = 0; b < 256; ++b) {
    auto it = vocab_.find(std::string_view(reinterpret_cast<const char*>(&b), 1));
    KILN_CHECK(it != vocab_.end(), "tokenizer {}: byte 0x{:02x} has no token (not a byte-level BPE vocabulary)",
               source_, b);
    byte_ids_[b] = it->second;
  }
  build_merge_table(def.merges);
  byte_pairs_.resize(256 * 256);
  for (int a = 0; a < 256; ++a) {
    for (int b = 0; b < 256; ++b) {
      const MergeSlot* m = find_merge(byte_ids_[a], byte_ids_[b]);
      byte_pairs_[a << 8 | b] = m ? BytePairMerge{m->rank, m->merged} : BytePairMerge{kNoMerge, -1};
    }
  }
  if (ignore_merges_) {
    KILN_CHECK(vocab_.size() < PieceCache::kMaxEntries, "tokenizer {}: a vocabulary of {} tokens is too large", source_,
               vocab_.size());
    for (const auto& [bytes, id] : vocab_) whole_pieces_.insert(bytes, PieceCache::hash(bytes), std::span(&id, 1));
  }

  added_ = std::move(def.added_tokens);
  added_by_first_byte_.resize(256);
  for (std::uint32_t i = 0; i < added_.size(); ++i) {
    const auto& added = added_[i];
    id_bytes_[added.id] = added.content;
    id_special_[added.id] = added.special;
    auto& list = added_by_first_byte_[static_cast<unsigned char>(added.content[0])];
    if (list.empty()) added_first_bytes_.push_back(added.content[0]);
    list.push_back(i);
  }
  for (auto& list : added_by_first_byte_) {
    std::stable_sort(list.begin(), list.end(), [&](std::uint32_t a, std::uint32_t b) {
      return added_[a].content.size() > added_[b].content.size();
    });
  }
  if (eod_) {
    KILN_CHECK(*eod_ >= 0 && *eod_ < vocab_size(), "tokenizer {}: end-of-document id {} is outside the vocabulary",
               source_, *eod_);
  }
}

void BpeTokenizer::build_merge_table(const std::vector<std::pair<std::string, std::string>>& merges) {
  std::size_t capacity = std::bit_ceil(std::max<std::size_t>(16, merges.size() * 2));
  merge_table_.assign(capacity, MergeSlot{});
  merge_shift_ = 64 - std::countr_zero(capacity);
  for (std::size_t rank = 0; rank < merges.size(); ++rank) {
    const auto& [left, right] = merges[rank];
    auto l = vocab_.find(left);
    auto r = vocab_.find(right);
    auto m = vocab_.find(left + right);
    KILN_CHECK(l != vocab_.end() && r != vocab_.end() && m != vocab_.end(),
               "tokenizer {}: merge {} ('{}' + '{}') uses a token that is not in the vocabulary", source_, rank + 1,
               bytes_to_byte_level(left), bytes_to_byte_level(right));
    std::uint64_t key = pair_key(l->second, r->second);
    std::size_t slot = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
    while (merge_table_[slot].key != kEmpty && merge_table_[slot].key != key) slot = (slot + 1) & (capacity - 1);
    // A repeated merge takes its last rank: Hugging Face collects the merges into a map and GPT-2's
    // encoder.py into a dict, where the later entry overwrites the earlier.
    merge_table_[slot] = MergeSlot{key, static_cast<std::int32_t>(rank), m->second};
  }
}

const BpeTokenizer::MergeSlot* BpeTokenizer::find_merge(std::int32_t left, std::int32_t right) const {
  std::uint64_t key = pair_key(left, right);
  std::size_t mask = merge_table_.size() - 1;
  std::size_t slot = (key * 0x9E3779B97F4A7C15ull) >> merge_shift_;
  while (true) {
    const MergeSlot& s = merge_table_[slot];
    if (s.key == key) return &s;
    if (s.key == kEmpty) return nullptr;
    slot = (slot + 1) & mask;
  }
}

std::optional<std::int32_t> BpeTokenizer::token_to_id(std::string_view bytes) const {
  for (const auto& added : added_) {
    if (added.content == bytes) return added.id;
  }
  auto it = vocab_.find(bytes);
  if (it == vocab_.end()) return std::nullopt;
  return it->second;
}

std::string_view BpeTokenizer::id_to_bytes(std::int32_t id) const {
  KILN_CHECK(id >= 0 && id < vocab_size(), "tokenizer {}: id {} is outside the vocabulary (size {})", source_, id,
             vocab_size());
  return id_bytes_[id];
}

std::pair<std::size_t, std::size_t> BpeTokenizer::find_added(std::string_view text, std::size_t from) const {
  bool one_first_byte = added_first_bytes_.size() == 1;
  for (std::size_t pos = from; pos < text.size(); ++pos) {
    if (one_first_byte) {
      pos = text.find(added_first_bytes_[0], pos);  // memchr
      if (pos == std::string_view::npos) break;
    }
    const auto& candidates = added_by_first_byte_[static_cast<unsigned char>(text[pos])];
    for (std::uint32_t index : candidates) {
      const std::string& content = added_[index].content;
      if (text.compare(pos, content.size(), content) == 0) return {pos, index};
    }
  }
  return {std::string_view::npos, 0};
}

std::vector<std::int32_t> BpeTokenizer::encode(std::string_view text) const {
  State state;
  std::vector<std::int32_t> out;
  encode(text, state, out);
  return out;
}

void BpeTokenizer::encode(std::string_view text, State& state, std::vector<std::int32_t>& out) const {
  if (!split_added_ || added_.empty()) {
    encode_segment(text, state, out);
    return;
  }
  std::size_t pos = 0;
  while (pos < text.size()) {
    auto [at, index] = find_added(text, pos);
    if (at == std::string_view::npos) {
      encode_segment(text.substr(pos), state, out);
      return;
    }
    if (at > pos) encode_segment(text.substr(pos, at - pos), state, out);
    out.push_back(added_[index].id);
    pos = at + added_[index].content.size();
  }
}

void BpeTokenizer::encode_segment(std::string_view text, State& state, std::vector<std::int32_t>& out) const {
  if (text.empty()) return;
  if (add_prefix_space_ && text.front() != ' ') {
    state.prefixed_.assign(1, ' ');
    state.prefixed_.append(text);
    text = state.prefixed_;
  }
  pretokenizer_.split(text, state.scratch_, state.pieces_);
  for (std::string_view piece : state.pieces_) encode_piece(piece, state, out);
}

void BpeTokenizer::encode_piece(std::string_view piece, State& state, std::vector<std::int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_ids_[static_cast<unsigned char>(piece[0])]);
    return;
  }
  bool cacheable = piece.size() <= kMaxCachedPiece;
  std::uint64_t hash = 0;
  if (cacheable) {
    hash = PieceCache::hash(piece);
    auto cached = state.cache_.find(piece, hash);
    if (!cached.empty()) {
      out.insert(out.end(), cached.begin(), cached.end());
      return;
    }
  }
  auto& symbols = state.symbols_;
  symbols.clear();
  auto whole = ignore_merges_ ? whole_pieces_.find(piece, cacheable ? hash : PieceCache::hash(piece))
                              : std::span<const std::int32_t>{};
  if (!whole.empty()) {
    symbols.push_back(whole[0]);
  } else {
    for (char c : piece) symbols.push_back(byte_ids_[static_cast<unsigned char>(c)]);
    if (piece.size() <= kShortPiece) {
      merge_short(piece, state);
    } else {
      merge_long(piece, state);
    }
  }
  out.insert(out.end(), symbols.begin(), symbols.end());
  if (cacheable) state.cache_.insert(piece, hash, symbols);
}

// Lowest rank first, the leftmost of equal ranks: the order of Hugging Face's BPE and tiktoken.
void BpeTokenizer::merge_short(std::string_view piece, State& state) const {
  auto& symbols = state.symbols_;
  auto& ranks = state.ranks_;
  auto& merged = state.merged_;
  std::size_t n = symbols.size();
  ranks.resize(n);
  merged.resize(n);
  for (std::size_t i = 0; i + 1 < n; ++i) {
    const BytePairMerge& m =
        byte_pairs_[static_cast<unsigned char>(piece[i]) << 8 | static_cast<unsigned char>(piece[i + 1])];
    ranks[i] = m.rank;
    merged[i] = m.merged;
  }
  ranks[n - 1] = kNoMerge;
  auto update = [&](std::size_t i) {
    const MergeSlot* m = find_merge(symbols[i], symbols[i + 1]);
    ranks[i] = m ? m->rank : kNoMerge;
    merged[i] = m ? m->merged : -1;
  };
  while (n > 1) {
    std::size_t best = 0;
    for (std::size_t i = 1; i + 1 < n; ++i) {
      if (ranks[i] < ranks[best]) best = i;
    }
    if (ranks[best] == kNoMerge) break;
    symbols[best] = merged[best];
    std::size_t tail = n - best - 2;
    std::memmove(&symbols[best + 1], &symbols[best + 2], tail * sizeof(std::int32_t));
    std::memmove(&ranks[best + 1], &ranks[best + 2], tail * sizeof(std::int32_t));
    std::memmove(&merged[best + 1], &merged[best + 2], tail * sizeof(std::int32_t));
    --n;
    ranks[n - 1] = kNoMerge;
    if (best + 1 < n) update(best);
    if (best > 0) update(best - 1);
  }
  symbols.resize(n);
}

void BpeTokenizer::merge_long(std::string_view piece, State& state) const {
  auto& symbols = state.symbols_;
  auto& next = state.next_;
  auto& prev = state.prev_;
  auto& heap = state.heap_;
  const auto n = static_cast<std::int32_t>(symbols.size());
  next.resize(n);
  prev.resize(n);
  for (std::int32_t i = 0; i < n; ++i) {
    next[i] = i + 1 < n ? i + 1 : -1;
    prev[i] = i - 1;
  }
  // A min-heap on (rank, pos): std::*_heap keep the largest first, so compare reversed.
  auto later = [](const State::Candidate& a, const State::Candidate& b) {
    return a.rank != b.rank ? a.rank > b.rank : a.pos > b.pos;
  };
  heap.clear();
  auto push = [&](std::int32_t pos) {
    if (pos < 0 || next[pos] < 0) return;
    std::int32_t right = next[pos];
    if (const MergeSlot* m = find_merge(symbols[pos], symbols[right])) {
      heap.push_back({m->rank, pos, symbols[pos], symbols[right], m->merged});
      std::push_heap(heap.begin(), heap.end(), later);
    }
  };
  for (std::int32_t i = 0; i + 1 < n; ++i) {
    const BytePairMerge& m =
        byte_pairs_[static_cast<unsigned char>(piece[i]) << 8 | static_cast<unsigned char>(piece[i + 1])];
    if (m.rank != kNoMerge) heap.push_back({m.rank, i, symbols[i], symbols[i + 1], m.merged});
  }
  std::make_heap(heap.begin(), heap.end(), later);
  constexpr std::int32_t kMergedAway = -2;
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), later);
    State::Candidate c = heap.back();
    heap.pop_back();
    std::int32_t right = next[c.pos];
    // Stale: the left symbol was merged away or grew, or its right neighbour changed.
    if (prev[c.pos] == kMergedAway || right < 0 || symbols[c.pos] != c.left || symbols[right] != c.right) continue;
    symbols[c.pos] = c.merged;
    prev[right] = kMergedAway;
    next[c.pos] = next[right];
    if (next[right] >= 0) prev[next[right]] = c.pos;
    push(prev[c.pos]);
    push(c.pos);
  }
  std::size_t out = 0;
  for (std::int32_t i = 0; i >= 0; i = next[i]) symbols[out++] = symbols[i];
  symbols.resize(out);
}

std::string BpeTokenizer::decode(std::span<const std::int32_t> ids, bool skip_special) const {
  std::string out;
  for (std::int32_t id : ids) {
    KILN_CHECK(id >= 0 && id < vocab_size(), "tokenizer {}: cannot decode id {}: outside the vocabulary (size {})",
               source_, id, vocab_size());
    if (skip_special && id_special_[id]) continue;
    out += id_bytes_[id];
  }
  return out;
}

}  // namespace kiln::data
