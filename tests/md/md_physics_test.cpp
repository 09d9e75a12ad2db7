// kiln mdrun's physics against independent references: PME's reciprocal energy and forces
// against the plain Ewald sum, all forces against finite differences of the energy, the cell-grid
// pair list against the all-pairs one (a 2x2x2 replica has exactly 8 times the energies), SETTLE's
// geometry, and GROMACS's beta and grid sizes.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <complex>
#include <filesystem>
#include <fstream>
#include <numbers>
#include <random>

#include "gromacs_data.h"
#include "kiln/hpc/md/cpu_engine.h"
#include "kiln/hpc/md/ewald_parameters.h"
#include "kiln/hpc/md/gro_file.h"
#include "kiln/hpc/md/mdrun.h"
#include "kiln/hpc/md/pme.h"
#include "kiln/hpc/md/settle.h"
#include "kiln/hpc/md/topology.h"
#include "kiln/hpc/md/units.h"

namespace kiln::md {
namespace md_physics_test {

namespace fs = std::filesystem;
const fs::path kData = fs::path(KILN_SOURCE_DIR) / "tests/md/data";
const fs::path kSpc216 = kiln::md_test::gromacs_top() / "spc216.gro";

bool have_gromacs_data() { return fs::exists(kSpc216) && fs::exists(kiln::md_test::gromacs_top() / "oplsaa.ff"); }

TEST(EwaldParameters, BetaAndGridAsGromacs) {
  double beta = ewald_coefficient(1.0, 1e-5);
  EXPECT_NEAR(std::erfc(beta * 1.0), 1e-5, 1e-12);
  EXPECT_NEAR(beta, 3.12341, 1e-5);  // grompp's value for rc = 1 nm, ewald-rtol 1e-5
  EXPECT_EQ(pme_grid_size({1.86206, 1.86206, 1.86206}, 0.12, 4, {0, 0, 0}), (std::array<int, 3>{16, 16, 16}));
  EXPECT_EQ(pme_grid_size({3.72412, 7.5, 12.0}, 0.12, 4, {0, 0, 0}), (std::array<int, 3>{32, 64, 100}));
  EXPECT_EQ(pme_grid_size({10.0, 0.5, 1.0}, 0.12, 4, {0, 0, 20}), (std::array<int, 3>{84, 6, 20}));
}

// Reciprocal Ewald energy and forces by the direct sum over k-vectors (no mesh).
double ewald_reciprocal(const std::vector<Vec3>& x, const std::vector<double>& q, const Vec3& box, double beta,
                        int kmax, std::vector<Vec3>& forces) {
  const double volume = box[0] * box[1] * box[2];
  double energy = 0;
  forces.assign(x.size(), Vec3{0, 0, 0});
  for (int a = -kmax; a <= kmax; ++a)
    for (int b = -kmax; b <= kmax; ++b)
      for (int c = -kmax; c <= kmax; ++c) {
        if (a == 0 && b == 0 && c == 0) continue;
        Vec3 m{a / box[0], b / box[1], c / box[2]};
        double m2 = dot(m, m);
        double pref = kCoulombFactor / (2 * std::numbers::pi * volume) *
                      std::exp(-std::numbers::pi * std::numbers::pi * m2 / (beta * beta)) / m2;
        std::complex<double> s = 0;
        for (size_t i = 0; i < x.size(); ++i) s += q[i] * std::polar(1.0, 2 * std::numbers::pi * dot(m, x[i]));
        energy += pref * std::norm(s);
        for (size_t i = 0; i < x.size(); ++i) {
          // dE/dx_i = pref * 2 Re(conj(S) q_i i 2 pi m e^{i 2 pi m x_i})
          std::complex<double> e = std::polar(1.0, 2 * std::numbers::pi * dot(m, x[i]));
          double g = 2 * pref * q[i] * 2 * std::numbers::pi * std::real(std::conj(s) * std::complex<double>(0, 1) * e);
          forces[i] -= g * m;
        }
      }
  return energy;
}

TEST(Pme, MatchesTheEwaldSum) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0, 1);
  Vec3 box{2.1, 2.4, 2.0};
  const int n = 40;
  std::vector<Vec3> x(n);
  std::vector<double> q(n);
  for (int i = 0; i < n; ++i) {
    for (int k = 0; k < 3; ++k) x[i][k] = u(rng) * box[k];
    q[i] = (i % 2 ? 1 : -1) * (0.2 + u(rng));
  }
  double total = 0;
  for (double v : q) total += v;
  q[0] -= total;  // neutral
  const double beta = 3.0;
  std::vector<Vec3> f_ref;
  double e_ref = ewald_reciprocal(x, q, box, beta, 12, f_ref);
  for (int order : {4, 5, 6}) {
    // A fine grid: the mesh error falls far below the tolerance.
    Pme pme({48, 48, 48}, order, beta);
    std::vector<Vec3> f(n, Vec3{0, 0, 0});
    double e = pme.compute(x, q, box, f);
    // Order 4 interpolates less accurately than 5 and 6 on the same grid.
    const double tolerance = order == 4 ? 5e-5 : 1e-5;
    EXPECT_NEAR(e, e_ref, tolerance * std::abs(e_ref)) << "order " << order;
    double fmax = 0, err = 0;
    for (int i = 0; i < n; ++i) {
      fmax = std::max(fmax, norm(f_ref[i]));
      err = std::max(err, norm(f[i] - f_ref[i]));
    }
    EXPECT_LT(err, 10 * tolerance * fmax) << "order " << order;
  }
  // At GROMACS's default spacing (0.12 nm, order 4) the error is PME's usual ~1e-3 relative.
  Pme coarse(pme_grid_size(box, 0.12, 4, {0, 0, 0}), 4, beta);
  std::vector<Vec3> f(n, Vec3{0, 0, 0});
  EXPECT_NEAR(coarse.compute(x, q, box, f), e_ref, 5e-3 * std::abs(e_ref));
}

