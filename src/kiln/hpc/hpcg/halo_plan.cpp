#include "kiln/hpc/hpcg/halo_plan.h"

namespace kiln::hpcg {

HaloPlan plan_halo(const Geometry& g, LevelLayout& L) {
  HaloPlan plan;
  int offset = 0;
  for (int dz = -1; dz <= 1; ++dz)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int s = slot_of(dx, dy, dz);
        int peer_rank = s == kDiagonalSlot ? -1 : g.neighbor_rank(dx, dy, dz);
        if (peer_rank < 0) {
          L.halo_offset[s] = -1;
          continue;
        }
        int x0, sx, y0, sy, z0, sz;
        halo_extent(dx, L.nx, x0, sx);
        halo_extent(dy, L.ny, y0, sy);
        halo_extent(dz, L.nz, z0, sz);
        int count = sx * sy * sz;
        L.halo_offset[s] = offset;

        // The boundary layer facing this neighbour, in the neighbour's numbering of its halo block
        // (lexicographic in global coordinates, which is ours shifted).
        dist::HaloPeer peer;
        peer.rank = peer_rank;
        peer.send_tag = s;                 // the neighbour receives it from direction -d: tag s
        peer.recv_tag = kStencil - 1 - s;  // it sends towards us in direction -d
        peer.send_offset = plan.send_rows.size();
        peer.send_count = static_cast<std::size_t>(count);
        peer.recv_offset = static_cast<std::size_t>(offset);
        peer.recv_count = static_cast<std::size_t>(count);
        int bx0 = dx < 0 ? 0 : (dx > 0 ? L.nx - 1 : 0);
        int by0 = dy < 0 ? 0 : (dy > 0 ? L.ny - 1 : 0);
        int bz0 = dz < 0 ? 0 : (dz > 0 ? L.nz - 1 : 0);
        for (int k = 0; k < sz; ++k)
          for (int j = 0; j < sy; ++j)
            for (int i = 0; i < sx; ++i) plan.send_rows.push_back(local_index(L, bx0 + i, by0 + j, bz0 + k));
        plan.peers.push_back(peer);
        offset += count;
      }
  plan.halo_size = offset;
  L.ncol = L.nrow + offset;
  return plan;
}

void exchange_halo_values(const HaloPlan& plan, const dist::Communicator& comm, std::span<const double> send,
                          std::span<double> recv) {
  dist::HaloExchange(comm, plan.peers).exchange(send, recv);
}

LevelLayout make_layout(const Geometry& g, bool colored) {
  LevelLayout L;
  L.nx = g.nx;
  L.ny = g.ny;
  L.nz = g.nz;
  L.nrow = static_cast<int>(g.local_rows());
  L.colored = colored;
  int start = 0;
  for (int c = 0; c < 8; ++c) {
    int p = parity_of_color(c), pi = p & 1, pj = (p >> 1) & 1, pk = (p >> 2) & 1;
    L.color_start[c] = start;
    start += ((g.nx + 1 - pi) / 2) * ((g.ny + 1 - pj) / 2) * ((g.nz + 1 - pk) / 2);
  }
  L.color_start[8] = start;
  L.gx0 = std::int64_t{g.ipx} * g.nx;
  L.gy0 = std::int64_t{g.ipy} * g.ny;
  L.gz0 = std::int64_t{g.ipz} * g.nz;
  L.gnx = g.gnx();
  L.gny = g.gny();
  L.gnz = g.gnz();
  HaloPlan unused = plan_halo(g, L);
  (void)unused;
  return L;
}

}  // namespace kiln::hpcg
