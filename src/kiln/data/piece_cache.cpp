#include "kiln/data/piece_cache.h"

#include <cstring>

namespace kiln::data {

std::uint64_t PieceCache::hash(std::string_view piece) {
  // Eight bytes at a time, each word mixed by a multiply and a rotate; good enough for a table
  // whose keys are not chosen by an adversary, and much cheaper than std::hash on short words.
  constexpr std::uint64_t kMul = 0x9E3779B97F4A7C15ull;
  std::uint64_t h = piece.size() * kMul;
  std::size_t i = 0;
  for (; i + 8 <= piece.size(); i += 8) {
    std::uint64_t w;
    std::memcpy(&w, piece.data() + i, 8);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  if (i < piece.size()) {
    std::uint64_t w = 0;
    std::memcpy(&w, piece.data() + i, piece.size() - i);
    h = (h ^ w) * kMul;
    h ^= h >> 29;
  }
  h *= 0xBF58476D1CE4E5B9ull;
  h ^= h >> 32;
  return h | 1;
}

void PieceCache::clear() {
  slots_.clear();
  keys_.clear();
  ids_.clear();
  count_ = 0;
}

void PieceCache::grow() {
  std::vector<Slot> old = std::move(slots_);
  slots_.assign(old.empty() ? 4096 : old.size() * 2, Slot{});
  std::size_t mask = slots_.size() - 1;
  for (const Slot& s : old) {
    if (s.hash == 0) continue;
    std::size_t i = s.hash & mask;
    while (slots_[i].hash != 0) i = (i + 1) & mask;
    slots_[i] = s;
  }
}

void PieceCache::insert(std::string_view piece, std::uint64_t h, std::span<const std::int32_t> ids) {
  if (count_ >= kMaxEntries || keys_.size() + piece.size() > kMaxKeyBytes) clear();
  if ((count_ + 1) * 2 > slots_.size()) grow();
  std::size_t mask = slots_.size() - 1;
  std::size_t i = h & mask;
  while (slots_[i].hash != 0) i = (i + 1) & mask;
  slots_[i] = Slot{h, static_cast<std::uint32_t>(keys_.size()), static_cast<std::uint32_t>(piece.size()),
                   static_cast<std::uint32_t>(ids_.size()), static_cast<std::uint32_t>(ids.size())};
  keys_.append(piece);
  ids_.insert(ids_.end(), ids.begin(), ids.end());
  ++count_;
}

}  // namespace kiln::data
