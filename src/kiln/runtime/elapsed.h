#pragma once
// Wall-clock seconds since a steady_clock instant: what the trainers' logs, the checkpoint saver
// and the HPCG timer measure. One definition, so unity builds never see two.
#include <chrono>

namespace kiln {

inline double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace kiln
