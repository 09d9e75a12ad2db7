#pragma once
// Geometry: where this process's box of the global 3-D grid lies, as in the reference's
// GenerateGeometry: processes form an npx x npy x npz grid, rank = ipx + npx*(ipy + npy*ipz), each
// owning an nx x ny x nz box. The grid is not periodic.
#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kiln::hpcg {

inline constexpr int kMgLevels = 4;  // the reference's V-cycle depth: fine grid and three coarse grids

struct ProcessGrid {
  int npx = 1, npy = 1, npz = 1;
  int size() const { return npx * npy * npz; }
};

struct Geometry {
  int nx = 0, ny = 0, nz = 0;     // local box
  int npx = 1, npy = 1, npz = 1;  // process grid
  int ipx = 0, ipy = 0, ipz = 0;  // this rank's place in it
  int rank = 0;

  std::int64_t local_rows() const { return std::int64_t{nx} * ny * nz; }
  std::int64_t gnx() const { return std::int64_t{nx} * npx; }
  std::int64_t gny() const { return std::int64_t{ny} * npy; }
  std::int64_t gnz() const { return std::int64_t{nz} * npz; }
  std::int64_t global_rows() const { return gnx() * gny() * gnz(); }
  // The rank of the neighbour at offset (dx, dy, dz) in {-1, 0, 1}^3, or -1 outside the grid.
  int neighbor_rank(int dx, int dy, int dz) const;
  // The geometry of the next coarser multigrid level (every local dimension halved).
  Geometry coarsened() const;
};

// Checks the local dimensions as the reference does (each a multiple of 8 so that three halvings
// stay integral, at least 16, aspect ratio at least 0.125); throws kiln::Error naming the reason.
void check_local_dimensions(int nx, int ny, int nz);

// The most cubic factorisation of `size` processes (fewest halo faces), or the user's npx/npy/npz
// when given (all three or none), refused with the reason when it does not multiply to `size` or
// its aspect ratio is below the reference's 0.125.
ProcessGrid choose_process_grid(int size, std::optional<std::array<int, 3>> requested);

Geometry make_geometry(int nx, int ny, int nz, ProcessGrid grid, int rank);

// The V-cycle's levels, finest first.
std::vector<Geometry> make_hierarchy(const Geometry& fine, int levels = kMgLevels);

}  // namespace kiln::hpcg
