#pragma once
// SETTLE of one rigid water (Miyamoto and Kollman 1992), shared by the CPU engine (settle.cpp) and
// the GPU kernel (cuda/kernels.cu): plain arrays and no exceptions, so both run the same code.
#include <math.h>

#include "kiln/hpc/md/host_device.h"

namespace kiln::md {

enum class SettleFailure : int { None = 0, Degenerate, TooFar, Unsolvable };

struct SettleGeometry {
  double m_o, m_h;    // amu
  double d_oh, d_hh;  // nm
};

namespace settle_detail {
KILN_MD_HD double dot3(const double* a, const double* b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
KILN_MD_HD void cross3(const double* a, const double* b, double* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}
}  // namespace settle_detail

// b0, c0: the reference (constrained) hydrogens relative to their oxygen; b1, c1: the
// unconstrained new hydrogens relative to the new oxygen (all minimum-imaged). Writes the
// constrained positions of O, H1, H2 relative to the new (unconstrained) oxygen.
KILN_MD_HD SettleFailure settle_water(const double* b0, const double* c0, const double* b1_rel, const double* c1_rel,
                                      const SettleGeometry& g, double* out_o, double* out_h1, double* out_h2) {
  using settle_detail::cross3;
  using settle_detail::dot3;
  const double total = g.m_o + 2 * g.m_h;
  // The canonical triangle: O at (0, ra), hydrogens at (-+rc, -rb), centre of mass at the origin.
  const double rc = 0.5 * g.d_hh;
  const double height = sqrt(g.d_oh * g.d_oh - rc * rc);
  const double ra = 2 * g.m_h * height / total;
  const double rb = height - ra;
  double com_rel[3], a1[3], b1[3], c1[3];
  for (int k = 0; k < 3; ++k) {
    com_rel[k] = (g.m_h / total) * (b1_rel[k] + c1_rel[k]);  // centre of mass relative to the new O
    a1[k] = -com_rel[k];
    b1[k] = b1_rel[k] - com_rel[k];
    c1[k] = c1_rel[k] - com_rel[k];
  }
  // The frame: z normal to the old plane, x perpendicular to it and to the new O direction.
  double ez[3], ex[3], ey[3];
  cross3(b0, c0, ez);
  cross3(a1, ez, ex);
  cross3(ez, ex, ey);
  const double nz = sqrt(dot3(ez, ez)), nx = sqrt(dot3(ex, ex)), ny = sqrt(dot3(ey, ey));
  if (!(nz > 0 && nx > 0 && ny > 0)) return SettleFailure::Degenerate;
  for (int k = 0; k < 3; ++k) {
    ez[k] /= nz;
    ex[k] /= nx;
    ey[k] /= ny;
  }
  const double b0d[3] = {dot3(ex, b0), dot3(ey, b0), dot3(ez, b0)};
  const double c0d[3] = {dot3(ex, c0), dot3(ey, c0), dot3(ez, c0)};
  const double a1d_z = dot3(ez, a1);
  const double b1d[3] = {dot3(ex, b1), dot3(ey, b1), dot3(ez, b1)};
  const double c1d[3] = {dot3(ex, c1), dot3(ey, c1), dot3(ez, c1)};
  const double sinphi = a1d_z / ra;
  const double cosphi2 = 1 - sinphi * sinphi;
  if (!(cosphi2 > 0)) return SettleFailure::TooFar;
  const double cosphi = sqrt(cosphi2);
  const double sinpsi = (b1d[2] - c1d[2]) / (2 * rc * cosphi);
  const double cospsi2 = 1 - sinpsi * sinpsi;
  if (!(cospsi2 > 0)) return SettleFailure::TooFar;
  const double cospsi = sqrt(cospsi2);
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
  if (!(disc >= 0 && al2be2 > 0)) return SettleFailure::Unsolvable;
  const double sintheta = (alpha * gamma - beta * sqrt(disc)) / al2be2;
  const double costheta = sqrt(1 - sintheta * sintheta);
  const double a3d[3] = {-ya2d * sintheta, ya2d * costheta, a1d_z};
  const double b3d[3] = {xb2d * costheta - yb2d * sintheta, xb2d * sintheta + yb2d * costheta, b1d[2]};
  const double c3d[3] = {-xb2d * costheta - yc2d * sintheta, -xb2d * sintheta + yc2d * costheta, c1d[2]};
  for (int k = 0; k < 3; ++k) {
    out_o[k] = com_rel[k] + a3d[0] * ex[k] + a3d[1] * ey[k] + a3d[2] * ez[k];
    out_h1[k] = com_rel[k] + b3d[0] * ex[k] + b3d[1] * ey[k] + b3d[2] * ez[k];
    out_h2[k] = com_rel[k] + c3d[0] * ex[k] + c3d[1] * ey[k] + c3d[2] * ez[k];
  }
  return SettleFailure::None;
}

}  // namespace kiln::md
