#include "kiln/vision/image_loader.h"

#include <algorithm>
#include <numeric>

#include "kiln/runtime/error.h"
#include "kiln/vision/cifar10_dataset.h"
#include "kiln/vision/cifar10_format.h"
#include "kiln/vision/seeded_random.h"

namespace kiln::vision {

ImageSource ImageSource::of(const Cifar10Dataset& dataset) {
  return {dataset.images().data(), dataset.labels().data(), dataset.size(),
          cifar10::kChannels,      cifar10::kImageSide,     cifar10::kImageSide};
}

ImageLoader::ImageLoader(ImageSource source, LoaderOptions options) : source_(source), options_(std::move(options)) {
  KILN_CHECK(source_.images && source_.labels && source_.count > 0, "ImageLoader: the image set is empty");
  KILN_CHECK(source_.channels > 0 && source_.height > 0 && source_.width > 0, "ImageLoader: image shape {}x{}x{}",
             source_.channels, source_.height, source_.width);
  KILN_CHECK(options_.batch_size > 0, "ImageLoader: batch_size must be positive, got {}", options_.batch_size);
  KILN_CHECK(options_.num_workers >= 0, "ImageLoader: num_workers must be >= 0, got {}", options_.num_workers);
  KILN_CHECK(options_.prefetch_batches >= 1, "ImageLoader: prefetch_batches must be >= 1, got {}",
             options_.prefetch_batches);
  KILN_CHECK(options_.augment_options.padding >= 0 && options_.augment_options.padding < source_.height &&
                 options_.augment_options.padding < source_.width,
             "ImageLoader: crop padding {} does not fit {}x{} images", options_.augment_options.padding, source_.height,
             source_.width);
  KILN_CHECK(options_.normalization.mean.size() == std::size_t(source_.channels) &&
                 options_.normalization.std.size() == std::size_t(source_.channels),
             "ImageLoader: normalization has {} means and {} stds for {}-channel images",
             options_.normalization.mean.size(), options_.normalization.std.size(), source_.channels);
  for (float s : options_.normalization.std) KILN_CHECK(s > 0, "ImageLoader: normalization std {} must be > 0", s);
  KILN_CHECK(options_.num_shards >= 1 && options_.shard_index >= 0 && options_.shard_index < options_.num_shards,
             "ImageLoader: shard {} of {} does not exist", options_.shard_index, options_.num_shards);
  // Every shard gets ceil(count / num_shards) images, as PyTorch's DistributedSampler does.
  shard_size_ = (source_.count + options_.num_shards - 1) / options_.num_shards;
  num_batches_ = options_.drop_last ? shard_size_ / options_.batch_size
                                    : (shard_size_ + options_.batch_size - 1) / options_.batch_size;
  KILN_CHECK(num_batches_ > 0, "ImageLoader: {} images make no batch of {} with drop_last", shard_size_,
             options_.batch_size);

  image_floats_ = std::int64_t(source_.channels) * source_.height * source_.width;
  // One slot more than the workers can fill at once, so a worker can run while the caller holds one.
  const int slots = std::max(options_.prefetch_batches, options_.num_workers + 1);
  slots_.resize(static_cast<std::size_t>(slots));
  for (auto& slot : slots_) {
    slot.images = allocate_pinned(std::size_t(options_.batch_size) * image_floats_ * sizeof(float));
    slot.labels = allocate_pinned(std::size_t(options_.batch_size) * sizeof(std::int64_t));
  }
  for (int i = 0; i < options_.num_workers; ++i) workers_.emplace_back([this] { worker_loop(); });
}

ImageLoader::~ImageLoader() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_available_.notify_all();
  for (auto& worker : workers_) worker.join();
}

std::int64_t ImageLoader::samples_per_epoch() const {
  return options_.drop_last ? num_batches_ * options_.batch_size : shard_size_;
}

std::vector<std::int64_t> ImageLoader::epoch_order(std::int64_t epoch) const {
  std::vector<std::int64_t> order;
  if (options_.shuffle) {
    order = shuffled_indices(source_.count, options_.seed, epoch);
  } else {
    order.resize(static_cast<std::size_t>(source_.count));
    std::iota(order.begin(), order.end(), std::int64_t{0});
  }
  if (options_.num_shards == 1) return order;
  // All shards share the epoch's order (same seed); shard r takes positions r, r + S, r + 2S, ...
  // of the order padded (by wrapping to its start) to a multiple of S images.
  std::vector<std::int64_t> shard;
  shard.reserve(static_cast<std::size_t>(shard_size_));
  for (std::int64_t i = 0; i < shard_size_; ++i) {
    const std::int64_t position = (i * options_.num_shards + options_.shard_index) % source_.count;
    shard.push_back(order[static_cast<std::size_t>(position)]);
  }
  return shard;
}

