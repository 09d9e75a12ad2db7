#include "kiln/sim/system_spec.h"

#include <unistd.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "kiln/runtime/error.h"

namespace kiln::sim {

using json = nlohmann::json;

std::string_view to_string(Precision p) {
  switch (p) {
    case Precision::FP32: return "fp32";
    case Precision::BF16: return "bf16";
    case Precision::FP8: return "fp8";
  }
  return "?";
}

double SystemSpec::peak_flops(Precision p) const {
  switch (p) {
    case Precision::FP32: return peak_flops_fp32;
    case Precision::BF16: return peak_flops_bf16;
    case Precision::FP8: return peak_flops_fp8;
  }
  return 0;
}

void SystemSpec::validate() const {
  KILN_CHECK(gpus_per_node >= 1 && nodes >= 1, "system {}: gpus_per_node and nodes must be at least 1 (got {} and {})",
             name, gpus_per_node, nodes);
  KILN_CHECK(peak_flops_fp32 > 0 || peak_flops_bf16 > 0, "system {}: peak_flops needs fp32 or bf16 above 0", name);
  KILN_CHECK(memory_bytes > 0 && memory_bandwidth > 0, "system {}: memory_bytes and memory_bandwidth must be above 0",
             name);
  KILN_CHECK(intra_node_bandwidth > 0 && inter_node_bandwidth > 0,
             "system {}: intra_node_bandwidth and inter_node_bandwidth must be above 0", name);
  KILN_CHECK(intra_node_latency >= 0 && inter_node_latency >= 0, "system {}: latencies cannot be negative", name);
  KILN_CHECK(achievable_gemm_fraction > 0 && achievable_gemm_fraction <= 1,
             "system {}: achievable_gemm_fraction must be in (0, 1], got {}", name, achievable_gemm_fraction);
}

namespace {

// Vendor datasheet figures (dense, no sparsity). Link bandwidths are one direction per GPU:
// NVLink 4 is 900 GB/s both ways (450 each), NVLink 5 1.8 TB/s; one 400 Gb/s NIC per GPU is 50 GB/s.
SystemSpec nvidia(std::string name, double fp32, double bf16, double fp8, double mem_gb, double bw_tbs,
                  double nvlink_gbs, double nic_gbs) {
  SystemSpec s;
  s.name = std::move(name);
  s.peak_flops_fp32 = fp32;
  s.peak_flops_bf16 = bf16;
  s.peak_flops_fp8 = fp8;
  s.memory_bytes = mem_gb * 1e9;
  s.memory_bandwidth = bw_tbs * 1e12;
  s.intra_node_bandwidth = nvlink_gbs * 1e9;
  s.intra_node_latency = 3e-6;
  s.inter_node_bandwidth = nic_gbs * 1e9;
  s.inter_node_latency = 10e-6;
  s.achievable_gemm_fraction = 0.7;
  return s;
}

SystemSpec this_cpu() {
  SystemSpec s;
  s.name = "cpu";
  s.gpus_per_node = 1;
  const double cores = std::max(1u, std::thread::hardware_concurrency());
  // AVX2: two 8-wide fp32 FMAs per cycle at ~3 GHz; --calibrate replaces this with what runs.
  s.peak_flops_fp32 = cores * 3e9 * 32;
  s.peak_flops_bf16 = s.peak_flops_fp32;  // no bf16 units: converted and computed in fp32
  s.memory_bytes = static_cast<double>(sysconf(_SC_PHYS_PAGES)) * static_cast<double>(sysconf(_SC_PAGE_SIZE));
  s.memory_bandwidth = 20e9;
  s.intra_node_bandwidth = 10e9;  // ranks on one host exchange through shared memory
  s.intra_node_latency = 5e-6;
  s.inter_node_bandwidth = 1.25e9;  // 10 GbE
  s.inter_node_latency = 50e-6;
  return s;
}

}  // namespace

std::vector<std::string> builtin_system_names() { return {"h200", "h100-sxm", "a100-80gb", "b200", "cpu"}; }

SystemSpec builtin_system(std::string_view name) {
  if (name == "h200") return nvidia("h200", 67e12, 989e12, 1979e12, 141, 4.8, 450, 50);
  if (name == "h100-sxm") return nvidia("h100-sxm", 67e12, 989e12, 1979e12, 80, 3.35, 450, 50);
  if (name == "a100-80gb") return nvidia("a100-80gb", 19.5e12, 312e12, 0, 80, 2.039, 300, 25);
  if (name == "b200") return nvidia("b200", 80e12, 2250e12, 4500e12, 180, 8.0, 900, 50);
  if (name == "cpu") return this_cpu();
  std::string known;
  for (const auto& n : builtin_system_names()) known += (known.empty() ? "" : ", ") + n;
  KILN_FAIL("--system: no built-in system '{}' (built in: {}; or give a JSON file)", name, known);
}

SystemSpec load_system(const std::string& name_or_path) {
  if (!std::filesystem::exists(name_or_path)) return builtin_system(name_or_path);
  std::ifstream in(name_or_path);
  KILN_CHECK(in.good(), "--system: cannot read {}", name_or_path);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    KILN_FAIL("--system: {} is not valid JSON: {}", name_or_path, e.what());
  }
  // A file may start from a built-in entry ("base": "h200") and override some keys.
  SystemSpec s = j.contains("base") ? builtin_system(j["base"].get<std::string>()) : SystemSpec{};
  try {
    s.name = j.value("name", s.name.empty() ? name_or_path : s.name);
    s.gpus_per_node = j.value("gpus_per_node", s.gpus_per_node);
    s.nodes = j.value("nodes", s.nodes);
    if (j.contains("peak_flops")) {
      const json& p = j["peak_flops"];
      s.peak_flops_fp32 = p.value("fp32", s.peak_flops_fp32);
      s.peak_flops_bf16 = p.value("bf16", s.peak_flops_bf16);
      s.peak_flops_fp8 = p.value("fp8", s.peak_flops_fp8);
    }
    s.memory_bytes = j.value("memory_bytes", s.memory_bytes);
    s.memory_bandwidth = j.value("memory_bandwidth", s.memory_bandwidth);
    s.intra_node_bandwidth = j.value("intra_node_bandwidth", s.intra_node_bandwidth);
    s.intra_node_latency = j.value("intra_node_latency", s.intra_node_latency);
    s.inter_node_bandwidth = j.value("inter_node_bandwidth", s.inter_node_bandwidth);
    s.inter_node_latency = j.value("inter_node_latency", s.inter_node_latency);
    s.achievable_gemm_fraction = j.value("achievable_gemm_fraction", s.achievable_gemm_fraction);
  } catch (const json::exception& e) {
    KILN_FAIL("--system: {}: a value has the wrong type: {}", name_or_path, e.what());
  }
  s.validate();
  return s;
}

std::string system_json(const SystemSpec& s) {
  json j = {{"name", s.name},
            {"gpus_per_node", s.gpus_per_node},
            {"nodes", s.nodes},
            {"peak_flops", {{"fp32", s.peak_flops_fp32}, {"bf16", s.peak_flops_bf16}, {"fp8", s.peak_flops_fp8}}},
            {"memory_bytes", s.memory_bytes},
            {"memory_bandwidth", s.memory_bandwidth},
            {"intra_node_bandwidth", s.intra_node_bandwidth},
            {"intra_node_latency", s.intra_node_latency},
            {"inter_node_bandwidth", s.inter_node_bandwidth},
            {"inter_node_latency", s.inter_node_latency},
            {"achievable_gemm_fraction", s.achievable_gemm_fraction}};
  return j.dump(2) + "\n";
}

}  // namespace kiln::sim