struct Spc216 {
  MdrunSetup setup;
  Spc216(const std::string& mdp = "step0.mdp") : setup(prepare_mdrun(kSpc216, kData / "topol.top", kData / mdp)) {}
};

class ForcesAreMinusTheEnergyGradient : public ::testing::TestWithParam<const char*> {};

TEST_P(ForcesAreMinusTheEnergyGradient, AtFiveAtoms) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  Spc216 w(GetParam());
  auto& s = w.setup;
  // Keep the pair list from the start: the displaced positions below stay inside its buffer.
  CpuForceField ff(s.system, s.settings);
  auto x = s.initial.positions;
  ff.build_pair_list(x, s.initial.box);
  std::vector<Vec3> f;
  StepEnergies e;
  ff.compute(x, s.initial.box, f, e);
  const double h = 1e-6;
  for (int atom : {0, 1, 2, 300, 647}) {
    for (int k = 0; k < 3; ++k) {
      std::vector<Vec3> scratch;
      StepEnergies ep, em;
      auto xp = x, xm = x;
      xp[atom][k] += h;
      xm[atom][k] -= h;
      ff.compute(xp, s.initial.box, scratch, ep);
      ff.compute(xm, s.initial.box, scratch, em);
      double numeric = -(ep.potential - em.potential) / (2 * h);
      EXPECT_NEAR(f[atom][k], numeric, 1e-3 * std::max(1.0, std::abs(numeric))) << "atom " << atom << " dim " << k;
    }
  }
}

// PME with flexible water (bonds and angles too), and reaction-field with rigid water.
INSTANTIATE_TEST_SUITE_P(Electrostatics, ForcesAreMinusTheEnergyGradient,
                         ::testing::Values("step0_flexible.mdp", "step0_reaction_field.mdp"));

TEST(CpuForceField, VirialIsMinusTheStrainDerivative) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  Spc216 w("step0_flexible.mdp");
  auto& s = w.setup;
  CpuForceField ff(s.system, s.settings);
  const auto& x = s.initial.positions;
  const Vec3 box = s.initial.box;
  ff.build_pair_list(x, box);
  std::vector<Vec3> f;
  StepEnergies e;
  ff.compute(x, box, f, e);
  const Mat3 virial = ff.virial();
  // Stretch coordinates and box along one axis by 1 +- h: W_dd = -dE/dlambda_d (flexible water,
  // so every atom moves; the pair list from the start still holds every pair within the cut-off).
  const double h = 1e-6;
  for (int d = 0; d < 3; ++d) {
    double energies[2];
    for (int sign = 0; sign < 2; ++sign) {
      double lambda = sign == 0 ? 1 + h : 1 - h;
      auto xs = x;
      for (auto& p : xs) p[d] *= lambda;
      Vec3 bs = box;
      bs[d] *= lambda;
      StepEnergies es;
      ff.compute(xs, bs, f, es);
      energies[sign] = es.potential;
    }
    double numeric = -(energies[0] - energies[1]) / (2 * h);
    EXPECT_NEAR(virial[d][d], numeric, 1e-5 * std::abs(numeric) + 1e-2) << "dimension " << d;
  }
}

