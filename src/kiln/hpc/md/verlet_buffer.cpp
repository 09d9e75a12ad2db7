#include "kiln/hpc/md/verlet_buffer.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numbers>
#include <tuple>

#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

constexpr double kPi = std::numbers::pi;
constexpr double kResolution = 0.001;  // nm: GROMACS's buffer resolution

// V, -V', V'' and -V''' of a pair potential at the cut-off.
struct Derivatives {
  double pot = 0, md1 = 0, d2 = 0, md3 = 0;
};

// What moves an atom and what it interacts with: atoms equal in all of these contribute alike.
struct AtomKind {
  double mass = 0;
  int type = 0;
  double charge = 0;
  double con_mass = 0;  // the heaviest atom it is constrained to (0: none)
  double con_len = 0;   // that constraint's length
  bool constrained() const { return con_mass > 0; }
  auto key() const { return std::tie(mass, type, charge, con_mass, con_len); }
  bool operator<(const AtomKind& o) const { return key() < o.key(); }
};

std::vector<std::pair<AtomKind, long long>> atom_kinds(const MdSystem& s) {
  std::vector<AtomKind> kind(s.atom_count);
  for (int i = 0; i < s.atom_count; ++i) kind[i] = {s.masses[i], s.types[i], s.charges[i], 0, 0};
  // One constraint per atom counts, the one to its heaviest partner, and only a partner heavier
  // than the atom itself: the lighter atom rotates about the pair's centre of mass, the heavier one
  // moves nearly freely. This is what reproduces GROMACS 2022's grompp on SPC water, with SETTLE
  // and with LINCS h-bond constraints alike (the oxygen counts as free in both).
  auto add = [&](int a, int b, double length) {
    if (s.masses[b] > s.masses[a] && s.masses[b] > kind[a].con_mass) {
      kind[a].con_mass = s.masses[b];
      kind[a].con_len = length;
    }
  };
  for (const auto& c : s.constraints) {
    add(c.i, c.j, c.length);
    add(c.j, c.i, c.length);
  }
  for (const auto& w : s.settles)
    for (int h : {w.o + 1, w.o + 2}) {
      add(w.o, h, w.d_oh);
      add(h, w.o, w.d_oh);
    }
  std::map<AtomKind, long long> counts;
  for (int i = 0; i < s.atom_count; ++i)
    if (kind[i].mass > 0) ++counts[kind[i]];
  return {counts.begin(), counts.end()};
}

// Displacement variances of an atom over the list lifetime (kt_fac = kT t^2): in 2D from rotating
// about its constraint partner, in 3D with their centre of mass (or freely, unconstrained).
void atom_sigma2(double kt_fac, const AtomKind& k, double& s2_2d, double& s2_3d) {
  if (!k.constrained()) {
    s2_2d = 0;
    s2_3d = kt_fac / k.mass;
    return;
  }
  const double mass_fraction = k.con_mass / (k.mass + k.con_mass);
  const double sigma2_rot = kt_fac * mass_fraction / k.mass;
  const double arm = k.con_len * mass_fraction;  // distance to the pair's centre of mass
  // The mean squared chord of a rotation with Gaussian angle, relative to the arm, approximated by
  // a rational function of the angle variance that never underestimates it (constant beyond its
  // maximum), as GROMACS.
  constexpr double a = 1.0 / 3.0, b = 2.0 / 45.0;
  const double rel = std::min(sigma2_rot / (arm * arm), 1 / std::sqrt(b));
  s2_2d = arm * arm * rel / (1 + a * rel + b * rel * rel);
  s2_3d = kt_fac / (k.mass + k.con_mass);
}

// A 2-DOF displacement distribution bounded by a shifted, scaled Gaussian matched at x.
void approx_2dof(double s2, double x, double& shift, double& scale) {
  const double ex = std::exp(-x * x / (2 * s2));
  const double er = std::erfc(x / std::sqrt(2 * s2));
  shift = -x + std::sqrt(2 * s2 / kPi) * ex / er;
  scale = 0.5 * kPi * std::exp(ex * ex / (kPi * er * er)) * er;
}

