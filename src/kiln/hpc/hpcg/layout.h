#pragma once
// LevelLayout: how one multigrid level's rows and halo are numbered, as plain data plus inline
// functions that compile for both the host and CUDA kernels, so that the CPU and GPU engines build
// and address the matrix with the same code (and the CPU tests check what the GPU runs).
//
// Rows are local grid points (i, j, k), 0 <= i < nx etc. Two orderings:
//  - natural: i + nx*(j + ny*k), the reference's lexicographic order;
//  - coloured: the 8 parity classes (i%2, j%2, k%2) one after another (see color_of), each in
//    lexicographic order.
//    No two points of one class are 27-point neighbours, so a Gauss-Seidel sweep may update a whole
//    class at once (multi-colouring).
// Halo points follow the rows: the block of the neighbour in direction d = (dx, dy, dz) comes at
// nrow + halo_offset[d], its points in lexicographic order of their global coordinates. The sender
// packs its boundary layer in the same order, so no index lists travel.
#include <cstdint>

#include "kiln/runtime/scalar_types.h"  // KILN_HD: __host__ __device__ under nvcc

namespace kiln::hpcg {

inline constexpr int kStencil = 27;  // slots per row: slot = (dz+1)*9 + (dy+1)*3 + (dx+1)
inline constexpr int kDiagonalSlot = 13;
inline constexpr int kSlice = 32;  // rows per slice of the sliced-ELL layout (one warp)

struct LevelLayout {
  int nx = 0, ny = 0, nz = 0;
  int nrow = 0;  // local rows
  int ncol = 0;  // rows plus halo points
  bool colored = false;
  int color_start[9] = {};                 // coloured ordering: rows of colour c are [color_start[c], color_start[c+1])
  int halo_offset[27] = {};                // -1 where there is no neighbour
  std::int64_t gx0 = 0, gy0 = 0, gz0 = 0;  // global coordinates of local (0, 0, 0)
  std::int64_t gnx = 0, gny = 0, gnz = 0;
};

KILN_HD inline int slot_of(int dx, int dy, int dz) { return (dz + 1) * 9 + (dy + 1) * 3 + (dx + 1); }
// Colour c relaxes the parity class (i%2 + 2 (j%2) + 4 (k%2)) parity_of_color(c). The order is
// chosen for convergence, measured (CG iterations to the reference's 50-iteration reduction, local
// 32^3 / 48^3 / 64^3):
//  - the all-even class (the points restriction injects) must be the last colour: the backward
//    sweep then relaxes it first, so the residual left there is not zeroed by a last update
//    (relaxing a point zeroes its own residual, which would starve the coarse-grid correction):
//    with it first, 61 / 60 iterations at 32^3 / 48^3;
//  - classes by falling number of odd coordinates, 7 | 3 5 6 | 1 2 4 | 0: 51 / 50 / 50 iterations
//    (plain 7 6 5 4 3 2 1 0: 52 / 52 / 53; rising, 1 2 4 | 3 5 6 | 7 | 0: 55 at 32^3).
KILN_HD inline int parity_of_color(int c) {
  constexpr int table[8] = {7, 3, 5, 6, 1, 2, 4, 0};
  return table[c];
}
KILN_HD inline int color_of_parity(int p) {
  constexpr int table[8] = {7, 4, 5, 1, 6, 2, 3, 0};  // the inverse of parity_of_color
  return table[p];
}
KILN_HD inline int color_of(int i, int j, int k) { return color_of_parity((i & 1) + 2 * (j & 1) + 4 * (k & 1)); }

// The slots a forward coloured sweep must read when x started at zero: neighbours of colours
// already relaxed (lower colours) only; the rest of x, and the row's own entry, are still zero.
// A slot's offset flips the parity bits of its odd components, which fixes the neighbour's colour.
KILN_HD inline unsigned lower_colour_slots(int color) {
  unsigned mask = 0;
  int parity = parity_of_color(color);
  for (int dz = -1; dz <= 1; ++dz)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int flip = (dx & 1) | ((dy & 1) << 1) | ((dz & 1) << 2);
        if (flip != 0 && color_of_parity(parity ^ flip) < color) mask |= 1u << slot_of(dx, dy, dz);
      }
  return mask;
}

// Sliced ELL: slices of kSlice rows, each slice's slot s stored as kSlice consecutive entries, so a
// warp reading one slot of its 32 rows reads 256 contiguous bytes.
KILN_HD inline std::int64_t ell_index(int row, int slot) {
  return (static_cast<std::int64_t>(row / kSlice) * kStencil + slot) * kSlice + row % kSlice;
}
KILN_HD inline std::int64_t ell_size(int nrow) {
  return static_cast<std::int64_t>((nrow + kSlice - 1) / kSlice) * kStencil * kSlice;
}

