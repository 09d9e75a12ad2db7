#pragma once
// ImageLoader: turns a uint8 NCHW image set into float32 NCHW batches in pinned host memory,
// ready for a host-to-device copy. N worker threads transform batches ahead of the training loop
// into a ring of `prefetch_batches` buffers; batches come out in order, shuffled per epoch with
// a seed, augmented per sample as a pure function of (seed, epoch, sample index), so the result
// does not depend on the number of threads. Holds no tensor type on purpose.
//
//   ImageLoader loader(ImageSource::of(train_set), {.batch_size = 128, .augment = true});
//   for (int epoch = 0; epoch < epochs; ++epoch) {
//     loader.start_epoch(epoch);
//     while (auto batch = loader.next()) { /* batch->images: size x 3 x 32 x 32 floats */ }
//   }
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <mutex>
#include <optional>
#include <thread>
#include <vector>

#include "kiln/runtime/pinned_memory.h"
#include "kiln/vision/image_transforms.h"

namespace kiln::vision {

class Cifar10Dataset;

// A read-only view of an image set; it must outlive the loader.
struct ImageSource {
  const std::uint8_t* images = nullptr;  // count x channels x height x width bytes
  const std::uint8_t* labels = nullptr;  // count class numbers
  std::int64_t count = 0;
  int channels = 0;
  int height = 0;
  int width = 0;

  static ImageSource of(const Cifar10Dataset& dataset);
};

struct LoaderOptions {
  int batch_size = 128;
  bool shuffle = true;     // a new order each epoch, from (seed, epoch)
  bool drop_last = false;  // leave out the last batch when it is smaller than batch_size
  std::uint64_t seed = 0;
  int num_workers = 4;       // 0: batches are made on the calling thread inside next()
  int prefetch_batches = 8;  // ready (or in-progress) batches held ahead of the consumer
  bool augment = false;      // random crop + flip (AugmentOptions); for training only
  // Data parallelism: this process reads shard `shard_index` of `num_shards` (its rank and the
  // world size); all shards use one order per epoch, so together they cover the set once.
  int shard_index = 0;
  int num_shards = 1;
  AugmentOptions augment_options;
  Normalization normalization = Normalization::half();
};

// One batch, valid until the next call of next() or start_epoch() (copy it to the device, or
// synchronise an asynchronous copy, before asking for the next one).
struct HostBatch {
  const float* images = nullptr;         // size x channels x height x width, float32, pinned memory
  const std::int64_t* labels = nullptr;  // size class numbers
  int size = 0;
  std::int64_t index = 0;  // the batch's number within the epoch
  std::int64_t epoch = 0;
};

class ImageLoader {
 public:
  ImageLoader(ImageSource source, LoaderOptions options);
  ~ImageLoader();
  ImageLoader(const ImageLoader&) = delete;
  ImageLoader& operator=(const ImageLoader&) = delete;

  // Begins (or restarts) an epoch: fixes its order and lets the workers fill batches.
  void start_epoch(std::int64_t epoch);
  // The next batch of the epoch, waiting for a worker if needed; nullopt when the epoch is done.
  // Rethrows an error a worker ran into.
  std::optional<HostBatch> next();

  std::int64_t batches_per_epoch() const { return num_batches_; }
  std::int64_t samples_per_epoch() const;
  const LoaderOptions& options() const { return options_; }
  // The dataset indices of epoch `epoch` (this shard's) in the order the loader visits them.
  std::vector<std::int64_t> epoch_order(std::int64_t epoch) const;

 private:
  struct Slot {
    PinnedBuffer images;
    PinnedBuffer labels;
    std::int64_t batch = -1;
    bool ready = false;
  };

  void worker_loop();
  void fill(Slot& slot, std::int64_t batch) const;
  bool can_claim_locked() const;
  Slot& slot_for(std::int64_t batch) { return slots_[static_cast<std::size_t>(batch) % slots_.size()]; }

  ImageSource source_;
  LoaderOptions options_;
  std::int64_t shard_size_ = 0;  // images per epoch in this shard (before drop_last)
  std::int64_t num_batches_ = 0;
  std::int64_t image_floats_ = 0;
  std::vector<Slot> slots_;
  std::vector<std::thread> workers_;

  std::mutex mutex_;
  std::condition_variable work_available_;  // workers wait here
  std::condition_variable state_changed_;   // next() and start_epoch() wait here
  bool stop_ = false;
  bool started_ = false;
  std::uint64_t generation_ = 0;  // bumped by start_epoch(); stale batches are dropped
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> order_;
  std::int64_t next_claim_ = 0;    // the next batch a worker will make
  std::int64_t next_deliver_ = 0;  // the next batch next() will return
  std::int64_t held_ = -1;         // the batch the caller holds (its slot is not reused yet)
  int in_flight_ = 0;              // batches being made right now
  std::exception_ptr error_;
};

}  // namespace kiln::vision
