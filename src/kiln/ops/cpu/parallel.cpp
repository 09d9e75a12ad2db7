#include "kiln/ops/cpu/parallel.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <thread>

namespace kiln::ops::cpu {

int num_threads() {
  static const int n = [] {
    int hw = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    if (const char* env = std::getenv("KILN_NUM_THREADS")) {
      int v = std::atoi(env);
      if (v > 0) return std::min(v, hw);
    }
    return hw;
  }();
  return n;
}

namespace {

thread_local bool in_pool_task = false;

class Pool {
 public:
  explicit Pool(int workers) {
    for (int i = 0; i < workers; ++i) threads_.emplace_back([this] { loop(); });
  }
  // Never destroyed (leaked on purpose): workers blocked at exit must not race static destructors.
  Pool(const Pool&) = delete;
  Pool& operator=(const Pool&) = delete;

  void run(std::int64_t chunks, const std::function<void(std::int64_t)>& fn) {
    std::unique_lock<std::mutex> busy(busy_, std::try_to_lock);
    if (!busy.owns_lock() || in_pool_task || threads_.empty()) {
      for (std::int64_t c = 0; c < chunks; ++c) fn(c);
      return;
    }
    {
      std::lock_guard<std::mutex> lock(mutex_);
      fn_ = &fn;
      chunks_ = chunks;
      next_.store(0);
      active_ = static_cast<int>(threads_.size());
      ++generation_;
    }
    wake_.notify_all();
    work();
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return active_ == 0; });
    fn_ = nullptr;
  }

 private:
  void work() {
    const bool was = in_pool_task;
    in_pool_task = true;
    for (std::int64_t c = next_.fetch_add(1); c < chunks_; c = next_.fetch_add(1)) (*fn_)(c);
    in_pool_task = was;
  }

  void loop() {
    std::uint64_t seen = 0;
    for (;;) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait(lock, [&] { return generation_ != seen; });
        seen = generation_;
      }
      work();
      std::lock_guard<std::mutex> lock(mutex_);
      if (--active_ == 0) done_.notify_one();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex busy_;  // one parallel region at a time
  std::mutex mutex_;
  std::condition_variable wake_, done_;
  const std::function<void(std::int64_t)>* fn_ = nullptr;
  std::int64_t chunks_ = 0;
  std::atomic<std::int64_t> next_{0};
  int active_ = 0;
  std::uint64_t generation_ = 0;
};

}  // namespace

void run_chunks(std::int64_t chunks, const std::function<void(std::int64_t)>& fn) {
  static Pool* pool = new Pool(num_threads() - 1);
  pool->run(chunks, fn);
}

}  // namespace kiln::ops::cpu
