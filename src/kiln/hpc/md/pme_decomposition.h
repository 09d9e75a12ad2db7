#pragma once
// Slab-decomposed smooth PME for domain decomposition (domain_decomposition.h): the grid's
// planes along one axis are split over the ranks, so no rank holds, transforms or moves the whole
// grid. Below, "x" is that slab axis and y, z the two after it (cyclically): the positions, box and
// grid are permuted so on the way in, the forces and virial back on the way out. The engine takes
// the axis its domains are cut along most (slab_axis_for), so a rank's atoms reach its own planes
// and a few more, and the spread and its return move a few planes rather than the grid.
//
// Per call, on every rank:
//  1. Spread: the home atoms' charges go onto a local buffer of only the x-planes their B-splines
//     reach (periodically). The ranks exchange which planes each touched (K0 bytes each), then each
//     plane goes to its owner (all-to-all-v), which sums the contributions in rank order: the same
//     bits whatever the timing.
//  2. Forward FFT: a 2-D real-to-complex transform of each owned x-plane over (y, z); an
//     all-to-all transpose gives each rank a range of y columns with every x; a 1-D complex
//     transform along x. Together they are the 3-D r2c transform of the one-grid PME.
//  3. Solve on the owned (x, y-range, z) block: this rank's share of the energy and virial.
//  4. The reverse: 1-D backward transforms along x, the transpose back, 2-D c2r per plane.
//  5. The potential's planes go back to the ranks that spread onto them (the reverse of 1), and
//     each gathers the forces on its home atoms.
// The energy and virial are this rank's shares: the engine sums them over the ranks in rank order
// (DomainDecomposition::sum) with its other terms. A rank may own no x-plane (K0 < ranks) or no y
// column (K1 < ranks): it then has no transform in that stage, and still spreads, gathers and
// takes part in every exchange (with empty blocks).
//
// Equal to the one-grid Pme to rounding in the energy, the forces and the virial's diagonal. With
// y- or z-slabs on an even grid the off-diagonal virial is not: the half-complex axis is then x or
// y instead of z, and the Nyquist point +K/2, which stands for -K/2 too, pairs with its mirror
// image under another sign (docs/mdrun.md).
#include <array>
#include <cstdint>
#include <memory>
#include <string_view>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

class PmeInfluence;
struct PmeSplines;

// How PME runs under domain decomposition: Slab (this file), or Replicated: every rank spreads
// onto the whole grid, the grid is all-reduced and every rank solves all of it (pme.h).
enum class PmeDecomposition : std::uint8_t { Slab, Replicated };
// "slab", "replicated"; the parse refuses any other text, naming it and the choices.
std::string_view pme_decomposition_name(PmeDecomposition decomposition);
PmeDecomposition parse_pme_decomposition(std::string_view text);

// [begin, end) of each of `ranks` ranks: `count` items split as evenly as possible, in order, the
// first count % ranks ranks one more (some empty when count < ranks). Refuses count < 0 or
// ranks < 1, naming them.
std::vector<std::array<int, 2>> slab_ranges(int count, int ranks);

// The slab axis for a domain grid: the one with the most domains (the first of equals), so that
// the slabs are cut where the domains are.
int slab_axis_for(const std::array<int, 3>& domain_grid);

class SlabPme {
 public:
  // Collective over `comm`: every rank makes it with the same grid, order, beta and slab axis
  // (0, 1, 2: planes normal to x, y or z). Refuses another axis, naming it.
  SlabPme(std::array<int, 3> grid, int order, double beta, dist::Communicator comm, int slab_axis = 0);
  ~SlabPme();
  SlabPme(const SlabPme&) = delete;
  SlabPme& operator=(const SlabPme&) = delete;

  // Collective. Adds the reciprocal forces on x[0, atoms) (this rank's home atoms) and returns this
  // rank's share of the reciprocal energy (kJ/mol; the sum over ranks is the energy), adding its
  // share of the virial to `virial` if given.
  double compute(const std::vector<Vec3>& x, const std::vector<double>& charges, const Vec3& box,
                 std::vector<Vec3>& forces, Mat3* virial, int atoms);

  // Bytes this rank sent to other ranks in the last compute(): the touched-plane flags, the spread
  // planes, both transposes and the potential planes sent back (its own blocks not counted).
  std::int64_t bytes_sent_last_call() const { return bytes_sent_; }

  // The grid permuted: the slab axis first.
  const std::array<int, 3>& grid() const { return grid_; }
  // This rank's planes (along the slab axis) and columns (the next axis), [begin, end).
  std::array<int, 2> owned_planes() const { return planes_[rank_]; }
  std::array<int, 2> owned_columns() const { return columns_[rank_]; }

 private:
  struct Transforms;
  void exchange_touched_planes(int atoms, const std::vector<double>& charges);
  void sum_spread_planes();
  void transpose_to_columns();
  void transpose_to_planes();
  void return_potential_planes();
  std::int64_t others_bytes(const std::vector<std::size_t>& counts) const;

  std::array<int, 3> axes_;  // the permutation: slab-frame dimension d is the box's axes_[d]
  std::array<int, 3> grid_;
  int order_;
  dist::Communicator comm_;
  int rank_ = 0, ranks_ = 1;
  std::vector<std::array<int, 2>> planes_, columns_;  // every rank's x-planes and y columns
  std::unique_ptr<PmeInfluence> influence_;
  std::unique_ptr<PmeSplines> splines_;
  std::unique_ptr<Transforms> transforms_;
  std::vector<unsigned char> touched_, all_touched_;      // this rank's and every rank's (ranks x K0)
  std::vector<int> plane_slot_;                           // global x-plane -> local buffer plane (-1: untouched)
  std::vector<double> local_;                             // the touched planes, ascending
  std::vector<double> received_, packed_;                 // exchange buffers
  std::vector<Vec3> slab_x_, slab_forces_;                // positions and forces in the slab frame
  std::vector<std::size_t> local_counts_, owned_counts_;  // doubles: local planes per owner, owned planes per sender
  // The transposes' counts in doubles, fixed by the split: my planes x each rank's columns (what the
  // transpose to columns sends), each rank's planes x my columns (what it receives).
  std::vector<std::size_t> planes_by_columns_, columns_by_planes_;
  std::int64_t bytes_sent_ = 0;
};

}  // namespace kiln::md
