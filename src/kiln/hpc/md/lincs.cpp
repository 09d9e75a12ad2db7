#include "kiln/hpc/md/lincs.h"

#include <algorithm>
#include <cmath>

#include "kiln/runtime/error.h"

namespace kiln::md {

void constrain_h_bonds(MdSystem& s) {
  auto hydrogen = [&](int a) { return !s.atom_names[a].empty() && std::toupper(s.atom_names[a][0]) == 'H'; };
  std::vector<HarmonicBond> kept;
  for (const auto& b : s.bonds) {
    if (hydrogen(b.i) || hydrogen(b.j))
      s.constraints.push_back({b.i, b.j, b.b0});
    else
      kept.push_back(b);
  }
  s.bonds = std::move(kept);
}

LincsCoupling lincs_coupling(const MdSystem& s) {
  const int nc = static_cast<int>(s.constraints.size());
  std::vector<std::vector<int>> at_atom(s.atom_count);
  for (int c = 0; c < nc; ++c) {
    at_atom[s.constraints[c].i].push_back(c);
    at_atom[s.constraints[c].j].push_back(c);
  }
  LincsCoupling k;
  k.s.resize(nc);
  for (int c = 0; c < nc; ++c)
    k.s[c] = 1 / std::sqrt(1 / s.masses[s.constraints[c].i] + 1 / s.masses[s.constraints[c].j]);
  k.start.push_back(0);
  for (int c = 0; c < nc; ++c) {
    const Constraint& a = s.constraints[c];
    for (int atom : {a.i, a.j})
      for (int o : at_atom[atom]) {
        if (o == c) continue;
        const Constraint& b = s.constraints[o];
        const bool same_role = (atom == a.i) == (atom == b.i);
        k.other.push_back(o);
        k.coef.push_back((same_role ? -1.0 : 1.0) * k.s[c] * k.s[o] / s.masses[atom]);
      }
    k.start.push_back(static_cast<int>(k.other.size()));
  }
  return k;
}

Lincs::Lincs(const MdSystem& system, int order, int iterations)
    : system_(system), coupling_(lincs_coupling(system)), order_(order), iterations_(iterations) {}

// rhs <- (I + A + ... + A^order) rhs, A[c][o] = blcc[k].
void Lincs::solve(std::vector<double>& rhs, const std::vector<double>& blcc) const {
  const int nc = static_cast<int>(rhs.size());
  std::vector<double> term = rhs, next(nc);
  for (int p = 0; p < order_; ++p) {
    for (int c = 0; c < nc; ++c) {
      double sum = 0;
      for (int k = coupling_.start[c]; k < coupling_.start[c + 1]; ++k) sum += blcc[k] * term[coupling_.other[k]];
      next[c] = sum;
    }
    for (int c = 0; c < nc; ++c) rhs[c] += next[c];
    term.swap(next);
  }
}

void Lincs::apply(const std::vector<Vec3>& ref, std::vector<Vec3>& xp, const Vec3& box, double dt, Mat3* virial) const {
  const auto& cs = system_.constraints;
  const int nc = static_cast<int>(cs.size());
  if (nc == 0) return;
  std::vector<Vec3> dir(nc), r_old(nc);
  for (int c = 0; c < nc; ++c) {
    r_old[c] = min_image(ref[cs[c].i] - ref[cs[c].j], box);
    dir[c] = (1 / norm(r_old[c])) * r_old[c];
  }
  std::vector<double> blcc(coupling_.other.size());
  for (int c = 0; c < nc; ++c)
    for (int k = coupling_.start[c]; k < coupling_.start[c + 1]; ++k)
      blcc[k] = coupling_.coef[k] * dot(dir[c], dir[coupling_.other[k]]);
  std::vector<double> lambda(nc, 0.0), rhs(nc);
  // Moves the atoms by the solution mu (lambda_c = S_c mu_c) and keeps the total.
  auto update = [&](const std::vector<double>& mu) {
    for (int c = 0; c < nc; ++c) {
      const double l = coupling_.s[c] * mu[c];
      lambda[c] += l;
      xp[cs[c].i] -= (l / system_.masses[cs[c].i]) * dir[c];
      xp[cs[c].j] += (l / system_.masses[cs[c].j]) * dir[c];
    }
  };
  for (int c = 0; c < nc; ++c)
    rhs[c] = coupling_.s[c] * (dot(dir[c], min_image(xp[cs[c].i] - xp[cs[c].j], box)) - cs[c].length);
  solve(rhs, blcc);
  update(rhs);
  // Rotational lengthening: the projection on the old direction should be sqrt(2 d^2 - l^2),
  // with l the current length, so that the length becomes d.
  for (int it = 0; it < iterations_; ++it) {
    for (int c = 0; c < nc; ++c) {
      const Vec3 r = min_image(xp[cs[c].i] - xp[cs[c].j], box);
      const double d = cs[c].length, p2 = 2 * d * d - dot(r, r);
      const double p = p2 > 0 ? std::sqrt(p2) : 0.0;
      rhs[c] = coupling_.s[c] * (dot(dir[c], r) - p);
    }
    solve(rhs, blcc);
    update(rhs);
  }
  if (virial) {
    // The force on i is -lambda dir / dt^2, on j its opposite: r_ij (x) f_i per constraint.
    for (int c = 0; c < nc; ++c) add_outer(*virial, r_old[c], dir[c], -lambda[c] / (dt * dt));
  }
}

double Lincs::max_relative_deviation(const std::vector<Vec3>& x, const Vec3& box) const {
  double worst = 0;
  for (const auto& c : system_.constraints)
    worst = std::max(worst, std::abs(norm(min_image(x[c.i] - x[c.j], box)) - c.length) / c.length);
  return worst;
}

double Lincs::rms_relative_deviation(const std::vector<Vec3>& x, const Vec3& box) const {
  if (system_.constraints.empty()) return 0;
  double sum = 0;
  for (const auto& c : system_.constraints) {
    const double d = (norm(min_image(x[c.i] - x[c.j], box)) - c.length) / c.length;
    sum += d * d;
  }
  return std::sqrt(sum / static_cast<double>(system_.constraints.size()));
}

}  // namespace kiln::md
