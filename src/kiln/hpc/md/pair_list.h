#pragma once
// The Verlet pair list: for each atom i, the atoms j > i within rlist (minimum image, rectangular
// box), not excluded. Built on a cell grid (cells >= rlist, at least 3 per dimension) or, for
// boxes too small for 3 cells, over all pairs. Between rebuilds the list stays exact while the two
// largest displacements since the build add up to less than the buffer rlist - rc (the engine
// checks that every step).
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

class PairList {
 public:
  // With `home_count` >= 0 (domain decomposition) pairs of two atoms from home_count on (two halo
  // atoms, which another rank computes) are left out.
  void build(const MdSystem& system, const std::vector<Vec3>& positions, const Vec3& box, double rlist,
             int home_count = -1);

  // CSR layout: the partners of atom i are neighbors()[offsets()[i] .. offsets()[i + 1]).
  const std::vector<int>& offsets() const { return offsets_; }
  const std::vector<int>& neighbors() const { return neighbors_; }
  std::size_t pair_count() const { return neighbors_.size(); }
  bool used_cell_grid() const { return used_cells_; }

 private:
  std::vector<int> offsets_, neighbors_;
  bool used_cells_ = false;
};

}  // namespace kiln::md
