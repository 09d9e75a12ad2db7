#include "kiln/hpc/md/xtc_coordinates.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

// The sizes of the small differences: about 2^(i/3), so that three of them take i bits together.
// Index 9 is the first in use. These exact values are part of the format.
constexpr std::array<int, 73> kMagicInts = {
    0,       0,       0,       0,       0,        0,        0,       0,       0,       8,       10,
    12,      16,      20,      25,      32,       40,       50,      64,      80,      101,     128,
    161,     203,     256,     322,     406,      512,      645,     812,     1024,    1290,    1625,
    2048,    2580,    3250,    4096,    5060,     6501,     8192,    10321,   13003,   16384,   20642,
    26007,   32768,   41285,   52015,   65536,    82570,    104031,  131072,  165140,  208063,  262144,
    330280,  416127,  524287,  660561,  832255,   1048576,  1321122, 1664510, 2097152, 2642245, 3329021,
    4194304, 5284491, 6658042, 8388607, 10568983, 13316085, 16777216};
constexpr int kFirstIndex = 9;
constexpr int kIndexCount = static_cast<int>(kMagicInts.size());
constexpr int kRunLimit = 8;  // atoms in one run of small differences
// |x * precision| must stay below this to be stored as a 32-bit integer.
constexpr double kMaxAbs = static_cast<double>(INT_MAX - 2);

// A bit stream, most significant bit first; the last byte is padded with zero bits.
class BitWriter {
 public:
  void put(int nbits, std::uint32_t value) {
    pending_ = (pending_ << nbits) | value;
    pending_bits_ += nbits;
    while (pending_bits_ >= 8) {
      pending_bits_ -= 8;
      bytes_.push_back(static_cast<char>((pending_ >> pending_bits_) & 0xff));
    }
    pending_ &= (std::uint64_t{1} << pending_bits_) - 1;
  }
  std::string finish() {
    if (pending_bits_ > 0) bytes_.push_back(static_cast<char>((pending_ << (8 - pending_bits_)) & 0xff));
    pending_bits_ = 0;
    return bytes_;
  }

 private:
  std::string bytes_;
  std::uint64_t pending_ = 0;
  int pending_bits_ = 0;
};

class BitReader {
 public:
  BitReader(std::string_view bytes, const XdrReader& where) : bytes_(bytes), where_(where) {}
  std::uint32_t get(int nbits) {
    KILN_CHECK(bit_ + static_cast<std::size_t>(nbits) <= 8 * bytes_.size(),
               "{}: the compressed coordinates before byte {} end early", where_.name(), where_.offset());
    std::uint64_t v = 0;
    for (int k = 0; k < nbits; ++k, ++bit_)
      v = (v << 1) | ((static_cast<unsigned char>(bytes_[bit_ / 8]) >> (7 - bit_ % 8)) & 1u);
    return static_cast<std::uint32_t>(v);
  }

 private:
  std::string_view bytes_;
  const XdrReader& where_;
  std::size_t bit_ = 0;
};

// The number of bits of `v` (the format sizes a field by its range's count, not count - 1).
int bit_length(std::uint64_t v) { return v == 0 ? 0 : 64 - std::countl_zero(v); }

// A little-endian multi-byte unsigned integer, for three values packed as one mixed-radix number
// ((a * size_b + b) * size_c + c), which can exceed 64 bits.
using Bytes = std::vector<std::uint32_t>;

void multiply_add(Bytes& n, std::uint64_t factor, std::uint64_t addend) {
  std::uint64_t carry = addend;
  for (auto& byte : n) {
    carry += byte * factor;
    byte = static_cast<std::uint32_t>(carry & 0xff);
    carry >>= 8;
  }
  for (; carry != 0; carry >>= 8) n.push_back(static_cast<std::uint32_t>(carry & 0xff));
}

int bits_of_product(const std::array<std::uint64_t, 3>& sizes) {
  Bytes n = {1};
  for (auto s : sizes) multiply_add(n, s, 0);
  while (n.size() > 1 && n.back() == 0) n.pop_back();
  return 8 * static_cast<int>(n.size() - 1) + bit_length(n.back());
}