TEST(CpuForceField, ThreadsGiveTheSameForcesAndEnergies) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  Spc216 w;
  auto& s = w.setup;
  std::vector<Vec3> f1, f3;
  StepEnergies e1, e3;
  CpuForceField one(s.system, s.settings);
  one.build_pair_list(s.initial.positions, s.initial.box);
  one.compute(s.initial.positions, s.initial.box, f1, e1);
  EngineSettings threaded = s.settings;
  threaded.threads = 3;
  CpuForceField three(s.system, threaded);
  three.build_pair_list(s.initial.positions, s.initial.box);
  three.compute(s.initial.positions, s.initial.box, f3, e3);
  // Only the order of the additions differs.
  EXPECT_NEAR(e3.lj, e1.lj, 1e-11 * std::abs(e1.lj));
  EXPECT_NEAR(e3.coulomb_sr, e1.coulomb_sr, 1e-11 * std::abs(e1.coulomb_sr));
  for (size_t i = 0; i < f1.size(); ++i)
    for (int k = 0; k < 3; ++k) EXPECT_NEAR(f3[i][k], f1[i][k], 1e-9 * (1 + std::abs(f1[i][k])));
  for (int a = 0; a < 3; ++a)
    for (int b = 0; b < 3; ++b)
      EXPECT_NEAR(three.virial()[a][b], one.virial()[a][b], 1e-9 * (1 + std::abs(one.virial()[a][b])));
}

TEST(CpuForceField, ReplicatedBoxHasEightTimesTheEnergies) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  // pme-order 4: with odd orders the B-spline modulus vanishes at the Nyquist frequency and is
  // replaced by its neighbours' mean (as GROMACS and OpenMM do), which differs between the grids.
  Spc216 w("nve.mdp");
  auto& s = w.setup;
  EXPECT_FALSE([&] {
    PairList l;
    l.build(s.system, s.initial.positions, s.initial.box, s.settings.rlist);
    return l.used_cell_grid();
  }());
  CpuForceField ff(s.system, s.settings);
  ff.build_pair_list(s.initial.positions, s.initial.box);
  std::vector<Vec3> f;
  StepEnergies one;
  ff.compute(s.initial.positions, s.initial.box, f, one);
  // 2x2x2 copies (gmx genconf -nbox 2 2 2): the same periodic system, so with the grid doubled
  // too every term is exactly 8 times; this one goes through the cell grid.
  MdSystem big;
  TopologyOptions topts;
  std::string top = (fs::temp_directory_path() / fmt::format("kiln_md_big_{}.top", ::getpid())).string();
  {
    std::ofstream out(top);
    out << "#include \"oplsaa.ff/forcefield.itp\"\n#include \"oplsaa.ff/spc.itp\"\n[ system ]\nbig\n[ molecules ]\n"
           "SOL 1728\n";
  }
  big = read_topology(top);
  fs::remove(top);
  std::vector<Vec3> x;
  Vec3 box = s.initial.box;
  for (int a = 0; a < 2; ++a)
    for (int b = 0; b < 2; ++b)
      for (int c = 0; c < 2; ++c)
        for (const auto& p : s.initial.positions)
          x.push_back({p[0] + a * box[0], p[1] + b * box[1], p[2] + c * box[2]});
  Vec3 big_box = 2.0 * box;
  EngineSettings settings = s.settings;
  settings.pme_grid = {2 * s.settings.pme_grid[0], 2 * s.settings.pme_grid[1], 2 * s.settings.pme_grid[2]};
  CpuForceField big_ff(big, settings);
  big_ff.build_pair_list(x, big_box);
  EXPECT_TRUE(big_ff.pair_list().used_cell_grid());
  EXPECT_EQ(big_ff.pair_list().pair_count(), 8 * ff.pair_list().pair_count());
  StepEnergies eight;
  big_ff.compute(x, big_box, f, eight);
  EXPECT_NEAR(eight.lj, 8 * one.lj, 1e-9 * std::abs(8 * one.lj));
  EXPECT_NEAR(eight.coulomb_sr, 8 * one.coulomb_sr, 1e-9 * std::abs(8 * one.coulomb_sr));
  EXPECT_NEAR(eight.coulomb_recip, 8 * one.coulomb_recip, 1e-8 * std::abs(8 * one.coulomb_recip));
}

