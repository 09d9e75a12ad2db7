#include "kiln/data/gpt_dataset.h"

#include <fmt/format.h>
#include <unistd.h>

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <numeric>

#include "kiln/data/mapped_file.h"
#include "kiln/data/shuffle.h"
#include "kiln/runtime/error.h"

namespace kiln::data {

namespace fs = std::filesystem;

namespace {

// Version 2 adds the checksum of the arrays after them; version-1 files are rebuilt.
constexpr std::string_view kCacheMagic{"KILNGPT2", 8};

std::uint64_t fnv1a(std::string_view s) {
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (char c : s) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

// FNV-1a over 64-bit words: a checksum of the cached arrays (fast enough for hundreds of MB).
std::uint64_t checksum_of(std::span<const std::int64_t> words, std::uint64_t h = 0xcbf29ce484222325ull) {
  for (std::int64_t w : words) {
    h ^= static_cast<std::uint64_t>(w);
    h *= 0x100000001b3ull;
  }
  return h;
}

template <typename T>
void append_raw(std::string& out, const T* data, std::size_t count) {
  out.append(reinterpret_cast<const char*>(data), count * sizeof(T));
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// The numbers in --split as Megatron finds them (the regex [0-9]*\.?[0-9]+, leftmost and longest;
// whatever else separates them). Scanned by hand rather than with std::regex, whose libstdc++
// implementation is slow and trips GCC's -Wmaybe-uninitialized under -O2 with sanitizers.
std::vector<double> split_weights(std::string_view split) {
  std::vector<double> weights;
  std::size_t i = 0;
  while (i < split.size()) {
    std::size_t digits = i;
    while (digits < split.size() && is_digit(split[digits])) ++digits;
    std::size_t end = digits;
    if (digits + 1 < split.size() && split[digits] == '.' && is_digit(split[digits + 1])) {
      end = digits + 1;
      while (end < split.size() && is_digit(split[end])) ++end;
    }
    if (end == i) {
      ++i;
      continue;
    }
    double value = 0;
    auto [stop, ec] = std::from_chars(split.data() + i, split.data() + end, value);
    KILN_CHECK(ec == std::errc() && stop == split.data() + end, "--split '{}': weight '{}' is out of range", split,
               split.substr(i, end - i));
    weights.push_back(value);
    i = end;
  }
  return weights;
}

}  // namespace

std::array<SplitRange, 3> split_ranges(std::string_view split, std::int64_t sequences) {
  std::vector<double> weights = split_weights(split);
  KILN_CHECK(!weights.empty() && weights.size() <= 3, "--split '{}': give one to three weights, like 969,30,1", split);
  weights.resize(3, 0.0);
  double total = weights[0] + weights[1] + weights[2];
  KILN_CHECK(total > 0, "--split '{}': the weights sum to 0", split);
  std::array<std::int64_t, 4> bounds{0, 0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    // Python's round() rounds halves to even; so does nearbyint in the default rounding mode.
    bounds[i + 1] = bounds[i] + static_cast<std::int64_t>(std::nearbyint(weights[i] / total * sequences));
  }
  std::int64_t diff = bounds[3] - sequences;
  for (int i = 1; i < 4; ++i) bounds[i] -= diff;
  std::array<SplitRange, 3> out;
  for (int i = 0; i < 3; ++i) out[i] = {std::max<std::int64_t>(0, bounds[i]), std::max<std::int64_t>(0, bounds[i + 1])};
  return out;
}

GptDataset::GptDataset(std::shared_ptr<const IndexedDataset> data, SplitRange range, std::int64_t num_samples,
                       const GptDatasetConfig& config, std::string split_name)
    : data_(std::move(data)), range_(range), config_(config), split_name_(std::move(split_name)) {
  KILN_CHECK(data_ != nullptr, "GptDataset: no indexed dataset");
  KILN_CHECK(config_.sequence_length >= 1, "GptDataset {}: sequence length must be at least 1, not {}",
             data_->prefix().string(), config_.sequence_length);
  KILN_CHECK(range_.begin >= 0 && range_.begin <= range_.end && range_.end <= data_->sequence_count(),
             "GptDataset {}: split {} [{}, {}) is outside its {} sequences", data_->prefix().string(), split_name_,
             range_.begin, range_.end, data_->sequence_count());
  auto lengths = data_->sequence_lengths();
  for (std::int64_t s = range_.begin; s < range_.end; ++s) tokens_per_epoch_ += lengths[s];
  KILN_CHECK(tokens_per_epoch_ >= config_.sequence_length + 1,
             "GptDataset {}: split {} has {} tokens, fewer than one sample of {} + 1", data_->prefix().string(),
             split_name_, tokens_per_epoch_, config_.sequence_length);
  num_samples_ = num_samples > 0 ? num_samples : (tokens_per_epoch_ - 1) / config_.sequence_length;
  // As Megatron: enough epochs that (epochs * tokens - 1) / sequence_length covers the samples.
  epochs_ = 1;
  while ((epochs_ * tokens_per_epoch_ - 1) / config_.sequence_length < num_samples_) ++epochs_;

  std::error_code ec;
  auto idx_path = fs::path(data_->prefix().string() + ".idx");
  auto mtime = fs::last_write_time(idx_path, ec).time_since_epoch().count();
  std::string description = fmt::format(
      "{{\"class\": \"GptDataset\", \"version\": 1, \"path\": \"{}\", \"index_bytes\": {}, \"index_mtime\": {}, "
      "\"sequences\": {}, \"tokens\": {}, \"split\": \"{}\", \"range\": [{}, {}], \"sequence_length\": {}, "
      "\"seed\": {}, \"num_samples\": {}}}",
      fs::absolute(data_->prefix()).string(), data_->index_file_size(), mtime, data_->sequence_count(),
      data_->token_count(), split_name_, range_.begin, range_.end, config_.sequence_length, config_.seed, num_samples_);
  if (!config_.cache_dir.empty()) {
    cache_file_ = config_.cache_dir / fmt::format("{:016x}-gpt-{}.kidx", fnv1a(description), split_name_);
    if (load_cache(description)) {
      loaded_from_cache_ = true;
      return;
    }
  }
  build_indices();
  if (!config_.cache_dir.empty()) save_cache(description);
}

void GptDataset::build_indices() {
  std::mt19937_64 rng(config_.seed);
  std::int64_t docs = range_.end - range_.begin;
  document_index_.resize(static_cast<std::size_t>(docs * epochs_));
  for (std::int64_t e = 0; e < epochs_; ++e) {
    auto epoch = std::span(document_index_).subspan(e * docs, docs);
    std::iota(epoch.begin(), epoch.end(), range_.begin);
    seeded_shuffle(epoch, rng);
  }

  auto lengths = data_->sequence_lengths();
  sample_index_.resize(2 * static_cast<std::size_t>(num_samples_ + 1));
  std::int64_t position = 0, offset = 0;
  sample_index_[0] = 0;
  sample_index_[1] = 0;
  for (std::int64_t s = 1; s <= num_samples_; ++s) {
    std::int64_t remaining = config_.sequence_length + 1;
    while (remaining != 0) {
      KILN_CHECK(position < static_cast<std::int64_t>(document_index_.size()),
                 "GptDataset {}: ran out of documents building sample {}", data_->prefix().string(), s);
      std::int64_t available = lengths[document_index_[position]] - offset;
      remaining -= available;
      if (remaining <= 0) {
        // The sample ends inside this document; the next one starts on its last token.
        offset += remaining + available - 1;
        remaining = 0;
      } else {
        ++position;
        offset = 0;
      }
    }
    sample_index_[2 * s] = position;
    sample_index_[2 * s + 1] = offset;
  }

  shuffle_index_.resize(num_samples_);
  std::iota(shuffle_index_.begin(), shuffle_index_.end(), 0);
  std::mt19937_64 sample_rng(config_.seed + 1);
  seeded_shuffle(std::span(shuffle_index_), sample_rng);
}

void GptDataset::sample(std::int64_t index, std::vector<std::int32_t>& out) const {
  KILN_CHECK(index >= 0 && index < num_samples_, "GptDataset {} ({}): sample {} out of range (0..{})",
             data_->prefix().string(), split_name_, index, num_samples_);
  std::int64_t s = shuffle_index_[index];
  std::int64_t first = sample_index_[2 * s], first_offset = sample_index_[2 * s + 1];
  std::int64_t last = sample_index_[2 * s + 2], last_offset = sample_index_[2 * s + 3];
  out.resize(static_cast<std::size_t>(config_.sequence_length + 1));
  std::int32_t* dst = out.data();
  for (std::int64_t p = first; p <= last; ++p) {
    std::int64_t sequence = document_index_[p];
    std::int64_t begin = p == first ? first_offset : 0;
    std::int64_t end = p == last ? last_offset + 1 : data_->sequence_lengths()[sequence];
    KILN_CHECK(end - begin <= out.data() + out.size() - dst, "GptDataset {}: sample {} runs past its {} tokens",
               data_->prefix().string(), index, out.size());
    data_->read(sequence, begin, end - begin, dst);
    dst += end - begin;
  }
  KILN_CHECK(dst == out.data() + out.size(), "GptDataset {}: sample {} has {} tokens, not {}", data_->prefix().string(),
             index, dst - out.data(), out.size());
}

bool GptDataset::load_cache(const std::string& description) {
  if (!fs::exists(cache_file_)) return false;
  auto rebuild = [&](std::string why) {
    cache_rebuilt_because_ = std::move(why);
    document_index_.clear();
    sample_index_.clear();
    shuffle_index_.clear();
    fmt::print(stderr, "kiln: warning: GPT dataset index cache {} {}; rebuilding it\n", cache_file_.string(),
               cache_rebuilt_because_);
    return false;
  };
  MappedFile file(cache_file_);
  auto bytes = file.bytes();
  std::size_t pos = 0;
  auto take = [&](void* dst, std::size_t size) {
    if (bytes.size() - pos < size) return false;
    if (size > 0) std::memcpy(dst, bytes.data() + pos, size);
    pos += size;
    return true;
  };
  char magic[8];
  std::uint64_t description_size = 0;
  if (!take(magic, 8) || std::memcmp(magic, kCacheMagic.data(), 8) != 0) {
    return rebuild("is not a cache of this Kiln version (its magic is not KILNGPT2)");
  }
  if (!take(&description_size, 8) || description_size != description.size() || bytes.size() - pos < description_size ||
      std::memcmp(bytes.data() + pos, description.data(), description_size) != 0) {
    return rebuild("describes another dataset, split or configuration");
  }
  pos += description_size;
  std::int64_t counts[3];
  if (!take(counts, sizeof(counts))) return rebuild("is truncated");
  if (counts[1] != 2 * (num_samples_ + 1) || counts[2] != num_samples_ ||
      counts[0] != (range_.end - range_.begin) * epochs_) {
    return rebuild("has array sizes that do not match its description (damaged)");
  }
  std::vector<std::int64_t>* arrays[3] = {&document_index_, &sample_index_, &shuffle_index_};
  std::uint64_t expected = 0;
  if (bytes.size() - pos != (static_cast<std::size_t>(counts[0] + counts[1] + counts[2]) + 1) * sizeof(std::int64_t)) {
    return rebuild(fmt::format("has {} bytes, not the size its arrays need (truncated or damaged)", bytes.size()));
  }
  for (int a = 0; a < 3; ++a) {
    arrays[a]->resize(static_cast<std::size_t>(counts[a]));
    take(arrays[a]->data(), static_cast<std::size_t>(counts[a]) * sizeof(std::int64_t));
  }
  take(&expected, sizeof(expected));
  std::uint64_t actual = checksum_of(document_index_);
  actual = checksum_of(sample_index_, actual);
  actual = checksum_of(shuffle_index_, actual);
  if (actual != expected) {
    return rebuild(
        fmt::format("fails its checksum ({:016x}, the file says {:016x}): its bytes are damaged", actual, expected));
  }
  // A checksum is only as good as the writer; the bounds are what keep sample() inside the data.
  if (std::string why = check_indices(); !why.empty()) return rebuild("is inconsistent with the dataset: " + why);
  return true;
}

std::string GptDataset::check_indices() const {
  auto lengths = data_->sequence_lengths();
  for (std::size_t i = 0; i < document_index_.size(); ++i) {
    std::int64_t d = document_index_[i];
    if (d < range_.begin || d >= range_.end) {
      return fmt::format("document_index[{}] = {} is outside the split's sequences [{}, {})", i, d, range_.begin,
                         range_.end);
    }
  }
  const auto positions = static_cast<std::int64_t>(document_index_.size());
  // Tokens before each document position, so that a sample's token count is two lookups.
  std::vector<std::int64_t> before(document_index_.size() + 1, 0);
  for (std::size_t p = 0; p < document_index_.size(); ++p) before[p + 1] = before[p] + lengths[document_index_[p]];
  std::int64_t previous_position = 0, previous_offset = 0;
  for (std::int64_t s = 0; s <= num_samples_; ++s) {
    std::int64_t position = sample_index_[2 * s], offset = sample_index_[2 * s + 1];
    if (position < 0 || position >= positions) {
      return fmt::format("sample boundary {} is at document position {}, outside 0..{}", s, position, positions - 1);
    }
    std::int64_t length = lengths[document_index_[position]];
    if (offset < 0 || (offset >= length && !(offset == 0 && length == 0))) {
      return fmt::format("sample boundary {} is at token {} of a sequence of {} tokens", s, offset, length);
    }
    if (position < previous_position || (position == previous_position && offset < previous_offset)) {
      return fmt::format("sample boundary {} ({}, {}) comes before the one before it", s, position, offset);
    }
    if (s > 0) {
      // Consecutive samples share one token: sample s-1 runs from the previous boundary to this one, inclusive.
      std::int64_t tokens = before[position] + offset + 1 - (before[previous_position] + previous_offset);
      if (tokens != config_.sequence_length + 1) {
        return fmt::format("sample {} spans {} tokens, not {} + 1", s - 1, tokens, config_.sequence_length);
      }
    }
    previous_position = position;
    previous_offset = offset;
  }
  std::vector<bool> seen(static_cast<std::size_t>(num_samples_), false);
  for (std::size_t i = 0; i < shuffle_index_.size(); ++i) {
    std::int64_t s = shuffle_index_[i];
    if (s < 0 || s >= num_samples_ || seen[static_cast<std::size_t>(s)]) {
      return fmt::format("shuffle_index[{}] = {} is out of range or repeated (not a permutation of 0..{})", i, s,
                         num_samples_ - 1);
    }
    seen[static_cast<std::size_t>(s)] = true;
  }
  return {};
}

void GptDataset::save_cache(const std::string& description) const {
  fs::create_directories(config_.cache_dir);
  std::string out(kCacheMagic);
  std::uint64_t description_size = description.size();
  append_raw(out, &description_size, 1);
  out += description;
  std::int64_t counts[3] = {static_cast<std::int64_t>(document_index_.size()),
                            static_cast<std::int64_t>(sample_index_.size()),
                            static_cast<std::int64_t>(shuffle_index_.size())};
  append_raw(out, counts, 3);
  append_raw(out, document_index_.data(), document_index_.size());
  append_raw(out, sample_index_.data(), sample_index_.size());
  append_raw(out, shuffle_index_.data(), shuffle_index_.size());
  std::uint64_t checksum = checksum_of(document_index_);
  checksum = checksum_of(sample_index_, checksum);
  checksum = checksum_of(shuffle_index_, checksum);
  append_raw(out, &checksum, 1);
  // Several ranks may build the same cache at once: each writes its own temporary file and the
  // rename makes one of them the cache, whole.
  fs::path tmp = cache_file_.string() + fmt::format(".tmp.{}", ::getpid());
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  KILN_CHECK(f != nullptr, "cannot create {}: {}", tmp.string(), std::strerror(errno));
  bool ok = std::fwrite(out.data(), 1, out.size(), f) == out.size();
  ok = (std::fclose(f) == 0) && ok;
  if (!ok) {
    std::error_code ignored;
    fs::remove(tmp, ignored);
    KILN_FAIL("cannot write {}: {}", tmp.string(), std::strerror(errno));
  }
  fs::rename(tmp, cache_file_);
}

}  // namespace kiln::data