// The energy error of one atom pair (per unit of linear density) whose Gaussian relative
// displacement (variance s2) carries it from beyond the buffer into the potential.
double pair_drift(bool ci, bool cj, double s2, double s2i_2d, double s2j_2d, double buffer, const Derivatives& d) {
  constexpr double kErfcArgMax = 8.0;  // erfc(8) = 1e-29: beyond it the pair does not count
  double rsh = buffer, sc = 1.0, c_exp = 0, c_erfc = 0;
  if (rsh * rsh <= 2 * s2 * kErfcArgMax * kErfcArgMax) {
    if (ci) {
      double sh, f;
      approx_2dof(s2i_2d, buffer * s2i_2d / s2, sh, f);
      rsh += sh;
      sc *= f;
    }
    if (cj) {
      double sh, f;
      approx_2dof(s2j_2d, buffer * s2j_2d / s2, sh, f);
      rsh += sh;
      sc *= f;
    }
    c_exp = std::exp(-rsh * rsh / (2 * s2)) / std::sqrt(2 * kPi);
    c_erfc = 0.5 * std::erfc(rsh / std::sqrt(2 * s2));
  }
  const double s = std::sqrt(s2), r2 = rsh * rsh;
  const double p0 = sc * d.pot * (s * c_exp - rsh * c_erfc);
  const double p1 = sc * d.md1 / 2 * ((r2 + s2) * c_erfc - rsh * s * c_exp);
  const double p2 = sc * d.d2 / 6 * (s * (r2 + 2 * s2) * c_exp - rsh * (r2 + 3 * s2) * c_erfc);
  const double p3 =
      sc * d.md3 / 24 * ((r2 * r2 + 6 * r2 * s2 + 3 * s2 * s2) * c_erfc - rsh * s * (r2 + 5 * s2) * c_exp);
  return p0 + p1 + p2 + p3;
}

// The fraction of atom pairs just beyond rlist that a list of clusters of this size leaves out
// (GROMACS's surface_frac: particles at HCP distance, a tetrahedron for 4).
double surface_fraction(int cluster_size, double particle_distance, double rlist) {
  if (rlist < 0.5 * particle_distance) return 1.0;
  const double d = 0.5 * particle_distance / rlist;
  double area = 1.0;
  if (cluster_size == 2) {
    area = 1.0 + d;
  } else if (cluster_size == 4) {
    area =
        1.0 + 1 / kPi *
                  (6 * std::acos(1 / std::sqrt(3.0)) * d +
                   std::sqrt(3.0) * d * d *
                       (1.0 + 5.0 / 18.0 * d * d + 7.0 / 45.0 * d * d * d * d + 83.0 / 756.0 * d * d * d * d * d * d));
  }
  return area / cluster_size;
}

struct Potentials {
  Derivatives lj_disp, lj_rep, elec;
};

Potentials potentials(const VerletBufferInput& in) {
  Potentials p;
  const double rc = in.cutoff;
  // LJ with potential-shift: the derivatives of -r^-6 and r^-12 (the shift is a constant).
  p.lj_disp.md1 = -6 * std::pow(rc, -7.0);
  p.lj_disp.d2 = 7 * p.lj_disp.md1 / rc;
  p.lj_disp.md3 = 8 * p.lj_disp.d2 / rc;
  p.lj_rep.md1 = 12 * std::pow(rc, -13.0);
  p.lj_rep.d2 = 13 * p.lj_rep.md1 / rc;
  p.lj_rep.md3 = 14 * p.lj_rep.d2 / rc;
  const double f = kCoulombFactor;  // epsilon-r = 1
  if (in.reaction_field) {
    const double k_rf =
        in.epsilon_rf == 0 ? 0.5 / (rc * rc * rc) : (in.epsilon_rf - 1) / (rc * rc * rc * (2 * in.epsilon_rf + 1));
    if (in.epsilon_rf > 0) p.elec.md1 = f * (1.0 / (rc * rc) - 2 * k_rf * rc);
    p.elec.d2 = f * (2.0 / (rc * rc * rc) + 2 * k_rf);
  } else {
    const double b = in.beta, br = b * rc, two_over_sqrt_pi = 2 / std::sqrt(kPi);
    p.elec.md1 = f * (b * std::exp(-br * br) * two_over_sqrt_pi / rc + std::erfc(br) / (rc * rc));
    p.elec.d2 =
        f / (rc * rc) * (2 * b * (1 + br * br) * std::exp(-br * br) * two_over_sqrt_pi + 2 * std::erfc(br) / rc);
  }
  return p;
}