// The number is sent in chunks of 8 bits, least significant byte first, the last chunk holding
// the bits left over.
void put_packed(BitWriter& bits, int nbits, const std::array<std::uint64_t, 3>& sizes,
                const std::array<std::int64_t, 3>& values) {
  Bytes n = {0};
  for (int k = 0; k < 3; ++k) multiply_add(n, sizes[k], static_cast<std::uint64_t>(values[k]));
  for (int sent = 0, byte = 0; sent < nbits; sent += 8, ++byte) {
    const int chunk = std::min(8, nbits - sent);
    bits.put(chunk, byte < static_cast<int>(n.size()) ? n[byte] : 0);
  }
}

std::array<std::int64_t, 3> get_packed(BitReader& bits, int nbits, const std::array<std::uint64_t, 3>& sizes,
                                       const XdrReader& where) {
  Bytes n;
  for (int got = 0; got < nbits; got += 8) n.push_back(bits.get(std::min(8, nbits - got)));
  std::array<std::int64_t, 3> values{};
  for (int k = 2; k >= 1; --k) {
    std::uint64_t remainder = 0;
    for (auto it = n.rbegin(); it != n.rend(); ++it) {
      remainder = (remainder << 8) | *it;
      *it = static_cast<std::uint32_t>(remainder / sizes[k]);
      remainder %= sizes[k];
    }
    values[k] = static_cast<std::int64_t>(remainder);
  }
  std::uint64_t first = 0;
  for (auto it = n.rbegin(); it != n.rend(); ++it) {
    KILN_CHECK(first < (std::uint64_t{1} << 40), "{}: a packed coordinate before byte {} is out of its range",
               where.name(), where.offset());
    first = (first << 8) | *it;
  }
  KILN_CHECK(first < sizes[0], "{}: a packed coordinate before byte {} is out of its range", where.name(),
             where.offset());
  values[0] = static_cast<std::int64_t>(first);
  return values;
}

// The size of the small differences at index i, and the bounds the encoder adapts within.
struct SmallSizes {
  int index;
  std::int64_t smaller, small;  // half the sizes at index - 1 and index
  explicit SmallSizes(int i)
      : index(i), smaller(kMagicInts[std::max(kFirstIndex, i - 1)] / 2), small(kMagicInts[i] / 2) {}
  void adapt(int change) {
    index += change;
    if (change < 0) {
      small = smaller;
      smaller = index > kFirstIndex ? kMagicInts[index - 1] / 2 : 0;
    } else if (change > 0) {
      smaller = small;
      small = kMagicInts[index] / 2;
    }
  }
  std::array<std::uint64_t, 3> sizes() const {
    const auto s = static_cast<std::uint64_t>(kMagicInts[index]);
    return {s, s, s};
  }
};

using IntVec3 = std::array<std::int64_t, 3>;

std::int64_t magnitude(std::int64_t v) { return v < 0 ? -v : v; }

bool within(const IntVec3& a, const IntVec3& b, std::int64_t limit) {
  for (int d = 0; d < 3; ++d)
    if (magnitude(a[d] - b[d]) >= limit) return false;
  return true;
}

std::int64_t squared_distance(const IntVec3& a, const IntVec3& b) {
  std::int64_t s = 0;
  for (int d = 0; d < 3; ++d) s += (a[d] - b[d]) * (a[d] - b[d]);
  return s;
}

// The full coordinates of one atom: one packed number, or three fields when the ranges are too
// large to multiply.
struct FullCoordinateLayout {
  IntVec3 minimum{}, maximum{};
  std::array<std::uint64_t, 3> sizes{};
  std::array<int, 3> field_bits{};
  int packed_bits = 0;  // 0: three separate fields
  void derive() {
    bool large = false;
    for (int d = 0; d < 3; ++d) {
      sizes[d] = static_cast<std::uint64_t>(maximum[d] - minimum[d] + 1);
      large = large || sizes[d] > 0xffffff;
      field_bits[d] = bit_length(sizes[d]);
    }
    packed_bits = large ? 0 : bits_of_product(sizes);
  }
  void put(BitWriter& bits, const IntVec3& c) const {
    const IntVec3 offset = {c[0] - minimum[0], c[1] - minimum[1], c[2] - minimum[2]};
    if (packed_bits == 0) {
      for (int d = 0; d < 3; ++d) bits.put(field_bits[d], static_cast<std::uint32_t>(offset[d]));
    } else {
      put_packed(bits, packed_bits, sizes, offset);
    }
  }
  IntVec3 get(BitReader& bits, const XdrReader& where) const {
    IntVec3 offset{};
    if (packed_bits == 0) {
      for (int d = 0; d < 3; ++d) offset[d] = bits.get(field_bits[d]);
    } else {
      offset = get_packed(bits, packed_bits, sizes, where);
    }
    return {minimum[0] + offset[0], minimum[1] + offset[1], minimum[2] + offset[2]};
  }
};

}  // namespace