TEST(Settle, RestoresTheWaterGeometryAndKeepsTheCentreOfMass) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  Spc216 w;
  auto& s = w.setup;
  const Vec3 box = s.initial.box;
  // Constrain the start first (.gro's 3 decimals are off by ~1e-3 nm), then kick every atom.
  auto ref = s.initial.positions;
  settle_positions(s.system, s.initial.positions, ref, box);
  std::mt19937 rng(11);
  std::normal_distribution<double> kick(0.0, 0.003);
  auto x = ref;
  for (auto& p : x)
    for (double& c : p) c += kick(rng);
  auto unconstrained = x;
  settle_positions(s.system, ref, x, box);
  for (const auto& water : s.system.settles) {
    int o = water.o;
    EXPECT_NEAR(norm(min_image(x[o + 1] - x[o], box)), water.d_oh, 1e-10);
    EXPECT_NEAR(norm(min_image(x[o + 2] - x[o], box)), water.d_oh, 1e-10);
    EXPECT_NEAR(norm(min_image(x[o + 2] - x[o + 1], box)), water.d_hh, 1e-10);
    Vec3 shift{0, 0, 0};
    for (int a = 0; a < 3; ++a) shift += s.system.masses[o + a] * (x[o + a] - unconstrained[o + a]);
    EXPECT_LT(norm(shift), 1e-12);  // constraint forces are internal: the centre of mass stays
  }
}

TEST(Settle, ConstraintVirialCancelsTheIntramolecularForceVirial) {
  if (!have_gromacs_data()) GTEST_SKIP() << "gromacs-data is not installed";
  Spc216 w("nve.mdp");
  auto& s = w.setup;
  const Vec3 box = s.initial.box;
  const double dt = s.settings.mdp.dt;
  // A constrained x(t) and a velocity v- consistent with the constraints (x - dt v- constrained).
  auto x = s.initial.positions;
  settle_positions(s.system, s.initial.positions, x, box);
  auto back = x;
  for (size_t i = 0; i < x.size(); ++i) back[i] = x[i] - dt * s.initial.velocities[i];
  settle_positions(s.system, x, back, box);
  std::vector<Vec3> v_minus(x.size());
  for (size_t i = 0; i < x.size(); ++i) v_minus[i] = (1 / dt) * (x[i] - back[i]);
  CpuForceField ff(s.system, s.settings);
  ff.build_pair_list(x, box);
  std::vector<Vec3> f;
  StepEnergies e;
  ff.compute(x, box, f, e);
  std::vector<Vec3> unconstrained(x.size()), constrained;
  for (size_t i = 0; i < x.size(); ++i) unconstrained[i] = x[i] + dt * (v_minus[i] + (dt / s.system.masses[i]) * f[i]);
  constrained = unconstrained;
  settle_positions(s.system, x, constrained, box);
  Mat3 wc = settle_virial(s.system, x, unconstrained, constrained, box, dt);
  // For rigid bodies and leap-frog, exactly: sum_i (r_i - R).(F_i + Fc_i) = -(1/2) sum_i m_i
  // (|v+_i - V+|^2 + |v-_i - V-|^2), twice the mean rotational kinetic energy of the half steps.
  double lhs = wc[0][0] + wc[1][1] + wc[2][2], rhs = 0;
  for (const auto& water : s.system.settles) {
    const int o = water.o;
    double mass = 0;
    Vec3 com{0, 0, 0}, vp{0, 0, 0}, vm{0, 0, 0};
    std::array<Vec3, 3> rel, plus;
    for (int a = 0; a < 3; ++a) {
      double m = s.system.masses[o + a];
      rel[a] = min_image(x[o + a] - x[o], box);
      plus[a] = (1 / dt) * (constrained[o + a] - x[o + a]);
      mass += m;
      com += m * rel[a];
      vp += m * plus[a];
      vm += m * v_minus[o + a];
    }
    com = (1 / mass) * com;
    vp = (1 / mass) * vp;
    vm = (1 / mass) * vm;
    for (int a = 0; a < 3; ++a) {
      double m = s.system.masses[o + a];
      lhs += dot(rel[a] - com, f[o + a]);
      rhs -= 0.5 * m * (dot(plus[a] - vp, plus[a] - vp) + dot(v_minus[o + a] - vm, v_minus[o + a] - vm));
    }
  }
  EXPECT_NEAR(lhs, rhs, 1e-6 * std::abs(rhs)) << "constraint virial trace " << wc[0][0] + wc[1][1] + wc[2][2];
}

}  // namespace md_physics_test
}  // namespace kiln::md
