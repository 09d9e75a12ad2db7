#pragma once
// The per-thread cache of BPE results: piece bytes -> token ids. Text repeats its words (Zipf), so
// most pieces are found here and never merged. One open-addressing table over two arenas (the
// pieces' bytes and their ids): a lookup is a hash, one or two probes and a memcmp, with no
// pointer chasing and no allocation per entry. Bounded: past kMaxEntries entries or kMaxKeyBytes
// of pieces it starts over.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::data {

class PieceCache {
 public:
  static constexpr std::size_t kMaxEntries = 1u << 20;
  static constexpr std::size_t kMaxKeyBytes = 32u << 20;

  static std::uint64_t hash(std::string_view piece);

  // The ids cached for `piece` (whose hash is `h`), or an empty span (no piece has zero ids).
  std::span<const std::int32_t> find(std::string_view piece, std::uint64_t h) const {
    if (slots_.empty()) return {};
    std::size_t mask = slots_.size() - 1;
    for (std::size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.hash == 0) return {};
      if (s.hash == h && s.key_size == piece.size() &&
          std::string_view(keys_.data() + s.key_offset, s.key_size) == piece) {
        return {ids_.data() + s.ids_offset, s.ids_count};
      }
    }
  }

  void insert(std::string_view piece, std::uint64_t h, std::span<const std::int32_t> ids);
  std::size_t size() const { return count_; }
  void clear();

 private:
  struct Slot {
    std::uint64_t hash = 0;  // 0: empty (hash() never returns 0)
    std::uint32_t key_offset = 0;
    std::uint32_t key_size = 0;
    std::uint32_t ids_offset = 0;
    std::uint32_t ids_count = 0;
  };
  void grow();

  std::vector<Slot> slots_;
  std::string keys_;
  std::vector<std::int32_t> ids_;
  std::size_t count_ = 0;
};

}  // namespace kiln::data
