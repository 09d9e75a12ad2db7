#pragma once
// HPL's recursive panel factorisation (HPL_pdrpan*), written once for every engine (CPU over a
// process column, one GPU). A panel is columns [j, j+jb) of the matrix below row j; indices here
// are relative to it: column k is global column j+k, "row r" is global row j+r.
//
// A node of the recursion factors panel columns [k0, k0+n). It splits them into NDIV pieces (or,
// once n <= NBMIN, into single columns) and orders the pieces' updates left-, Crout- or
// right-looking (RFACT for pieces, PFACT for columns). All three compute the same factors; they
// differ in when each part of the trailing columns is brought up to date.
//
// The engine holds the panel and offers four operations. "Top" is the jb x jb block of the rows
// already chosen as pivots (global rows j .. j+jb once swapped); "active" rows are those not yet
// chosen.
//   factor_column(k): find the pivot of column k among the active rows (row k and below), swap it
//     with row k across the whole panel width, record it, and scale the rest of column k by it.
//   solve_top(r0, r1, c0, c1): Top[r0:r1, c0:c1] = unit_lower(Top[r0:r1, r0:r1])^-1 Top[r0:r1, c0:c1]
//   update_top(r0, r1, k0, k1, c0, c1): Top[r0:r1, c0:c1] -= Top[r0:r1, k0:k1] Top[k0:k1, c0:c1]
//   update_active(first, k0, k1, c0, c1): for rows >= first:  A[., c0:c1] -= A[., k0:k1] Top[k0:k1, c0:c1]
// Every update touches only columns inside the node that issues it, which is what makes the three
// orders interchangeable at every level.
//
// An engine may also offer factor_leaf(k0, n), which factors a whole leaf (n <= NBMIN columns) at
// once, right-looking, and returns false when it cannot (the columns are then done one by one).
#include <algorithm>
#include <concepts>

#include "kiln/hpc/hpl/hpl_params.h"

namespace kiln::hpl {

struct PanelOptions {
  Factorization pfact = Factorization::Right;
  Factorization rfact = Factorization::Crout;
  int nbmin = 4;
  int ndiv = 2;
};

template <class Engine>
concept FusedLeafEngine = requires(Engine& e, int k0, int n) {
  { e.factor_leaf(k0, n) } -> std::same_as<bool>;
};

template <class Engine>
void factor_panel_node(Engine& e, int k0, int n, const PanelOptions& o) {
  if (n <= 0) return;
  if constexpr (FusedLeafEngine<Engine>)
    if (n <= o.nbmin && e.factor_leaf(k0, n)) return;
  if (n == 1) {
    e.factor_column(k0);
    return;
  }
  const bool columns = n <= o.nbmin;
  const Factorization order = columns ? o.pfact : o.rfact;
  const int pieces = columns ? n : std::min(std::max(o.ndiv, 2), n);
  const int end = k0 + n;
  int a = k0;
  for (int i = 0; i < pieces; ++i) {
    const int b = k0 + static_cast<int>(static_cast<long>(n) * (i + 1) / pieces);
    if (a > k0 && order == Factorization::Left) {
      // Left-looking: bring this piece up to date with everything factored before it.
      e.solve_top(k0, a, a, b);
      e.update_active(a, k0, a, a, b);
    } else if (a > k0 && order == Factorization::Crout) {
      // Crout: the piece's rows of U to its left are final already; update its columns below.
      e.update_active(a, k0, a, a, b);
    }
    factor_panel_node(e, a, b - a, o);
    if (b < end && order == Factorization::Right) {
      // Right-looking: push this piece's update into every column to its right.
      e.solve_top(a, b, b, end);
      e.update_active(b, a, b, b, end);
    } else if (b < end && order == Factorization::Crout) {
      // Crout: finish this piece's rows of U to the right, for the later pieces' updates.
      if (a > k0) e.update_top(a, b, k0, a, b, end);
      e.solve_top(a, b, b, end);
    }
    a = b;
  }
}

}  // namespace kiln::hpl
