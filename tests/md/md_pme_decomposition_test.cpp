// Slab-decomposed PME (pme_decomposition.h). Under mpirun -np 2, 3, 4 and 5 (CTest md_dd_mpirun_2/4,
// md_pme_mpirun_3/5)
// every rank takes a share of the 216-water box's atoms and the decomposed PME's forces on them,
// its energy and its virial (summed over the ranks) must equal one rank's Pme::compute on the whole
// box to 1e-10 relative: for slabs along x, y and z, grids whose planes do and do not divide by
// the ranks, grids with fewer planes and columns than 5 ranks (one owns neither), and atoms shared out by position
// (each rank's atoms reach a few planes, some across the periodic boundary) or interleaved (every rank reaches every
// plane). Run alone (a world of one) those skip; the plane split is checked alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "error_text.h"
#include "kiln/dist/communicator.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/hpc/md/pme.h"
#include "kiln/hpc/md/pme_decomposition.h"
#include "small_molecules.h"

namespace kiln::md {
namespace md_pme_decomposition_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
using md_test::error_of;

TEST(MdPmeDecomposition, SlabsAreCutWhereTheDomainsAre) {
  EXPECT_EQ(slab_axis_for({1, 1, 2}), 2);
  EXPECT_EQ(slab_axis_for({2, 2, 1}), 0);
  EXPECT_EQ(slab_axis_for({1, 4, 2}), 1);
  EXPECT_EQ(slab_axis_for({1, 1, 1}), 0);
  const std::string refused = error_of([] {
    SlabPme(std::array<int, 3>{8, 8, 8}, 4, 3.0, dist::Communicator::world(), 3);
  });
  EXPECT_EQ(refused.rfind("PME: slab axis 3 is not 0, 1 or 2 (x, y, z)", 0), 0u) << refused;
}

TEST(MdPmeDecomposition, PlanesSplitAsEvenlyAsPossible) {
  using Ranges = std::vector<std::array<int, 2>>;
  EXPECT_EQ(slab_ranges(48, 2), (Ranges{{0, 24}, {24, 48}}));
  EXPECT_EQ(slab_ranges(10, 4), (Ranges{{0, 3}, {3, 6}, {6, 8}, {8, 10}}));
  EXPECT_EQ(slab_ranges(25, 3), (Ranges{{0, 9}, {9, 17}, {17, 25}}));
  EXPECT_EQ(slab_ranges(3, 4), (Ranges{{0, 1}, {1, 2}, {2, 3}, {3, 3}}));  // the last rank owns none
  EXPECT_EQ(slab_ranges(0, 2), (Ranges{{0, 0}, {0, 0}}));
  EXPECT_EQ(error_of([] { slab_ranges(8, 0); }).rfind("slab_ranges: cannot split 8 items over 0 ranks", 0), 0u);
}

TEST(MdPmeDecomposition, NamesParse) {
  EXPECT_EQ(parse_pme_decomposition("slab"), PmeDecomposition::Slab);
  EXPECT_EQ(parse_pme_decomposition("replicated"), PmeDecomposition::Replicated);
  EXPECT_EQ(pme_decomposition_name(PmeDecomposition::Replicated), "replicated");
  const std::string refused = error_of([] { parse_pme_decomposition("pencil"); });
  EXPECT_EQ(refused.rfind("mdrun: --pme-decomposition pencil is not slab or replicated", 0), 0u) << refused;
}

struct Reference {
  std::vector<Vec3> forces;
  double energy = 0;
  Mat3 virial{};
};

// The sum over ranks, added in rank order.
double summed(const dist::Communicator& world, double mine) {
  std::vector<double> all(world.size());
  world.all_gather<double>(std::span<const double>(&mine, 1), all);
  double s = 0;
  for (double v : all) s += v;
  return s;
}

enum class Share { ByPosition, Interleaved };

// This rank's atoms (global indices): by position along `axis` (the rank's slab of the box: with
// few ranks its atoms' splines reach its own planes and a few more, across the periodic boundary for
// the first and last), or atom i on rank i % ranks.
std::vector<int> home_atoms(const MdrunSetup& s, Share share, int axis, int rank, int ranks) {
  std::vector<int> home;
  for (int i = 0; i < s.system.atom_count; ++i) {
    double f = s.initial.positions[i][axis] / s.initial.box[axis];
    f -= std::floor(f);
    const int owner = share == Share::Interleaved ? i % ranks : std::min(ranks - 1, static_cast<int>(f * ranks));
    if (owner == rank) home.push_back(i);
  }
  return home;
}

void expect_one_rank_pme(const MdrunSetup& s, std::array<int, 3> grid, int order, Share share, int axis) {
  const dist::Communicator world = dist::Communicator::world();
  SCOPED_TRACE(::testing::Message() << "grid " << grid[0] << "x" << grid[1] << "x" << grid[2] << ", order " << order
                                    << (share == Share::Interleaved ? ", interleaved atoms" : ", atoms by position")
                                    << ", slabs along "
                                    << "xyz"[axis] << ", " << world.size() << " ranks");
  Reference one;
  one.forces.assign(s.system.atom_count, Vec3{0, 0, 0});
  Pme whole(grid, order, s.settings.beta);
  one.energy = whole.compute(s.initial.positions, s.system.charges, s.initial.box, one.forces, &one.virial);

  const std::vector<int> home = home_atoms(s, share, axis, world.rank(), world.size());
  std::vector<Vec3> x, forces(home.size(), Vec3{0, 0, 0});
  std::vector<double> q;
  for (int i : home) {
    x.push_back(s.initial.positions[i]);
    q.push_back(s.system.charges[i]);
  }
  SlabPme slab(grid, order, s.settings.beta, world, axis);
  Mat3 virial{};
  const double energy =
      summed(world, slab.compute(x, q, s.initial.box, forces, &virial, static_cast<int>(home.size())));
  EXPECT_LE(std::abs(energy - one.energy), 1e-10 * std::abs(one.energy)) << energy << " vs one rank " << one.energy;

  double largest_force = 0, largest_virial = 0;
  for (const Vec3& f : one.forces)
    for (int d = 0; d < 3; ++d) largest_force = std::max(largest_force, std::abs(f[d]));
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) largest_virial = std::max(largest_virial, std::abs(one.virial[r][c]));
  // The half-complex axis is z on one rank and the slab frame's third axis here (x for y-slabs, y
  // for z-slabs). An even grid's Nyquist point +K/2 stands for -K/2 too, and the two pairings of m
  // with -m then count its off-diagonal terms m_r m_s with other signs: only the diagonal (the
  // pressure's trace) is the same whatever the axis; with odd sizes (no Nyquist point) or x-slabs,
  // every component is.
  const bool odd = grid[0] % 2 && grid[1] % 2 && grid[2] % 2;
  for (int r = 0; r < 3; ++r)
    for (int c = 0; c < 3; ++c) {
      const double w = summed(world, virial[r][c]);
      if (r != c && axis != 0 && !odd) continue;
      EXPECT_LE(std::abs(w - one.virial[r][c]), 1e-10 * largest_virial)
          << "virial " << r << c << ": " << w << " vs one rank " << one.virial[r][c];
    }
  ASSERT_GT(largest_force, 0);
  double worst = 0;
  int worst_atom = -1;
  for (std::size_t k = 0; k < home.size(); ++k)
    for (int d = 0; d < 3; ++d) {
      const double diff = std::abs(forces[k][d] - one.forces[home[k]][d]);
      if (diff > worst) worst = diff, worst_atom = home[k];
    }
  EXPECT_LE(worst, 1e-10 * largest_force) << "atom " << worst_atom << " (largest force " << largest_force << ")";
  // Every atom's force came from exactly one rank.
  EXPECT_EQ(summed(world, static_cast<double>(home.size())), s.system.atom_count);
}