// The estimated drift (kJ/mol per list lifetime, summed unsigned over kind pairs) at rlist.
double system_drift(const MdSystem& s, const std::vector<std::pair<AtomKind, long long>>& kinds, const Potentials& pot,
                    double kt_fac, double cutoff, double rlist, double volume) {
  if (kt_fac == 0) return 0;
  double total = 0;
  for (std::size_t i = 0; i < kinds.size(); ++i) {
    const AtomKind& ki = kinds[i].first;
    double s2i_2d, s2i_3d;
    atom_sigma2(kt_fac, ki, s2i_2d, s2i_3d);
    for (std::size_t j = i; j < kinds.size(); ++j) {
      const AtomKind& kj = kinds[j].first;
      double s2j_2d, s2j_3d;
      atom_sigma2(kt_fac, kj, s2j_2d, s2j_3d);
      const double s2 = s2i_2d + s2i_3d + s2j_2d + s2j_3d;
      const double c6 = s.c6[ki.type * s.type_count + kj.type], c12 = s.c12[ki.type * s.type_count + kj.type];
      Derivatives lj{c6 * pot.lj_disp.pot + c12 * pot.lj_rep.pot, c6 * pot.lj_disp.md1 + c12 * pot.lj_rep.md1,
                     c6 * pot.lj_disp.d2 + c12 * pot.lj_rep.d2, c6 * pot.lj_disp.md3 + c12 * pot.lj_rep.md3};
      const double qq = ki.charge * kj.charge;
      Derivatives elec{pot.elec.pot * qq, pot.elec.md1 * qq, pot.elec.d2 * qq, 0};
      double e = pair_drift(ki.constrained(), kj.constrained(), s2, s2i_2d, s2j_2d, rlist - cutoff, lj) +
                 pair_drift(ki.constrained(), kj.constrained(), s2, s2i_2d, s2j_2d, rlist - cutoff, elec);
      const double ni = static_cast<double>(kinds[i].second), nj = static_cast<double>(kinds[j].second);
      e *= i == j ? ni * (ni - 1) / 2 : ni * nj;
      // The pairs at distance r per unit length: 4 pi r^2 / V, r about rlist + sigma.
      e *= 4 * kPi * (rlist + std::sqrt(s2)) * (rlist + std::sqrt(s2)) / volume;
      total += std::abs(e);
    }
  }
  return total;
}

}  // namespace

double verlet_buffer_rlist(const MdSystem& s, const VerletBufferInput& in, int nstlist, int lifetime,
                           int cluster_size) {
  KILN_CHECK(in.tolerance > 0, "verlet-buffer-tolerance {} is not positive", in.tolerance);
  KILN_CHECK(cluster_size == 1 || cluster_size == 2 || cluster_size == 4, "cluster size {} (1, 2 or 4)", cluster_size);
  const auto kinds = atom_kinds(s);
  const Potentials pot = potentials(in);
  const double t = lifetime * in.dt;
  const double kt_fac = kBoltzmann * in.temperature * t * t;
  // HCP packing at the mean density: the largest distance between neighbours, the worst case.
  const double particle_distance = std::cbrt(in.volume * std::sqrt(2.0) / s.atom_count);
  double max_inv_mass = 0;
  for (const auto& [k, n] : kinds) max_inv_mass = std::max(max_inv_mass, 1 / k.mass);
  // Bisection on the buffer in steps of the resolution; the drift is negligible at 5 sigma.
  int lo = -1, hi = static_cast<int>(5 * 2 * std::sqrt(kt_fac * max_inv_mass) / kResolution) + 1;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    const double rl = in.cutoff + mid * kResolution;
    double drift = system_drift(s, kinds, pot, kt_fac, in.cutoff, rl, in.volume);
    drift *=
        surface_fraction(cluster_size, particle_distance, rl) * surface_fraction(cluster_size, particle_distance, rl);
    drift /= nstlist * in.dt * s.atom_count;  // per atom and ps
    if (std::abs(drift) > in.tolerance)
      lo = mid;
    else
      hi = mid;
  }
  return in.cutoff + hi * kResolution;
}

