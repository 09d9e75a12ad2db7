#pragma once
// Torsions and 1-4 pairs of one interaction, shared by the CPU engine (bonded.cpp) and the GPU
// kernel (cuda/kernels.cu): plain arrays, so both run the same arithmetic. The dihedral angle and
// its forces follow GROMACS's convention (IUPAC: trans = pi; Bekker's force distribution), so
// energies and forces per term match mdrun's.
#include <math.h>

#include "kiln/hpc/md/host_device.h"

namespace kiln::md {

namespace dihedral_detail {
KILN_MD_HD double dot3(const double* a, const double* b) { return a[0] * b[0] + a[1] * b[1] + a[2] * b[2]; }
KILN_MD_HD void cross3(const double* a, const double* b, double* out) {
  out[0] = a[1] * b[2] - a[2] * b[1];
  out[1] = a[2] * b[0] - a[0] * b[2];
  out[2] = a[0] * b[1] - a[1] * b[0];
}
}  // namespace dihedral_detail

// The vectors of one dihedral i-j-k-l (all minimum-imaged): r_ij = xi - xj, r_kj = xk - xj,
// r_kl = xk - xl, and the plane normals m = r_ij x r_kj, n = r_kj x r_kl.
struct DihedralFrame {
  double r_ij[3], r_kj[3], r_kl[3], m[3], n[3];
  double phi;  // in (-pi, pi], the sign of r_ij . n
};

KILN_MD_HD void dihedral_frame(DihedralFrame& d) {
  using dihedral_detail::cross3;
  using dihedral_detail::dot3;
  cross3(d.r_ij, d.r_kj, d.m);
  cross3(d.r_kj, d.r_kl, d.n);
  double mxn[3];
  cross3(d.m, d.n, mxn);
  const double phi = atan2(sqrt(dot3(mxn, mxn)), dot3(d.m, d.n));
  d.phi = dot3(d.r_ij, d.n) < 0 ? -phi : phi;
}

// Forces on i, j, k, l from dV/dphi (GROMACS's do_dih_fup). Zero for a degenerate (linear) frame.
KILN_MD_HD void dihedral_forces(const DihedralFrame& d, double dv_dphi, double* fi, double* fj, double* fk,
                                double* fl) {
  using dihedral_detail::dot3;
  const double mm = dot3(d.m, d.m), nn = dot3(d.n, d.n), kj2 = dot3(d.r_kj, d.r_kj);
  if (mm < 1e-30 || nn < 1e-30 || kj2 < 1e-30) {
    for (int c = 0; c < 3; ++c) fi[c] = fj[c] = fk[c] = fl[c] = 0;
    return;
  }
  const double kj = sqrt(kj2);
  const double p = dot3(d.r_ij, d.r_kj) / kj2, q = dot3(d.r_kl, d.r_kj) / kj2;
  for (int c = 0; c < 3; ++c) {
    fi[c] = -dv_dphi * kj / mm * d.m[c];
    fl[c] = dv_dphi * kj / nn * d.n[c];
    const double s = p * fi[c] - q * fl[c];
    fj[c] = -(fi[c] - s);
    fk[c] = -(fl[c] + s);
  }
}

// k (1 + cos(n phi - phi_s)) and its derivative.
KILN_MD_HD double periodic_dihedral_energy(double phi, double phi_s, double k, int n, double* dv_dphi) {
  const double a = n * phi - phi_s;
  *dv_dphi = -k * n * sin(a);
  return k * (1 + cos(a));
}

// Ryckaert-Bellemans: sum_n c[n] cos^n(psi), psi = phi - pi.
KILN_MD_HD double rb_dihedral_energy(double phi, const double* c, double* dv_dphi) {
  const double psi = phi >= 0 ? phi - 3.14159265358979323846 : phi + 3.14159265358979323846;
  const double cos_psi = cos(psi), sin_psi = sin(psi);
  double v = c[0], dv_dcos = 0, power = 1;  // power = cos^(n-1)
  for (int n = 1; n < 6; ++n) {
    dv_dcos += n * c[n] * power;
    power *= cos_psi;
    v += c[n] * power;
  }
  *dv_dphi = -sin_psi * dv_dcos;
  return v;
}

// A 1-4 pair at squared distance r2: LJ-14 and Coulomb-14 energies (fqq = 1/(4 pi eps0) qq), and
// F / r (the force on j along x_j - x_i).
KILN_MD_HD double pair14_energies(double r2, double c6, double c12, double fqq, double* lj, double* coulomb) {
  const double rinv2 = 1 / r2, rinv6 = rinv2 * rinv2 * rinv2, rinv = sqrt(rinv2);
  *lj = c12 * rinv6 * rinv6 - c6 * rinv6;
  *coulomb = fqq * rinv;
  return (12 * c12 * rinv6 * rinv6 - 6 * c6 * rinv6 + fqq * rinv) * rinv2;
}

}  // namespace kiln::md
