#include "kiln/hpc/hpcg/geometry.h"

#include <algorithm>
#include <climits>
#include <cstdint>

#include "kiln/runtime/error.h"

namespace kiln::hpcg {

namespace {
constexpr double kMinAspectRatio = 0.125;  // the reference's CheckAspectRatio limit

double aspect_ratio(int a, int b, int c) {
  return static_cast<double>(std::min({a, b, c})) / static_cast<double>(std::max({a, b, c}));
}
}  // namespace

int Geometry::neighbor_rank(int dx, int dy, int dz) const {
  int x = ipx + dx, y = ipy + dy, z = ipz + dz;
  if (x < 0 || y < 0 || z < 0 || x >= npx || y >= npy || z >= npz) return -1;
  return x + npx * (y + npy * z);
}

Geometry Geometry::coarsened() const {
  KILN_CHECK(nx % 2 == 0 && ny % 2 == 0 && nz % 2 == 0, "hpcg: cannot coarsen a {}x{}x{} box", nx, ny, nz);
  Geometry c = *this;
  c.nx /= 2;
  c.ny /= 2;
  c.nz /= 2;
  return c;
}

void check_local_dimensions(int nx, int ny, int nz) {
  for (auto [name, n] : {std::pair{"nx", nx}, std::pair{"ny", ny}, std::pair{"nz", nz}}) {
    KILN_CHECK(n % 8 == 0, "hpcg: local {} = {} is not a multiple of 8 (the {}-level multigrid halves it three times)",
               name, n, kMgLevels);
    KILN_CHECK(n >= 16, "hpcg: local {} = {} is below the reference's minimum of 16", name, n);
  }
  // Rows and columns are 32-bit indices (the sliced-ELL column arrays, the halo plan): the local box
  // with its one-point halo must number below 2^31, else the sizes wrap (nx = 2048 would, after a
  // long setup). At most about 1288^3.
  const std::int64_t points = (std::int64_t{nx} + 2) * (std::int64_t{ny} + 2) * (std::int64_t{nz} + 2);
  KILN_CHECK(points <= INT32_MAX,
             "hpcg: the local box {}x{}x{} has {} points with its halo, beyond the 32-bit row indices of Kiln's HPCG "
             "(at most {}, about 1288^3); use more processes or a smaller box",
             nx, ny, nz, points, INT32_MAX);
  KILN_CHECK(aspect_ratio(nx, ny, nz) >= kMinAspectRatio,
             "hpcg: the local box {}x{}x{} has aspect ratio {:.3f}, below the reference's {}", nx, ny, nz,
             aspect_ratio(nx, ny, nz), kMinAspectRatio);
}

ProcessGrid choose_process_grid(int size, std::optional<std::array<int, 3>> requested) {
  KILN_CHECK(size >= 1, "hpcg: {} processes", size);
  ProcessGrid grid;
  if (requested) {
    auto [px, py, pz] = *requested;
    KILN_CHECK(px >= 1 && py >= 1 && pz >= 1, "hpcg: process grid {}x{}x{} has a non-positive side", px, py, pz);
    KILN_CHECK(px * py * pz == size, "hpcg: the process grid {}x{}x{} has {} places but {} processes were started", px,
               py, pz, px * py * pz, size);
    grid = {px, py, pz};
  } else {
    // Most cubic first: the smallest largest side, then the smallest middle side.
    bool found = false;
    for (int px = 1; px <= size; ++px) {
      if (size % px) continue;
      for (int py = 1; py <= size / px; ++py) {
        if ((size / px) % py) continue;
        int pz = size / px / py;
        ProcessGrid g{px, py, pz};
        auto key = [](ProcessGrid q) {
          std::array<int, 3> s{q.npx, q.npy, q.npz};
          std::sort(s.begin(), s.end());
          return std::pair{s[2], s[1]};
        };
        if (!found || key(g) < key(grid) ||
            (key(g) == key(grid) && std::array{g.npz, g.npy, g.npx} > std::array{grid.npz, grid.npy, grid.npx})) {
          grid = g;
          found = true;
        }
      }
    }
  }
  KILN_CHECK(
      aspect_ratio(grid.npx, grid.npy, grid.npz) >= kMinAspectRatio,
      "hpcg: {} processes only factor into the grid {}x{}x{}, whose aspect ratio {:.3f} is below the reference's "
      "{}; use a process count with a more cubic factorisation",
      size, grid.npx, grid.npy, grid.npz, aspect_ratio(grid.npx, grid.npy, grid.npz), kMinAspectRatio);
  return grid;
}

Geometry make_geometry(int nx, int ny, int nz, ProcessGrid grid, int rank) {
  check_local_dimensions(nx, ny, nz);
  KILN_CHECK(rank >= 0 && rank < grid.size(), "hpcg: rank {} outside a grid of {}", rank, grid.size());
  Geometry g;
  g.nx = nx;
  g.ny = ny;
  g.nz = nz;
  g.npx = grid.npx;
  g.npy = grid.npy;
  g.npz = grid.npz;
  g.rank = rank;
  g.ipx = rank % grid.npx;
  g.ipy = (rank / grid.npx) % grid.npy;
  g.ipz = rank / (grid.npx * grid.npy);
  return g;
}

std::vector<Geometry> make_hierarchy(const Geometry& fine, int levels) {
  std::vector<Geometry> out{fine};
  for (int l = 1; l < levels; ++l) out.push_back(out.back().coarsened());
  return out;
}

}  // namespace kiln::hpcg
