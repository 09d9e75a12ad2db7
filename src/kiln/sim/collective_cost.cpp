#include "kiln/sim/collective_cost.h"

#include <algorithm>
#include <cmath>

namespace kiln::sim {

Link group_link(const SystemSpec& system, int ranks, int stride) {
  // Devices are numbered node-major; a group whose span reaches past one node crosses the network.
  const bool crosses_nodes = static_cast<long long>(ranks) * stride > system.gpus_per_node;
  if (crosses_nodes) return {system.inter_node_bandwidth, system.inter_node_latency};
  return {system.intra_node_bandwidth, system.intra_node_latency};
}

double ring_all_reduce_seconds(double bytes, int ranks, Link link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double p = ranks;
  return 2 * (p - 1) * link.latency + 2 * (p - 1) / p * bytes / link.bandwidth;
}

double tree_all_reduce_seconds(double bytes, int ranks, Link link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  // A double binary tree: reduce up and broadcast down, each rank sending the whole buffer twice
  // (pipelined in chunks, so the depth costs latency only).
  return 2 * std::ceil(std::log2(static_cast<double>(ranks))) * link.latency + 2 * bytes / link.bandwidth;
}

double all_reduce_seconds(double bytes, int ranks, Link link) {
  return std::min(ring_all_reduce_seconds(bytes, ranks, link), tree_all_reduce_seconds(bytes, ranks, link));
}

double all_gather_seconds(double bytes, int ranks, Link link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double p = ranks;
  return (p - 1) * link.latency + (p - 1) / p * bytes / link.bandwidth;
}

double reduce_scatter_seconds(double bytes, int ranks, Link link) { return all_gather_seconds(bytes, ranks, link); }

double all_to_all_seconds(double bytes, int ranks, Link link) {
  if (ranks <= 1 || bytes <= 0) return 0;
  const double p = ranks;
  return (p - 1) * link.latency + (p - 1) / p * bytes / link.bandwidth;
}

double send_recv_seconds(double bytes, Link link) { return bytes <= 0 ? 0 : link.latency + bytes / link.bandwidth; }

}  // namespace kiln::sim
