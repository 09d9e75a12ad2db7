#pragma once
// What one HPCG run is asked to do (the box, the time, the kernels, the device), and the reader of
// the reference's hpcg.dat that fills it in.
#include <array>
#include <optional>
#include <string>

#include "kiln/runtime/device.h"

namespace kiln::hpcg {

struct HpcgParams {
  int nx = 16, ny = 16, nz = 16;  // local box
  double run_seconds = 60.0;      // the timed phase (official runs: at least 1800)
  std::optional<std::array<int, 3>> process_grid;
  std::string kernels = "optimized";  // or "ref"
  Device device = Device::cpu();
  std::string report_dir = ".";
  unsigned seed = 12345;
  // Memory bandwidth to rate against (bytes/s), from a copy measured in the same run; 0: not known.
  double copy_bandwidth = 0.0;
  std::string copy_bandwidth_source;
};

// Reads the reference's hpcg.dat: two header lines, "nx ny nz", then the run time in seconds.
HpcgParams read_hpcg_dat(const std::string& path, HpcgParams defaults = {});

// The longest --rt accepted: a year (the timed phase's set count must fit an int).
inline constexpr double kMaxRunSeconds = 365.0 * 24 * 3600;

}  // namespace kiln::hpcg
