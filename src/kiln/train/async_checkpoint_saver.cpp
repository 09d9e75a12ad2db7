#include "kiln/train/async_checkpoint_saver.h"

#include <fmt/format.h>

#include <chrono>
#include <cstring>

#include "kiln/ops/copy.h"
#include "kiln/runtime/backend.h"
#include "kiln/runtime/elapsed.h"

namespace kiln::train {

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::size_t kAlign = 256;
std::size_t aligned(std::size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::size_t arena_bytes_for(const CheckpointContent& live) {
  std::size_t need = 0;
  for (const auto& [name, tensors] : live.files)
    for (const auto& [key, t] : tensors) need += aligned(t.nbytes());
  return need;
}

}  // namespace

CheckpointContent copy_to_host_arena(const CheckpointContent& live, PinnedBuffer& arena, std::size_t& arena_bytes) {
  const std::size_t need = arena_bytes_for(live);
  if (need > arena_bytes || !arena) {
    arena.reset();
    arena = allocate_pinned(std::max<std::size_t>(need, kAlign));
    arena_bytes = std::max<std::size_t>(need, kAlign);
  }
  CheckpointContent out;
  out.iteration = live.iteration;
  out.metadata = live.metadata;
  out.text_files = live.text_files;
  char* base = static_cast<char*>(arena.get());
  std::size_t offset = 0;
  std::vector<Device> devices;
  for (const auto& [name, tensors] : live.files) {
    TensorDict host;
    for (const auto& [key, t] : tensors) {
      Tensor view = Tensor::from_blob(base + offset, t.shape(), t.dtype(), Device::cpu());
      if (!t.device().is_cpu() && t.is_contiguous()) {
        // Straight from device memory into the arena (copy_into would stage a packed device copy).
        backend_for(t.device()).copy_to_host(view.data_ptr(), t.data_ptr(), t.nbytes(), t.device().index);
      } else {
        ops::copy_into(view, t.detach());
      }
      if (!t.device().is_cpu()) devices.push_back(t.device());
      offset += aligned(t.nbytes());
      host.insert(key, view);
    }
    out.files.emplace_back(name, std::move(host));
  }
  for (const Device& d : devices) synchronize(d);  // the copies are complete before the writer reads them
  return out;
}

AsyncCheckpointSaver::AsyncCheckpointSaver(CheckpointStore& store, bool async) : store_(store), async_(async) {}

AsyncCheckpointSaver::~AsyncCheckpointSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    fmt::print(stderr, "error: {}\n", e.what());
  }
}

void AsyncCheckpointSaver::join_and_rethrow() {
  if (worker_.joinable()) worker_.join();
  if (error_) {
    std::exception_ptr e = std::exchange(error_, nullptr);
    const std::int64_t it = in_flight_iteration_;
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      if (it < 0) KILN_FAIL("allocating the host memory for --async-save failed: {}", x.what());
      KILN_FAIL("the background save of iteration {} failed: {}", it, x.what());
    }
  }
}

void AsyncCheckpointSaver::check() {
  if (finished_.load(std::memory_order_acquire) && (worker_.joinable() || error_)) join_and_rethrow();
}

void AsyncCheckpointSaver::wait() { join_and_rethrow(); }

SaveStall AsyncCheckpointSaver::save(const CheckpointContent& live) {
  SaveStall stall;
  for (const auto& [name, tensors] : live.files)
    for (const auto& [key, t] : tensors) stall.bytes += t.nbytes();
  auto t0 = Clock::now();
  join_and_rethrow();
  stall.wait_seconds = seconds_since(t0);
  if (!async_) {
    t0 = Clock::now();
    store_.save(live);
    stall.write_seconds = seconds_since(t0);
    last_write_seconds_ = stall.write_seconds;
    return stall;
  }
  t0 = Clock::now();
  snapshot_ = copy_to_host_arena(live, arena_, arena_bytes_);
  stall.copy_seconds = seconds_since(t0);
  in_flight_iteration_ = live.iteration;
  finished_.store(false, std::memory_order_release);
  worker_ = std::thread([this] {
    const auto start = Clock::now();
    try {
      store_.save(snapshot_);
    } catch (...) {
      error_ = std::current_exception();
    }
    last_write_seconds_ = seconds_since(start);
    finished_.store(true, std::memory_order_release);
  });
  return stall;
}

void AsyncCheckpointSaver::reserve(const CheckpointContent& like) {
  if (!async_) return;
  join_and_rethrow();
  const std::size_t need = arena_bytes_for(like);
  if (arena_ && need <= arena_bytes_) return;
  in_flight_iteration_ = -1;
  finished_.store(false, std::memory_order_release);
  worker_ = std::thread([this, need] {
    try {
      arena_.reset();
      arena_bytes_ = 0;
      arena_ = allocate_pinned(std::max<std::size_t>(need, kAlign));
      arena_bytes_ = std::max<std::size_t>(need, kAlign);
      // Fault the pages in here, not in the first save's copy (unpinned memory is mapped lazily).
      std::memset(arena_.get(), 0, arena_bytes_);
    } catch (...) {
      error_ = std::current_exception();
    }
    finished_.store(true, std::memory_order_release);
  });
}

}  // namespace kiln::train