void write_xtc_coordinates(XdrWriter& out, const std::vector<FloatVec3>& x, float precision) {
  const int natoms = static_cast<int>(x.size());
  out.put_int(natoms);
  if (natoms <= 9) {
    for (const auto& a : x)
      for (float c : a) out.put_float(c);
    return;
  }
  KILN_CHECK(precision > 0, "xtc: compressed-x-precision {} must be positive", precision);
  // Round as the format's reference does: in float, half away from zero.
  std::vector<IntVec3> q(x.size());
  FullCoordinateLayout layout;
  layout.minimum = {INT_MAX, INT_MAX, INT_MAX};
  layout.maximum = {INT_MIN, INT_MIN, INT_MIN};
  std::int64_t closest = INT_MAX;  // the smallest |dx| + |dy| + |dz| between successive atoms
  for (int i = 0; i < natoms; ++i) {
    for (int d = 0; d < 3; ++d) {
      const float scaled = x[i][d] * precision;
      const auto rounded =
          static_cast<float>(scaled >= 0 ? static_cast<double>(scaled) + 0.5 : static_cast<double>(scaled) - 0.5);
      KILN_CHECK(std::fabs(rounded) <= kMaxAbs,
                 "xtc: atom {} coordinate {} nm is too large to store at precision {} (32-bit integers)", i + 1,
                 x[i][d], precision);
      q[i][d] = static_cast<std::int32_t>(rounded);
      layout.minimum[d] = std::min(layout.minimum[d], q[i][d]);
      layout.maximum[d] = std::max(layout.maximum[d], q[i][d]);
    }
    if (i > 0)
      closest = std::min(closest, magnitude(q[i][0] - q[i - 1][0]) + magnitude(q[i][1] - q[i - 1][1]) +
                                      magnitude(q[i][2] - q[i - 1][2]));
  }
  for (int d = 0; d < 3; ++d)
    KILN_CHECK(static_cast<double>(layout.maximum[d]) - static_cast<double>(layout.minimum[d]) < kMaxAbs,
               "xtc: the coordinates span too much to store at precision {}", precision);
  out.put_float(precision);
  for (int d = 0; d < 3; ++d) out.put_int(static_cast<std::int32_t>(layout.minimum[d]));
  for (int d = 0; d < 3; ++d) out.put_int(static_cast<std::int32_t>(layout.maximum[d]));
  layout.derive();

  // The first size of small differences: the smallest that holds the closest pair of successive atoms.
  int start = kFirstIndex;
  while (start < kIndexCount - 1 && kMagicInts[start] < closest) ++start;
  out.put_int(start);
  SmallSizes small(start);
  const int max_index = std::min(kIndexCount - 1, start + 8);
  const int min_index = max_index - 8;
  const std::int64_t larger = kMagicInts[max_index] / 2;

  BitWriter bits;
  IntVec3 prev{};
  int previous_run = -1;
  std::array<std::int64_t, 3 * kRunLimit> run_values{};
  for (int i = 0; i < natoms;) {
    // Whether to grow (+1) or shrink (-1) the small size after this group, from how far this atom
    // is from the last one: a shrink is dropped below if the run's differences would not fit it.
    int change = 0;
    if (small.index < max_index && i >= 1 && within(q[i], prev, larger))
      change = 1;
    else if (small.index > min_index)
      change = -1;
    // An atom close to the next one starts a run; the two swap places, so that a water's oxygen
    // comes right before its first hydrogen, closer than either is to the previous molecule.
    bool next_small = false;
    if (i + 1 < natoms && within(q[i], q[i + 1], small.small)) {
      std::swap(q[i], q[i + 1]);
      next_small = true;
    }
    layout.put(bits, q[i]);
    prev = q[i];
    ++i;
    if (!next_small && change == -1) change = 0;
    int run = 0;
    while (next_small && run < 3 * kRunLimit) {
      if (change == -1 && squared_distance(q[i], prev) >= small.smaller * small.smaller) change = 0;
      for (int d = 0; d < 3; ++d) run_values[run++] = q[i][d] - prev[d] + small.small;
      prev = q[i];
      ++i;
      next_small = i < natoms && within(q[i], prev, small.small);
    }
    if (run != previous_run || change != 0) {
      previous_run = run;
      bits.put(1, 1);
      bits.put(5, static_cast<std::uint32_t>(run + change + 1));
    } else {
      bits.put(1, 0);
    }
    for (int k = 0; k < run; k += 3)
      put_packed(bits, small.index, small.sizes(), {run_values[k], run_values[k + 1], run_values[k + 2]});
    small.adapt(change);
  }
  const std::string packed = bits.finish();
  out.put_int(static_cast<std::int32_t>(packed.size()));
  out.put_opaque(packed);
}

