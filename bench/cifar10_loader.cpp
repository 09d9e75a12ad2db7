// bench_cifar10_loader [DATA_DIR]: images/s of the CIFAR-10 host loader (uint8 NCHW -> normalised
// float32 NCHW batches in pinned memory), with and without random crop + flip, for several worker
// counts. DATA_DIR defaults to data/cifar10 (fetch it with `kiln data cifar10`).
#include <fmt/format.h>

#include <chrono>
#include <cstdio>
#include <exception>
#include <thread>

#include "kiln/vision/cifar10_dataset.h"
#include "kiln/vision/image_loader.h"

int main(int argc, char** argv) {
  using namespace kiln::vision;
  const char* data_dir = argc > 1 ? argv[1] : "data/cifar10";
  try {
    auto t0 = std::chrono::steady_clock::now();
    Cifar10Dataset train(data_dir, Cifar10Split::Train);
    double load_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fmt::print("read {} training images in {:.3f} s; {} hardware threads\n", train.size(), load_s,
               std::thread::hardware_concurrency());
    fmt::print("{:>8} {:>8} {:>10} {:>14}\n", "augment", "workers", "batch", "images/s");
    for (bool augment : {false, true}) {
      for (int workers : {0, 1, 2, 4}) {
        LoaderOptions options;
        options.batch_size = 128;
        options.num_workers = workers;
        options.augment = augment;
        ImageLoader loader(ImageSource::of(train), options);
        loader.start_epoch(0);  // warm-up: page in the pinned buffers
        while (loader.next()) {
        }
        const int epochs = 3;
        std::int64_t images = 0;
        double checksum = 0;
        auto start = std::chrono::steady_clock::now();
        for (int epoch = 1; epoch <= epochs; ++epoch) {
          loader.start_epoch(epoch);
          while (auto batch = loader.next()) {
            images += batch->size;
            checksum += batch->images[0];  // touch the result as a consumer would
          }
        }
        double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        fmt::print("{:>8} {:>8} {:>10} {:>14.0f}   (checksum {:.3f})\n", augment ? "yes" : "no", workers, 128,
                   images / seconds, checksum);
      }
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_cifar10_loader: %s\n", e.what());
    return 1;
  }
  return 0;
}