TEST(MdPmeDecomposition, ForcesEnergyAndVirialEqualOneRank) {
  const dist::Communicator world = dist::Communicator::world();
  if (world.size() == 1) GTEST_SKIP() << "needs mpirun -np 2 to 5 (ctest: md_dd_mpirun_2/4, md_pme_mpirun_3/5)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdrunSetup s = prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "nve.mdp");
  for (Share share : {Share::ByPosition, Share::Interleaved})
    for (int axis = 0; axis < 3; ++axis) {
      expect_one_rank_pme(s, s.settings.pme_grid, s.settings.mdp.pme_order, share, axis);  // the .mdp's grid
      // Odd sizes, each axis a different one: planes and columns split unevenly, every virial component.
      expect_one_rank_pme(s, {25, 15, 19}, 5, share, axis);
      expect_one_rank_pme(s, {25, 14, 19}, 5, share, axis);
    }
  // Under -np 5, 4 planes and 4 columns: rank 4 owns neither.
  expect_one_rank_pme(s, {4, 4, 6}, 3, Share::ByPosition, 0);
  expect_one_rank_pme(s, {6, 4, 4}, 3, Share::Interleaved, 1);
}

// A rank with no home atoms (all on rank 0) still takes its part in the transform.
TEST(MdPmeDecomposition, RanksWithoutAtomsTakePart) {
  const dist::Communicator world = dist::Communicator::world();
  if (world.size() == 1) GTEST_SKIP() << "needs mpirun -np 2 to 5 (ctest: md_dd_mpirun_2/4, md_pme_mpirun_3/5)";
  if (!md_test::have_force_fields()) GTEST_SKIP() << "gromacs-data is not installed";
  const MdrunSetup s = prepare_mdrun("/usr/share/gromacs/top/spc216.gro", kData / "topol.top", kData / "nve.mdp");
  std::vector<Vec3> one_forces(s.system.atom_count, Vec3{0, 0, 0});
  Pme whole(s.settings.pme_grid, s.settings.mdp.pme_order, s.settings.beta);
  const double one = whole.compute(s.initial.positions, s.system.charges, s.initial.box, one_forces);
  SlabPme slab(s.settings.pme_grid, s.settings.mdp.pme_order, s.settings.beta, world);
  std::vector<Vec3> forces(s.system.atom_count, Vec3{0, 0, 0});
  const int atoms = world.rank() == 0 ? s.system.atom_count : 0;
  const double energy =
      summed(world, slab.compute(s.initial.positions, s.system.charges, s.initial.box, forces, nullptr, atoms));
  EXPECT_LE(std::abs(energy - one), 1e-10 * std::abs(one));
  if (world.rank() == 0) {
    double largest = 0, worst = 0;
    for (int i = 0; i < s.system.atom_count; ++i)
      for (int d = 0; d < 3; ++d) {
        largest = std::max(largest, std::abs(one_forces[i][d]));
        worst = std::max(worst, std::abs(forces[i][d] - one_forces[i][d]));
      }
    EXPECT_LE(worst, 1e-10 * largest);
  } else {
    EXPECT_GT(slab.bytes_sent_last_call(), 0) << "its planes' transforms and potential went to the others";
  }
}

}  // namespace md_pme_decomposition_test
}  // namespace kiln::md