std::vector<FloatVec3> read_xtc_coordinates(XdrReader& in, int natoms, float& precision) {
  const std::int32_t stored = in.get_int();
  KILN_CHECK(stored == natoms, "{}: the coordinates before byte {} are for {} atoms, the frame has {}", in.name(),
             in.offset(), stored, natoms);
  KILN_CHECK(natoms >= 0 && static_cast<std::size_t>(natoms) <= in.remaining(),
             "{}: {} atoms cannot fit in the {} bytes left at byte {}", in.name(), natoms, in.remaining(), in.offset());
  std::vector<FloatVec3> x(static_cast<std::size_t>(natoms));
  precision = 0;
  if (natoms <= 9) {
    for (auto& a : x)
      for (float& c : a) c = in.get_float();
    return x;
  }
  precision = in.get_float();
  KILN_CHECK(std::isfinite(precision) && precision > 0, "{}: precision {} before byte {} is not positive", in.name(),
             precision, in.offset());
  FullCoordinateLayout layout;
  for (auto& m : layout.minimum) m = in.get_int();
  for (auto& m : layout.maximum) m = in.get_int();
  for (int d = 0; d < 3; ++d)
    KILN_CHECK(layout.maximum[d] >= layout.minimum[d] && layout.maximum[d] - layout.minimum[d] < INT_MAX,
               "{}: coordinate range {}..{} before byte {} is empty or too wide", in.name(), layout.minimum[d],
               layout.maximum[d], in.offset());
  layout.derive();
  const std::int32_t start = in.get_int();
  KILN_CHECK(start >= kFirstIndex && start < kIndexCount, "{}: small-difference size index {} before byte {}",
             in.name(), start, in.offset());
  const std::int32_t length = in.get_int();
  KILN_CHECK(length >= 0 && static_cast<std::size_t>(length) <= in.remaining(),
             "{}: {} bytes of compressed coordinates announced at byte {}, {} left", in.name(), length, in.offset(),
             in.remaining());
  BitReader bits(in.get_opaque(static_cast<std::size_t>(length)), in);
  SmallSizes small(start);
  const float scale = 1.0f / precision;
  auto to_float = [&](const IntVec3& c) {
    return FloatVec3{static_cast<float>(c[0]) * scale, static_cast<float>(c[1]) * scale,
                     static_cast<float>(c[2]) * scale};
  };
  int run = 0;
  for (int i = 0; i < natoms;) {
    IntVec3 prev = layout.get(bits, in);
    int change = 0;
    if (bits.get(1) == 1) {
      const int code = static_cast<int>(bits.get(5));
      change = code % 3 - 1;
      run = code - code % 3;
    }
    KILN_CHECK(run <= 3 * kRunLimit && i + 1 + run / 3 <= natoms,
               "{}: a run of {} atoms after atom {} overruns the frame's {} atoms (before byte {})", in.name(), run / 3,
               i + 1, natoms, in.offset());
    if (run == 0) x[i++] = to_float(prev);
    for (int k = 0; k < run; k += 3) {
      const auto d = get_packed(bits, small.index, small.sizes(), in);
      const IntVec3 next = {prev[0] + d[0] - small.small, prev[1] + d[1] - small.small, prev[2] + d[2] - small.small};
      if (k == 0) {
        // The writer swapped the run's first atom with the one before it.
        x[i++] = to_float(next);
        x[i++] = to_float(prev);
      } else {
        x[i++] = to_float(next);
      }
      prev = next;
    }
    KILN_CHECK(small.index + change >= kFirstIndex && small.index + change < kIndexCount,
               "{}: the small-difference size leaves its table before byte {}", in.name(), in.offset());
    small.adapt(change);
  }
  return x;
}

}  // namespace kiln::md