void ImageLoader::start_epoch(std::int64_t epoch) {
  std::vector<std::int64_t> order = epoch_order(epoch);
  std::unique_lock lock(mutex_);
  ++generation_;
  // Batches of the old epoch still being made write into slots; wait for them before reusing any.
  state_changed_.wait(lock, [this] { return in_flight_ == 0; });
  order_ = std::move(order);
  epoch_ = epoch;
  for (auto& slot : slots_) {
    slot.ready = false;
    slot.batch = -1;
  }
  next_claim_ = 0;
  next_deliver_ = 0;
  held_ = -1;
  error_ = nullptr;
  started_ = true;
  lock.unlock();
  work_available_.notify_all();
}

bool ImageLoader::can_claim_locked() const {
  const std::int64_t first_unreleased = held_ >= 0 ? held_ : next_deliver_;
  return started_ && !error_ && next_claim_ < num_batches_ &&
         next_claim_ < first_unreleased + std::int64_t(slots_.size());
}

void ImageLoader::worker_loop() {
  std::unique_lock lock(mutex_);
  for (;;) {
    work_available_.wait(lock, [this] { return stop_ || can_claim_locked(); });
    if (stop_) return;
    const std::int64_t batch = next_claim_++;
    const std::uint64_t generation = generation_;
    Slot& slot = slot_for(batch);
    ++in_flight_;
    lock.unlock();
    std::exception_ptr error;
    try {
      fill(slot, batch);
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    --in_flight_;
    if (generation == generation_) {
      if (error) {
        error_ = error;
      } else {
        slot.batch = batch;
        slot.ready = true;
      }
    }
    state_changed_.notify_all();
  }
}

// Reads order_ and epoch_ without the lock: start_epoch() changes them only while no batch is in flight.
void ImageLoader::fill(Slot& slot, std::int64_t batch) const {
  const std::int64_t begin = batch * options_.batch_size;
  const std::int64_t end = std::min(begin + options_.batch_size, shard_size_);
  auto* images = static_cast<float*>(slot.images.get());
  auto* labels = static_cast<std::int64_t*>(slot.labels.get());
  const std::int64_t image_bytes = image_floats_;  // one byte per value in the source
  for (std::int64_t i = begin; i < end; ++i) {
    const std::int64_t index = order_[static_cast<std::size_t>(i)];
    const AugmentChoice choice = options_.augment
                                     ? choose_augmentation(options_.seed, epoch_, index, options_.augment_options)
                                     : AugmentChoice{};
    transform_image(source_.images + index * image_bytes, source_.channels, source_.height, source_.width, choice,
                    options_.normalization, images + (i - begin) * image_floats_);
    labels[i - begin] = source_.labels[index];
  }
}

std::optional<HostBatch> ImageLoader::next() {
  std::unique_lock lock(mutex_);
  KILN_CHECK(started_, "ImageLoader::next(): call start_epoch(epoch) first");
  if (held_ >= 0) {
    slot_for(held_).ready = false;
    held_ = -1;
    work_available_.notify_all();
  }
  if (next_deliver_ >= num_batches_) return std::nullopt;
  const std::int64_t batch = next_deliver_;
  Slot& slot = slot_for(batch);
  if (workers_.empty()) {
    ++next_claim_;
    fill(slot, batch);
  } else {
    state_changed_.wait(lock, [&] { return error_ || (slot.ready && slot.batch == batch); });
    if (error_) std::rethrow_exception(error_);
  }
  ++next_deliver_;
  held_ = batch;
  const std::int64_t begin = batch * options_.batch_size;
  HostBatch out;
  out.images = static_cast<const float*>(slot.images.get());
  out.labels = static_cast<const std::int64_t*>(slot.labels.get());
  out.size = static_cast<int>(std::min<std::int64_t>(options_.batch_size, shard_size_ - begin));
  out.index = batch;
  out.epoch = epoch_;
  return out;
}

}  // namespace kiln::vision
