#pragma once
// GPU utilisation as nvidia-smi reports it, read through NVML. NVML is opened with dlopen at
// first use, so the library has no link-time dependency on the driver: on a machine without
// one (CI), utilisation() returns nullopt.
#include <optional>

namespace kiln {

// Percent of the last sample period in which a kernel ran on GPU `index`, or nullopt.
std::optional<int> gpu_utilisation(int index);

}  // namespace kiln
