#pragma once
// HaloPlan: what one level sends to and receives from each of its up to 26 neighbours, for a given
// row ordering. The receive side needs no list (halo points are numbered by LevelLayout); the send
// side lists, per neighbour, the local rows of the boundary layer in the order the neighbour
// numbers them.
#include <span>
#include <vector>

#include "kiln/dist/halo_exchange.h"
#include "kiln/hpc/hpcg/geometry.h"
#include "kiln/hpc/hpcg/layout.h"

namespace kiln::hpcg {

struct HaloPlan {
  std::vector<dist::HaloPeer> peers;
  std::vector<int> send_rows;  // concatenated per peer, at peer.send_offset
  int halo_size = 0;           // ncol - nrow
};

// Numbers the halo blocks (fills layout.halo_offset, ncol) and lists what to send.
HaloPlan plan_halo(const Geometry& geometry, LevelLayout& layout);

// Sends plan.send_rows' values (packed in `send`) and fills the halo block `recv`. Defined out of
// line so that CUDA translation units never instantiate the peer list's copies.
void exchange_halo_values(const HaloPlan& plan, const dist::Communicator& comm, std::span<const double> send,
                          std::span<double> recv);

// The layout of one level in the natural or coloured ordering, halo included.
LevelLayout make_layout(const Geometry& geometry, bool colored);

}  // namespace kiln::hpcg
