#include "kiln/hpc/md/bonded.h"

#include <algorithm>
#include <cmath>

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
  return e;
}

}  // namespace kiln::md
