#include "kiln/hpc/md/nonbonded.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <numbers>
#include <thread>

#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

namespace {

// The pair-list part for atoms [first, last): forces into `forces`, energies and virial into `out`.
// Partners from `home` on are halo atoms (domain decomposition): their pairs count half.
void pair_interactions(const MdSystem& s, const PairList& list, const NonbondedSettings& p, const std::vector<Vec3>& x,
                       const Vec3& box, int first, int last, int home, std::vector<Vec3>& forces,
                       ShortRangeEnergies& out) {
  const double rc = p.cutoff, rc2 = rc * rc, beta = p.beta;
  const double two_beta_sqrt_pi = 2.0 * beta / std::sqrt(std::numbers::pi);
  const double coulomb_shift = std::erfc(beta * rc) / rc;
  const double inv_rc6 = 1.0 / (rc2 * rc2 * rc2), inv_rc12 = inv_rc6 * inv_rc6;
  const int nt = s.type_count;
  const auto& offsets = list.offsets();
  const auto& nbr = list.neighbors();
  // The partners of a row are sorted, so its halo partners (from `home` on) come last: they are summed
  // apart, to count half below.
  double e_lj = 0, e_coul = 0, shared_lj = 0, shared_coul = 0;
  Mat3 virial{}, shared_virial{};
  auto interact = [&](int i, const Vec3& xi, double qi, const double* c6_row, const double* c12_row, int begin, int end,
                      double& lj, double& coul, Mat3& w, Vec3& fi) {
    for (int k = begin; k < end; ++k) {
      const int j = nbr[k];
      Vec3 d = min_image(x[j] - xi, box);
      double r2 = dot(d, d);
      if (r2 >= rc2) continue;
      if (r2 < 1e-6) {
        KILN_FAIL(
            "atoms {} ({}) and {} ({}) overlap: {:.5f} nm apart; the coordinates need fixing (energy "
            "minimisation or a different start)",
            s.atom_number(i), s.atom_names[i], s.atom_number(j), s.atom_names[j], std::sqrt(r2));
      }
      double rinv2 = 1.0 / r2, rinv = std::sqrt(rinv2), r = r2 * rinv;
      double fscal = 0;
      const double c6 = c6_row[s.types[j]], c12 = c12_row[s.types[j]];
      if (c6 != 0 || c12 != 0) {
        double rinv6 = rinv2 * rinv2 * rinv2;
        double v6 = c6 * rinv6, v12 = c12 * rinv6 * rinv6;
        lj += v12 - v6 - (c12 * inv_rc12 - c6 * inv_rc6);
        fscal += (12 * v12 - 6 * v6) * rinv2;
      }
      double qq = qi * s.charges[j];
      if (qq != 0 && p.reaction_field) {
        coul += qq * (rinv + p.k_rf * r2 - p.c_rf);
        fscal += qq * (rinv * rinv2 - 2 * p.k_rf);
      } else if (qq != 0) {
        double erfc_term = std::erfc(beta * r);
        coul += qq * (erfc_term * rinv - coulomb_shift);
        fscal += qq * (erfc_term * rinv + two_beta_sqrt_pi * std::exp(-beta * beta * r2)) * rinv2;
      }
      Vec3 f = fscal * d;
      forces[j] += f;
      fi -= f;
      add_outer(w, d, f);
    }
  };
  for (int i = first; i < last; ++i) {
    const Vec3 xi = x[i];
    const double qi = kCoulombFactor * s.charges[i];
    const double* c6_row = &s.c6[s.types[i] * nt];
    const double* c12_row = &s.c12[s.types[i] * nt];
    Vec3 fi{0, 0, 0};
    const int end = offsets[i + 1];
    const int split =
        home < s.atom_count
            ? static_cast<int>(std::lower_bound(nbr.begin() + offsets[i], nbr.begin() + end, home) - nbr.begin())
            : end;
    interact(i, xi, qi, c6_row, c12_row, offsets[i], split, e_lj, e_coul, virial, fi);
    interact(i, xi, qi, c6_row, c12_row, split, end, shared_lj, shared_coul, shared_virial, fi);
    forces[i] += fi;
  }
  out.lj += e_lj;
  out.coulomb += e_coul;
  out.virial += virial;
  if (home < s.atom_count) {
    out.lj += 0.5 * shared_lj;
    out.coulomb += 0.5 * shared_coul;
    for (int a = 0; a < 3; ++a)
      for (int b = 0; b < 3; ++b) out.virial[a][b] += 0.5 * shared_virial[a][b];
  }
}

}  // namespace

