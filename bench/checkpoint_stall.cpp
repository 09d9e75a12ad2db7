// How long a checkpoint save blocks the training step, synchronous against --async-save, for a
// state of --gb gigabytes on the device (cuda:0 when there is one, else the CPU): one third
// "model" tensors, two thirds "optimizer" tensors (Adam's two moments), in 64 MiB tensors, written
// through the CheckpointStore into --dir. Also the cost of the rewind anomaly check per step (the
// squared norm of gradients the size of the model into a device ring, read once per 50 steps).
// JSON lines:
//   {"bench":"checkpoint_stall","mode":"sync",...,"stall_ms":...}
//   {"bench":"checkpoint_stall","mode":"async_reserve",...,"background_ms":...}
//   {"bench":"checkpoint_stall","mode":"async",...,"stall_ms":...,"write_ms":...,"ratio_to_sync":...}
//   {"bench":"checkpoint_stall","mode":"anomaly_check","ms_per_step":...}
// Usage: bench_checkpoint_stall [--gb 16] [--dir /tmp/kiln_checkpoint_stall] [--rounds 2]. The folder is
// removed at the end; it needs room for two checkpoints.
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>

#include "bench_util.h"
#include "kiln/ops/copy.h"
#include "kiln/ops/kernels.h"
#include "kiln/train/async_checkpoint_saver.h"
#include "kiln/train/checkpoint_store.h"

namespace {

using Clock = std::chrono::steady_clock;
double ms_since(Clock::time_point t) { return std::chrono::duration<double, std::milli>(Clock::now() - t).count(); }

}  // namespace

int main(int argc, char** argv) {
  using namespace kiln;
  const Device device = device_count(DeviceKind::CUDA) > 0 ? Device::cuda(0) : Device::cpu();
  double gb = device.is_cuda() ? 16 : 0.25;
  std::filesystem::path dir = std::filesystem::temp_directory_path() / "kiln_checkpoint_stall";
  int rounds = 2;  // async saves after the reservation
  for (int i = 1; i + 1 < argc; i += 2) {
    if (std::strcmp(argv[i], "--gb") == 0) gb = std::stod(argv[i + 1]);
    if (std::strcmp(argv[i], "--dir") == 0) dir = argv[i + 1];
    if (std::strcmp(argv[i], "--rounds") == 0) rounds = std::stoi(argv[i + 1]);
  }
  constexpr std::int64_t kPer = 16 << 20;  // floats: 64 MiB per tensor
  const auto tensors = std::max<std::int64_t>(3, static_cast<std::int64_t>(std::llround(gb * 1e9 / (kPer * 4.0))));
  TensorDict model, optimizer;
  std::vector<Tensor> grads;
  for (std::int64_t i = 0; i < tensors; ++i) {
    Tensor t = Tensor::randn({kPer}, static_cast<std::uint64_t>(i + 1), DType::F32, device);
    if (i % 3 == 0) {
      model.insert(fmt::format("model.w{}", i), t);
      grads.push_back(t);  // stands in for a gradient of the same size
    } else {
      optimizer.insert(fmt::format("optimizer.m{}", i), t);
    }
  }
  synchronize(device);
  const double bytes = static_cast<double>(tensors) * kPer * 4;
  train::CheckpointContent content;
  content.files = {{"model.safetensors", model}, {"optimizer.safetensors", optimizer}};
  content.metadata = {{"model", "bench"}};
  std::filesystem::remove_all(dir);
  train::CheckpointStore store(dir, {.keep_last = 1});
  nlohmann::json common{{"bench", "checkpoint_stall"}, {"device", device.str()}, {"gb", bytes / 1e9}};

  double sync_ms = 0;
  {
    train::AsyncCheckpointSaver saver(store, /*async=*/false);
    content.iteration = 1;
    sync_ms = saver.save(content).total() * 1e3;
    nlohmann::json j = common;
    j.update({{"mode", "sync"}, {"stall_ms", sync_ms}, {"gbps", bytes / sync_ms / 1e6}});
    bench::emit(j);
  }
  {
    train::AsyncCheckpointSaver saver(store, /*async=*/true);
    // As pretrain-gpt does after its first step: the host arena is allocated and page-locked in the
    // background while training runs, so no save pays for it (reported apart).
    auto t0 = Clock::now();
    saver.reserve(content);
    saver.wait();
    nlohmann::json r = common;
    r.update({{"mode", "async_reserve"}, {"background_ms", ms_since(t0)}});
    bench::emit(r);
    for (int round = 1; round <= rounds; ++round) {
      content.iteration = 1 + round;
      const train::SaveStall stall = saver.save(content);
      t0 = Clock::now();
      saver.wait();
      nlohmann::json j = common;
      j.update({{"mode", "async"},
                {"round", round},
                {"stall_ms", stall.total() * 1e3},
                {"copy_gbps", bytes / (stall.copy_seconds * 1e3) / 1e6},
                {"write_ms", saver.last_write_seconds() * 1e3},
                {"waited_after_ms", ms_since(t0)},
                {"ratio_to_sync", stall.total() * 1e3 / sync_ms}});
      bench::emit(j);
    }
  }
  {
    // What train-cifar10 --rewind adds per step: the squared gradient norm and two scalar copies into
    // the device ring, and one read of the ring per snapshot interval (50 steps by default).
    constexpr std::int64_t kInterval = 50;
    Tensor squares = Tensor::empty({}, DType::F32, device);
    Tensor loss = Tensor::scalar(2.5, DType::F32, device);
    Tensor loss_ring = Tensor::zeros({kInterval}, DType::F32, device);
    Tensor grad_ring = Tensor::zeros({kInterval}, DType::F32, device);
    auto interval = [&] {
      for (std::int64_t i = 0; i < kInterval; ++i) {
        KILN_KERNEL(device, sum_of_squares)(grads, squares);
        ops::copy_into(grad_ring.slice(0, i, i + 1), squares);
        ops::copy_into(loss_ring.slice(0, i, i + 1), loss);
      }
      volatile float l = loss_ring.to_vector<float>()[0], g = grad_ring.to_vector<float>()[0];
      (void)l, (void)g;
    };
    interval();
    const auto t0 = Clock::now();
    constexpr int kReps = 3;
    for (int i = 0; i < kReps; ++i) interval();
    nlohmann::json j = common;
    j.update({{"mode", "anomaly_check"},
              {"grad_gb", static_cast<double>(grads.size()) * kPer * 4 / 1e9},
              {"ms_per_step", ms_since(t0) / (kReps * kInterval)}});
    bench::emit(j);
  }
  std::filesystem::remove_all(dir);
  return 0;
}
