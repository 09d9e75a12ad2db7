#include "kiln/dist/process_grid.h"

#include "kiln/runtime/error.h"

namespace kiln::dist {

ProcessGrid::ProcessGrid(const Communicator& parent, int P, int Q, GridOrder order) : P_(P), Q_(Q), order_(order) {
  KILN_CHECK(P >= 1 && Q >= 1, "process grid {} x {}: P and Q must be at least 1", P, Q);
  KILN_CHECK(P * Q <= parent.size(), "process grid {} x {} needs {} processes, but only {} are running (mpirun -np {})",
             P, Q, P * Q, parent.size(), P * Q);
  const int rank = parent.rank();
  in_grid_ = rank < P * Q;
  // Every split is collective on the parent, so processes outside the grid take part with their
  // own color and then drop the result.
  all_ = parent.split(in_grid_ ? 0 : 1, rank);
  if (in_grid_) {
    my_row_ = order == GridOrder::RowMajor ? rank / Q : rank % P;
    my_col_ = order == GridOrder::RowMajor ? rank % Q : rank / P;
  }
  row_ = parent.split(in_grid_ ? my_row_ : P, my_col_);
  col_ = parent.split(in_grid_ ? my_col_ : Q, my_row_);
}

}  // namespace kiln::dist
