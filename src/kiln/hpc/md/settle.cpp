#include "kiln/hpc/md/settle.h"

#include <cmath>

#include "kiln/runtime/error.h"

namespace kiln::md {

void settle_positions(const MdSystem& s, const std::vector<Vec3>& ref, std::vector<Vec3>& x, const Vec3& box) {
  for (const SettleWater& w : s.settles) {
    const int o = w.o, h1 = o + 1, h2 = o + 2;
    const double m_o = s.masses[o], m_h = s.masses[h1];
    const double total = m_o + 2 * m_h;
    // The canonical triangle: O at (0, ra), hydrogens at (-+rc, -rb), centre of mass at the origin.
    const double rc = 0.5 * w.d_hh;
    const double height = std::sqrt(w.d_oh * w.d_oh - rc * rc);
    const double ra = 2 * m_h * height / total;
    const double rb = height - ra;
    // Work relative to the oxygen so waters split by the box edge stay whole.
    const Vec3 b0 = min_image(ref[h1] - ref[o], box), c0 = min_image(ref[h2] - ref[o], box);
    const Vec3 a1_abs = x[o];
    const Vec3 b1_rel = min_image(x[h1] - x[o], box), c1_rel = min_image(x[h2] - x[o], box);
    const Vec3 com_rel = (m_h / total) * (b1_rel + c1_rel);  // centre of mass relative to the new O
    const Vec3 a1 = -1.0 * com_rel, b1 = b1_rel - com_rel, c1 = c1_rel - com_rel;
    // The frame: z normal to the old plane, x perpendicular to it and to the new O direction.
    Vec3 ez = cross(b0, c0);
    Vec3 ex = cross(a1, ez);
    Vec3 ey = cross(ez, ex);
    double nz = norm(ez), nx = norm(ex), ny = norm(ey);
    KILN_CHECK(nz > 0 && nx > 0 && ny > 0, "SETTLE: water at atom {} is degenerate (collinear atoms)", o + 1);
    ez = (1 / nz) * ez;
    ex = (1 / nx) * ex;
    ey = (1 / ny) * ey;
    auto to_frame = [&](const Vec3& v) { return Vec3{dot(ex, v), dot(ey, v), dot(ez, v)}; };
    const Vec3 b0d = to_frame(b0), c0d = to_frame(c0);
    const Vec3 a1d = to_frame(a1), b1d = to_frame(b1), c1d = to_frame(c1);
    const double sinphi = a1d[2] / ra;
    const double cosphi2 = 1 - sinphi * sinphi;
    KILN_CHECK(cosphi2 > 0,
               "SETTLE: water at atom {} moved too far in one step to be constrained (is dt too large, "
               "or are atoms overlapping?)",
               o + 1);
    const double cosphi = std::sqrt(cosphi2);
    const double sinpsi = (b1d[2] - c1d[2]) / (2 * rc * cosphi);
    const double cospsi2 = 1 - sinpsi * sinpsi;
    KILN_CHECK(cospsi2 > 0, "SETTLE: water at atom {} moved too far in one step to be constrained", o + 1);
    const double cospsi = std::sqrt(cospsi2);
    const double ya2d = ra * cosphi;
    const double xb2d = -rc * cospsi;
    const double yb2d = -rb * cosphi - rc * sinpsi * sinphi;
    const double yc2d = -rb * cosphi + rc * sinpsi * sinphi;
    // The rotation about z that matches the old triangle's in-plane orientation.
    const double alpha = xb2d * (b0d[0] - c0d[0]) + b0d[1] * yb2d + c0d[1] * yc2d;
    const double beta = xb2d * (c0d[1] - b0d[1]) + b0d[0] * yb2d + c0d[0] * yc2d;
    const double gamma = b0d[0] * b1d[1] - b1d[0] * b0d[1] + c0d[0] * c1d[1] - c1d[0] * c0d[1];
    const double al2be2 = alpha * alpha + beta * beta;
    const double disc = al2be2 - gamma * gamma;
    KILN_CHECK(disc >= 0 && al2be2 > 0, "SETTLE: water at atom {} cannot be constrained", o + 1);
    const double sintheta = (alpha * gamma - beta * std::sqrt(disc)) / al2be2;
    const double costheta = std::sqrt(1 - sintheta * sintheta);
    const Vec3 a3d{-ya2d * sintheta, ya2d * costheta, a1d[2]};
    const Vec3 b3d{xb2d * costheta - yb2d * sintheta, xb2d * sintheta + yb2d * costheta, b1d[2]};
    const Vec3 c3d{-xb2d * costheta - yc2d * sintheta, -xb2d * sintheta + yc2d * costheta, c1d[2]};
    auto from_frame = [&](const Vec3& v) { return v[0] * ex + v[1] * ey + v[2] * ez; };
    const Vec3 com = a1_abs + com_rel;
    x[o] = com + from_frame(a3d);
    x[h1] = com + from_frame(b3d);
    x[h2] = com + from_frame(c3d);
  }
}

Mat3 settle_virial(const MdSystem& s, const std::vector<Vec3>& ref, const std::vector<Vec3>& unconstrained,
                   const std::vector<Vec3>& constrained, const Vec3& box, double dt) {
  Mat3 w{};
  for (const SettleWater& water : s.settles)
    for (int a = water.o; a < water.o + 3; ++a)
      add_outer(w, min_image(ref[a] - ref[water.o], box), constrained[a] - unconstrained[a], s.masses[a] / (dt * dt));
  return w;
}

}  // namespace kiln::md