KILN_HD inline int local_index(const LevelLayout& L, int i, int j, int k) {
  if (!L.colored) return i + L.nx * (j + L.ny * k);
  int c = color_of(i, j, k);
  int hx = (L.nx + 1 - (i & 1)) / 2, hy = (L.ny + 1 - (j & 1)) / 2;
  return L.color_start[c] + (i >> 1) + hx * ((j >> 1) + hy * (k >> 1));
}

KILN_HD inline void coords_of(const LevelLayout& L, int row, int& i, int& j, int& k) {
  if (!L.colored) {
    i = row % L.nx;
    j = (row / L.nx) % L.ny;
    k = row / (L.nx * L.ny);
    return;
  }
  int c = 0;
  while (row >= L.color_start[c + 1]) ++c;
  int p = parity_of_color(c), pi = p & 1, pj = (p >> 1) & 1, pk = (p >> 2) & 1;
  int hx = (L.nx + 1 - pi) / 2, hy = (L.ny + 1 - pj) / 2;
  int q = row - L.color_start[c];
  i = 2 * (q % hx) + pi;
  j = 2 * ((q / hx) % hy) + pj;
  k = 2 * (q / (hx * hy)) + pk;
}

// Extent of the halo block in direction d along one axis: the first coordinate and the width.
KILN_HD inline void halo_extent(int d, int n, int& first, int& width) {
  first = d < 0 ? -1 : (d > 0 ? n : 0);
  width = d == 0 ? n : 1;
}

// The column of neighbour (i+dx, j+dy, k+dz) of local point (i, j, k): a row, a halo point, or -1
// outside the global domain.
KILN_HD inline int neighbor_column(const LevelLayout& L, int i, int j, int k, int dx, int dy, int dz) {
  int a = i + dx, b = j + dy, c = k + dz;
  if (a >= 0 && b >= 0 && c >= 0 && a < L.nx && b < L.ny && c < L.nz) return local_index(L, a, b, c);
  std::int64_t ga = L.gx0 + a, gb = L.gy0 + b, gc = L.gz0 + c;
  if (ga < 0 || gb < 0 || gc < 0 || ga >= L.gnx || gb >= L.gny || gc >= L.gnz) return -1;
  int hx = a < 0 ? -1 : (a >= L.nx ? 1 : 0), hy = b < 0 ? -1 : (b >= L.ny ? 1 : 0),
      hz = c < 0 ? -1 : (c >= L.nz ? 1 : 0);
  int x0, sx, y0, sy, z0, sz;
  halo_extent(hx, L.nx, x0, sx);
  halo_extent(hy, L.ny, y0, sy);
  halo_extent(hz, L.nz, z0, sz);
  return L.nrow + L.halo_offset[slot_of(hx, hy, hz)] + ((c - z0) * sy + (b - y0)) * sx + (a - x0);
}

KILN_HD inline std::int64_t global_row(const LevelLayout& L, int i, int j, int k) {
  return (L.gx0 + i) + L.gnx * ((L.gy0 + j) + L.gny * (L.gz0 + k));
}

// Fills row `row` of the reference problem's matrix into the 27 slots (absent neighbours: value 0,
// column = the row itself, so every kernel may read all 27 without a branch) and returns the
// right-hand side that makes the all-ones vector the exact solution: 26 - (neighbours present).
template <class SlotWriter>
KILN_HD inline double generate_row(const LevelLayout& L, int row, SlotWriter&& write) {
  int i, j, k;
  coords_of(L, row, i, j, k);
  int present = 0;
  for (int dz = -1; dz <= 1; ++dz)
    for (int dy = -1; dy <= 1; ++dy)
      for (int dx = -1; dx <= 1; ++dx) {
        int s = slot_of(dx, dy, dz);
        if (s == kDiagonalSlot) {
          write(s, row, 26.0);
          continue;
        }
        int col = neighbor_column(L, i, j, k, dx, dy, dz);
        if (col < 0) {
          write(s, row, 0.0);
        } else {
          write(s, col, -1.0);
          ++present;
        }
      }
  return 26.0 - present;
}

// Injection: the all-even fine points, the last colour's block, are the coarse grid's points in
// its lexicographic order; the q-th of them is this coarse row (coloured).
KILN_HD inline int coarse_of_injected(const LevelLayout& coarse, int q) {
  int i = q % coarse.nx, j = (q / coarse.nx) % coarse.ny, k = q / (coarse.nx * coarse.ny);
  return local_index(coarse, i, j, k);
}

// TestCG's exaggerated diagonal: the reference multiplies row g's diagonal by (g+2)*1e6 for the
// first nine global rows and by 1e6 otherwise, making CG converge in a dozen iterations.
KILN_HD inline double diagonal_exaggeration(std::int64_t global_row_id) {
  return global_row_id < 9 ? (static_cast<double>(global_row_id) + 2.0) * 1.0e6 : 1.0e6;
}

}  // namespace kiln::hpcg