ShortRangeEnergies compute_short_range(const MdSystem& s, const PairList& list, const NonbondedSettings& p,
                                       const std::vector<Vec3>& x, const Vec3& box, std::vector<Vec3>& forces) {
  const double rc = p.cutoff, rc2 = rc * rc, beta = p.beta;
  const double two_beta_sqrt_pi = 2.0 * beta / std::sqrt(std::numbers::pi);
  const auto& offsets = list.offsets();
  const int home = p.home_count < 0 ? s.atom_count : p.home_count;
  ShortRangeEnergies result;
  const int threads = std::clamp(p.threads, 1, std::max(1, home / 64));
  if (threads == 1) {
    pair_interactions(s, list, p, x, box, 0, home, home, forces, result);
  } else {
    // Atom ranges with equal shares of the pairs; each thread has its own force buffer and sums,
    // added up in thread order afterwards, so a given thread count gives the same bits every run.
    std::vector<int> bounds(threads + 1, home);
    bounds[0] = 0;
    const double per_thread = static_cast<double>(offsets[home]) / threads;
    for (int t = 1; t < threads; ++t)
      bounds[t] = std::min(
          home, static_cast<int>(std::lower_bound(offsets.begin(), offsets.end(), per_thread * t) - offsets.begin()));
    for (int t = 1; t <= threads; ++t) bounds[t] = std::max(bounds[t], bounds[t - 1]);
    std::vector<std::vector<Vec3>> partial(threads, std::vector<Vec3>(x.size(), Vec3{0, 0, 0}));
    std::vector<ShortRangeEnergies> sums(threads);
    std::vector<std::exception_ptr> errors(threads);
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t)
      pool.emplace_back([&, t] {
        try {
          pair_interactions(s, list, p, x, box, bounds[t], bounds[t + 1], home, partial[t], sums[t]);
        } catch (...) {
          errors[t] = std::current_exception();
        }
      });
    for (auto& th : pool) th.join();
    for (auto& e : errors)
      if (e) std::rethrow_exception(e);
    for (int t = 0; t < threads; ++t) {
      for (size_t i = 0; i < x.size(); ++i) forces[i] += partial[t][i];
      result.lj += sums[t].lj;
      result.coulomb += sums[t].coulomb;
      result.virial += sums[t].virial;
    }
  }
  double e_coul = result.coulomb;
  Mat3 virial = result.virial;
  // Excluded pairs: the reciprocal sum includes their full Coulomb interaction; take its erf part
  // back out.
  for (int i = 0; i < home; ++i) {
    for (int j : s.exclusions[i]) {
      if (j <= i) continue;
      double qq = kCoulombFactor * s.charges[i] * s.charges[j];
      if (qq == 0) continue;
      Vec3 d = min_image(x[j] - x[i], box);
      double r2 = dot(d, d);
      // With PME the reciprocal sum has this pair's full interaction and the Verlet scheme only
      // corrects within the cut-off, so GROMACS refuses excluded pairs beyond it, and so does kiln.
      KILN_CHECK(r2 < rc2,
                 "excluded atoms {} ({}) and {} ({}) are {:.4f} nm apart, beyond the cut-off {} nm: a "
                 "molecule is broken over the box or the cut-off is too short for it",
                 s.atom_number(i), s.atom_names[i], s.atom_number(j), s.atom_names[j], std::sqrt(r2), rc);
      if (p.reaction_field) {
        e_coul += qq * (p.k_rf * r2 - p.c_rf);
        Vec3 f = (-2 * qq * p.k_rf) * d;
        forces[j] += f;
        forces[i] -= f;
        add_outer(virial, d, f);
        continue;
      }
      if (r2 < 1e-12) {
        e_coul -= qq * two_beta_sqrt_pi;  // the r -> 0 limit of erf(beta r) / r
        continue;
      }
      double r = std::sqrt(r2), rinv = 1.0 / r;
      double erf_term = std::erf(beta * r);
      e_coul -= qq * erf_term * rinv;
      // V = -qq erf(br)/r; F_j = -dV/dr * d/r.
      double fscal = -qq * (erf_term * rinv - two_beta_sqrt_pi * std::exp(-beta * beta * r2)) * rinv * rinv;
      Vec3 f = fscal * d;
      forces[j] += f;
      forces[i] -= f;
      add_outer(virial, d, f);
    }
  }
  double q2 = 0;
  for (int i = 0; i < home; ++i) q2 += s.charges[i] * s.charges[i];
  e_coul -= kCoulombFactor * q2 * (p.reaction_field ? 0.5 * p.c_rf : beta / std::sqrt(std::numbers::pi));
  result.coulomb = e_coul;
  result.virial = virial;
  return result;
}

}  // namespace kiln::md
