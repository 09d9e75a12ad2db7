#pragma once
// SystemSpec: the machine a training layout is simulated on (GPUs per node, nodes, per-GPU peak
// FLOP/s by precision, memory size and bandwidth, intra- and inter-node links). Built-in entries
// for common GPUs and "cpu" (this machine), or a small JSON file (docs/simulate.md shows the keys).
#include <filesystem>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::sim {

enum class Precision { FP32, BF16, FP8 };
std::string_view to_string(Precision p);

struct SystemSpec {
  std::string name;
  int gpus_per_node = 8;
  int nodes = 1;
  // Dense peak FLOP/s of one device; 0 where the device has no such unit (FP8 before Hopper).
  double peak_flops_fp32 = 0, peak_flops_bf16 = 0, peak_flops_fp8 = 0;
  double memory_bytes = 0;      // HBM (or host RAM for "cpu")
  double memory_bandwidth = 0;  // bytes/s
  // One direction, per device: what a ring step can move (bytes/s), and one hop's latency (s).
  double intra_node_bandwidth = 0, intra_node_latency = 0;
  double inter_node_bandwidth = 0, inter_node_latency = 0;
  // Without a calibration table, GEMMs run at this fraction of the peak (the built-in GPUs: what
  // cuBLAS reaches on large bf16 GEMMs, about 0.7; 1 is the plain roofline). Attention at half of it.
  double achievable_gemm_fraction = 1.0;

  int total_devices() const { return gpus_per_node * nodes; }
  double peak_flops(Precision p) const;
  // Throws kiln::Error naming the key of the first missing or impossible value.
  void validate() const;
};

// "h200", "h100-sxm", "a100-80gb", "b200", "cpu" (this machine's cores and memory).
SystemSpec builtin_system(std::string_view name);
std::vector<std::string> builtin_system_names();
// A built-in name, or a JSON file: {"name": ..., "gpus_per_node": 8, "peak_flops": {"bf16": ...}, ...}.
SystemSpec load_system(const std::string& name_or_path);
std::string system_json(const SystemSpec& s);

}  // namespace kiln::sim
