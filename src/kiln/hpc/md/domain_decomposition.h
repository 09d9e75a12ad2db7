#pragma once
// Domain decomposition of the CPU engine over MPI ranks (mpirun -np N kiln mdrun): the box is cut
// into an nx x ny x nz grid of equal domains, one per rank. Update groups (each molecule: a SETTLE
// water, a molecule with its LINCS constraints, bonded terms and exclusions) live whole on the rank
// whose domain holds their geometric centre, and move there at neighbour-search steps; so every
// constraint, bonded term and excluded pair is on one rank with all its atoms.
//
// Each rank keeps a local system: its home atoms (sorted by global index) then its halo, the atoms
// of other ranks within rlist + the largest group radius of its domain (periodic distance), which
// covers every atom within rlist of a home atom. The halo's coordinates come from their owners
// every step (dist::HaloExchange); no forces go back: a home-halo pair is computed on both ranks,
// each keeping the force on its own atom and half the energy and virial (nonbonded.h's
// home_count), so nothing is double counted and nothing is missing.
//
// Sums over ranks that drive decisions (kinetic energy for v-rescale, pressure for c-rescale, the
// largest displacements for the list) are taken in rank order after an all-gather, so every rank
// gets the same bits and takes the same branch with the same random numbers.
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/dist/halo_exchange.h"
#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// The domain grid for `ranks` ranks: `requested` when it is not {0, 0, 0} (as gmx mdrun -dd),
// otherwise the factorisation with the smallest halo (domain faces) whose domains are all at least
// `min_width` wide. Refuses, naming the widths, a grid whose domains are thinner than that, and a
// requested grid with a different number of domains.
std::array<int, 3> choose_domain_grid(int ranks, const Vec3& box, double min_width, double cutoff,
                                      std::array<int, 3> requested);

// The update groups: the connected parts of the bond, constraint, settle, exclusion, pair, angle
// and dihedral graph (molecules), as [first, last) atom ranges. Refuses groups that are not
// contiguous in the atom order.
std::vector<std::array<int, 2>> update_groups(const MdSystem& system);

class DomainDecomposition {
 public:
  DomainDecomposition(const MdSystem& global, dist::Communicator comm, std::array<int, 3> grid, double rlist,
                      double cutoff);

  int rank() const { return rank_; }
  int size() const { return size_; }
  bool is_root() const { return rank_ == 0; }
  const std::array<int, 3>& grid() const { return grid_; }

  // The start: every rank has the whole system's x and v (read from the same files); each keeps
  // the groups whose centre is in its domain.
  void distribute(const std::vector<Vec3>& x, const std::vector<Vec3>& v, const Vec3& box, std::vector<Vec3>& x_home,
                  std::vector<Vec3>& v_home);
  // A search step: groups whose centre left the domain move to their new rank (x and v), then the
  // halo is chosen anew and the local system rebuilt. `step` names it in errors.
  void repartition(std::vector<Vec3>& x_home, std::vector<Vec3>& v_home, const Vec3& box, std::int64_t step);

  // Home atoms first, then the halo; bonded terms, constraints and exclusions of the home atoms.
  const MdSystem& local_system() const { return local_; }
  int home_count() const { return static_cast<int>(home_.size()); }
  int local_count() const { return static_cast<int>(home_.size() + halo_.size()); }
  // The global index of local atom i.
  int global_index(int i) const { return i < home_count() ? home_[i] : halo_[i - home_count()]; }
  // Atoms this rank has sent to others at search steps so far.
  std::int64_t migrated_atoms() const { return migrated_; }

  // x_local = the home positions, then the halo's from their owners.
  void exchange_halo(const std::vector<Vec3>& x_home, std::vector<Vec3>& x_local) const;

  // In place: the sum over ranks, added in rank order (the same bits on every rank).
  void sum(std::span<double> values) const;
  // In place: the sum over ranks (MPI's order; for the PME grid).
  void sum_unordered(std::span<double> values) const;
  // The two largest of every rank's two largest values.
  std::array<double, 2> largest_two(double largest, double second) const;
  // Rank 0 gets the home vectors of every rank in the global atom order; the others get nothing.
  std::vector<Vec3> gather(const std::vector<Vec3>& home) const;

 private:
  int domain_of(const Vec3& point, const Vec3& box) const;
  Vec3 group_centre(const std::vector<Vec3>& x, int first_local, int group, const Vec3& box) const;
  void check_domain_widths(const Vec3& box, std::int64_t step) const;
  void select_halo(const std::vector<Vec3>& x_home, const Vec3& box);
  void build_local_system();

  const MdSystem& global_;
  dist::Communicator comm_;
  int rank_ = 0, size_ = 1;
  std::array<int, 3> grid_{};
  double rlist_ = 0, cutoff_ = 0;
  std::vector<std::array<int, 2>> groups_;
  std::vector<int> group_of_;         // global atom -> group
  std::vector<int> home_, halo_;      // global indices
  std::vector<int> send_atoms_;       // local (home) indices sent to the peers, peer by peer
  dist::HaloExchange halo_exchange_;  // offsets in doubles (3 per atom)
  MdSystem local_;
  std::int64_t migrated_ = 0;
};

}  // namespace kiln::md
