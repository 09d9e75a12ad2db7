#pragma once
// Time of the collectives training uses, by the ring and tree algorithms NCCL picks between:
// a ring all-reduce of n bytes over p ranks moves 2 (p-1)/p n bytes through each rank's slowest
// link in 2 (p-1) steps, each paying the link latency; all-gather and reduce-scatter are half of
// it; a tree all-reduce pays 2 log2(p) latencies and 2 n bytes. A group that spans nodes runs at
// the inter-node link's speed (the ring's slowest hop).
#include "kiln/sim/system_spec.h"

namespace kiln::sim {

struct Link {
  double bandwidth = 0;  // bytes/s, one direction
  double latency = 0;    // s per step
};

// The link a group of `ranks` consecutive-in-the-layout devices, `stride` apart, communicates over.
Link group_link(const SystemSpec& system, int ranks, int stride);

double ring_all_reduce_seconds(double bytes, int ranks, Link link);
double tree_all_reduce_seconds(double bytes, int ranks, Link link);
// The faster of ring and tree (NCCL's choice by size).
double all_reduce_seconds(double bytes, int ranks, Link link);
// bytes: the full (gathered) buffer.
double all_gather_seconds(double bytes, int ranks, Link link);
double reduce_scatter_seconds(double bytes, int ranks, Link link);
// bytes: what one rank sends in total (1/p of it stays local).
double all_to_all_seconds(double bytes, int ranks, Link link);
double send_recv_seconds(double bytes, Link link);

}  // namespace kiln::sim