PairListPlan plan_pair_lists(const MdSystem& s, const VerletBufferInput& in, int mdp_nstlist, const Vec3& box, bool gpu,
                             int nstlist_override, bool dynamic_pruning) {
  PairListPlan plan;
  plan.nstlist = nstlist_override > 0 ? nstlist_override : mdp_nstlist;
  plan.rlist = verlet_buffer_rlist(s, in, plan.nstlist, plan.nstlist - 1);
  const double max_rlist = 0.5 * std::min({box[0], box[1], box[2]});
  // GROMACS's increaseNstlist: the largest nstlist of {20, 25, 40, 50, 80, 100} whose list is at
  // most a factor (1.25 on the CPU, 1.4 on a GPU, plus 0.1) larger than nstlist 10's, counting the
  // volume the clusters add beyond rlist (4 atoms in i, 4 in j).
  constexpr int kTry[] = {20, 25, 40, 50, 80, 100};
  if (nstlist_override <= 0 && mdp_nstlist > 1 && mdp_nstlist < kTry[std::size(kTry) - 1]) {
    const double factor_ok = gpu ? 1.4 : 1.25, factor_max = factor_ok + 0.1;
    const double rlist_ref = verlet_buffer_rlist(s, in, 10, 9);
    const double density = s.atom_count / in.volume;
    const double inc = 0.6 * std::cbrt(3 / density + 3 / density);
    const double rlist_ok = (rlist_ref + inc) * std::cbrt(factor_ok) - inc;
    const double rlist_max = (rlist_ref + inc) * std::cbrt(factor_max) - inc;
    std::size_t k = 0;
    while (k < std::size(kTry) && mdp_nstlist >= kTry[k]) ++k;
    int chosen = mdp_nstlist;
    double chosen_rlist = plan.rlist;
    for (; k < std::size(kTry); ++k) {
      const double r = verlet_buffer_rlist(s, in, kTry[k], kTry[k] - 1);
      if (r >= max_rlist || r > rlist_max) break;
      chosen = kTry[k];
      chosen_rlist = r;
      if (r >= rlist_ok) break;
    }
    if (chosen != mdp_nstlist)
      plan.log.push_back(fmt::format("Changing nstlist from {} to {}, rlist from {:g} to {:g}", mdp_nstlist, chosen,
                                     in.cutoff, chosen_rlist));
    plan.nstlist = chosen;
    plan.rlist = chosen_rlist;
  }
  plan.rlist_inner = plan.rlist;
  // GROMACS's dynamic pruning: the shortest prune interval (from 4 steps, in steps of the rolling
  // interval 2 on a GPU) whose inner list needs a buffer at all; pruning is kept when that list is
  // at least 3% smaller than the outer one and is pruned before the outer list expires. On the GPU
  // the inner list lives nstlist_prune steps (pruned on one step's positions for the next ones).
  if (dynamic_pruning && plan.nstlist > 1) {
    const int step = gpu ? 2 : 1;
    int tuned = gpu ? 4 : 5;
    do {
      plan.nstlist_prune = tuned;
      plan.rlist_inner = verlet_buffer_rlist(s, in, tuned, tuned - (gpu ? 0 : 1));
      tuned += step;
    } while (tuned < plan.nstlist && plan.rlist_inner == in.cutoff);
    const double inc = 0.6 * std::cbrt(6 / (s.atom_count / in.volume));
    plan.dynamic_pruning = plan.rlist_inner + inc < 0.99 * (plan.rlist + inc) && plan.nstlist_prune < plan.nstlist - 1;
  }
  if (plan.dynamic_pruning) {
    plan.rolling_parts = gpu ? std::max(1, plan.nstlist_prune / 2) : 1;
    plan.log.push_back(fmt::format(
        "Using a dual 8x8 pair-list setup updated with dynamic{} pruning:\n  outer list: updated every {} steps, "
        "buffer {:.3f} nm, rlist {:.3f} nm\n  inner list: updated every {} steps, buffer {:.3f} nm, rlist {:.3f} nm",
        plan.rolling_parts > 1 ? ", rolling" : "", plan.nstlist, plan.rlist - in.cutoff, plan.rlist, plan.nstlist_prune,
        plan.rlist_inner - in.cutoff, plan.rlist_inner));
  } else {
    plan.nstlist_prune = -1;
    plan.rlist_inner = plan.rlist;
    plan.log.push_back(
        fmt::format("Using a single 8x8 pair-list setup: updated every {} steps, buffer {:.3f} nm, "
                    "rlist {:.3f} nm",
                    plan.nstlist, plan.rlist - in.cutoff, plan.rlist));
  }
  return plan;
}

}  // namespace kiln::md
