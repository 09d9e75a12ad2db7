#include "kiln/hpc/md/bonded.h"

#include <algorithm>
#include <cmath>

#include "kiln/hpc/md/dihedral_terms.h"
#include "kiln/hpc/md/units.h"

namespace kiln::md {

BondedEnergies compute_bonded(const MdSystem& s, const std::vector<Vec3>& x, const Vec3& box,
                              std::vector<Vec3>& forces) {
  BondedEnergies e;
  for (const auto& b : s.bonds) {
    Vec3 d = min_image(x[b.j] - x[b.i], box);
    double r = norm(d), dr = r - b.b0;
    e.bond += 0.5 * b.kb * dr * dr;
    if (r == 0) continue;
    Vec3 f = (-b.kb * dr / r) * d;  // on j
    forces[b.j] += f;
    forces[b.i] -= f;
    add_outer(e.virial, d, f);
  }
  for (const auto& a : s.angles) {
    Vec3 u = min_image(x[a.i] - x[a.j], box), v = min_image(x[a.k] - x[a.j], box);
    double nu = norm(u), nv = norm(v);
    if (nu == 0 || nv == 0) continue;
    double cos_t = std::clamp(dot(u, v) / (nu * nv), -1.0, 1.0);
    double theta = std::acos(cos_t), dt = theta - a.theta0;
    e.angle += 0.5 * a.kth * dt * dt;
    double sin_t = std::sqrt(std::max(1 - cos_t * cos_t, 1e-24));
    // dE/dtheta = k dt; dtheta/dcos = -1/sin; dcos/du = v/(|u||v|) - cos u/|u|^2.
    double c = a.kth * dt / sin_t;  // -dE/dcos
    Vec3 fi = c * ((1 / (nu * nv)) * v - (cos_t / (nu * nu)) * u);
    Vec3 fk = c * ((1 / (nu * nv)) * u - (cos_t / (nv * nv)) * v);
    forces[a.i] += fi;
    forces[a.k] += fk;
    forces[a.j] -= fi + fk;
    add_outer(e.virial, u, fi);
    add_outer(e.virial, v, fk);
  }
  auto dihedral = [&](int i, int j, int k, int l, auto&& energy) {
    DihedralFrame d;
    Vec3 r_ij = min_image(x[i] - x[j], box), r_kj = min_image(x[k] - x[j], box), r_kl = min_image(x[k] - x[l], box);
    for (int c = 0; c < 3; ++c) {
      d.r_ij[c] = r_ij[c];
      d.r_kj[c] = r_kj[c];
      d.r_kl[c] = r_kl[c];
    }
    dihedral_frame(d);
    double dv_dphi = 0;
    double v = energy(d.phi, dv_dphi);
    Vec3 fi, fj, fk, fl;
    dihedral_forces(d, dv_dphi, fi.data(), fj.data(), fk.data(), fl.data());
    forces[i] += fi;
    forces[j] += fj;
    forces[k] += fk;
    forces[l] += fl;
    // Positions relative to j: x_i - x_j = r_ij, x_k - x_j = r_kj, x_l - x_j = r_kj - r_kl.
    add_outer(e.virial, r_ij, fi);
    add_outer(e.virial, r_kj, fk);
    add_outer(e.virial, r_kj - r_kl, fl);
    return v;
  };
  for (const auto& d : s.proper_dihedrals)
    e.proper_dih += dihedral(d.i, d.j, d.k, d.l, [&](double phi, double& dv) {
      return periodic_dihedral_energy(phi, d.phi_s, d.k_phi, d.n, &dv);
    });
  for (const auto& d : s.periodic_impropers)
    e.improper_dih += dihedral(d.i, d.j, d.k, d.l, [&](double phi, double& dv) {
      return periodic_dihedral_energy(phi, d.phi_s, d.k_phi, d.n, &dv);
    });
  for (const auto& d : s.rb_dihedrals)
    e.rb_dih += dihedral(d.i, d.j, d.k, d.l, [&](double phi, double& dv) { return rb_dihedral_energy(phi, d.c, &dv); });
  for (const auto& p : s.pairs) {
    Vec3 d = min_image(x[p.j] - x[p.i], box);
    double lj = 0, coulomb = 0;
    double fscal = pair14_energies(dot(d, d), p.c6, p.c12, kCoulombFactor * p.qq, &lj, &coulomb);
    e.lj14 += lj;
    e.coulomb14 += coulomb;
    Vec3 f = fscal * d;  // on j
    forces[p.j] += f;
    forces[p.i] -= f;
    add_outer(e.virial, d, f);
  }
  return e;
}

}  // namespace kiln::md
