#pragma once
// Shared helpers of the GPU benchmarks: timing with device events after warm-up, medians, and
// JSON-lines output ({"bench": ..., ...}); bench/torch_peers.py prints the same keys for PyTorch.
#include <algorithm>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "kiln/runtime/backend.h"
#include "kiln/runtime/event.h"

namespace kiln::bench {

// Median milliseconds of `reps` timed runs of fn (each run timed with a pair of events), after
// `warmup` untimed runs.
inline double time_ms(Device d, const std::function<void()>& fn, int warmup = 3, int reps = 10) {
  for (int i = 0; i < warmup; ++i) fn();
  synchronize(d);
  std::vector<double> ms;
  for (int i = 0; i < reps; ++i) {
    Event a(d), b(d);
    a.record();
    fn();
    b.record();
    ms.push_back(b.elapsed_ms(a));
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

inline void emit(const nlohmann::json& j) {
  std::printf("%s\n", j.dump().c_str());
  std::fflush(stdout);
}

inline bool have_cuda() {
  if (device_count(DeviceKind::CUDA) > 0) return true;
  emit({{"bench", "skipped"}, {"reason", "no CUDA device"}});
  return false;
}

}  // namespace kiln::bench
