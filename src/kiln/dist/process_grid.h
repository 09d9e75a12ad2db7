#pragma once
// ProcessGrid: a P x Q grid of processes over a communicator, with one communicator per grid row
// and per grid column (ScaLAPACK/HPL style). Dense linear algebra on 2-D block-cyclic matrices
// (HPL), and any code that wants row/column collectives, builds one of these.
#include <optional>

#include "kiln/dist/communicator.h"

namespace kiln::dist {

// Row-major: rank r sits at (r / Q, r % Q); column-major: at (r % P, r / P) (HPL's PMAP 0 / 1).
enum class GridOrder : std::uint8_t { RowMajor, ColumnMajor };

class ProcessGrid {
 public:
  // Uses ranks 0 .. P*Q-1 of `parent`; the others get a grid where in_grid() is false and must not
  // take part. Throws, naming the numbers, when P*Q exceeds parent.size(). Collective on `parent`.
  ProcessGrid(const Communicator& parent, int P, int Q, GridOrder order = GridOrder::RowMajor);

  int P() const { return P_; }
  int Q() const { return Q_; }
  GridOrder order() const { return order_; }
  bool in_grid() const { return in_grid_; }
  int my_row() const { return my_row_; }
  int my_col() const { return my_col_; }

  // All processes of the grid, ranked by their position in the grid order.
  const Communicator& all() const { return *all_; }
  // The Q processes of my grid row, ranked by column; the P processes of my grid column, by row.
  const Communicator& row() const { return *row_; }
  const Communicator& col() const { return *col_; }

 private:
  int P_, Q_;
  GridOrder order_;
  bool in_grid_ = false;
  int my_row_ = -1, my_col_ = -1;
  std::optional<Communicator> all_, row_, col_;
};

}  // namespace kiln::dist
