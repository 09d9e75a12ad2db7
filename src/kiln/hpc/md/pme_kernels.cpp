#include "kiln/hpc/md/pme_kernels.h"

#include <cmath>
#include <numbers>

#include "kiln/hpc/md/pme.h"
#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

void PmeSplines::compute(const std::vector<Vec3>& x, const Vec3& box, const std::array<int, 3>& grid, int order,
                         int atoms) {
  const int p = order;
  first_index.resize(3 * atoms);
  theta.resize(3 * atoms * p);
  dtheta.resize(3 * atoms * p);
  for (int i = 0; i < atoms; ++i) {
    for (int d = 0; d < 3; ++d) {
      double f = x[i][d] / box[d];
      f -= std::floor(f);
      double u = f * grid[d];
      int iu = static_cast<int>(u);
      if (iu >= grid[d]) iu = grid[d] - 1;  // f rounded up to 1
      bspline_weights(u - iu, p, &theta[(3 * i + d) * p], &dtheta[(3 * i + d) * p]);
      first_index[3 * i + d] = iu - p + 1 + grid[d];  // kept non-negative for the modulo below
    }
  }
}

void PmeSplines::mark_x_planes(int i, int order, int planes, unsigned char* marked) const {
  for (int a = 0; a < order; ++a) marked[(first_index[3 * i] + a) % planes] = 1;
}

void spread_charges(const PmeSplines& s, const std::vector<double>& q, int atoms, const std::array<int, 3>& grid,
                    int order, const int* plane_slot, double* grid_values) {
  const int p = order, K0 = grid[0], K1 = grid[1], K2 = grid[2];
  for (int i = 0; i < atoms; ++i) {
    if (q[i] == 0) continue;
    const double *tx = s.weights(i, 0, p), *ty = s.weights(i, 1, p), *tz = s.weights(i, 2, p);
    for (int a = 0; a < p; ++a) {
      const int gx = plane_slot[(s.first_index[3 * i] + a) % K0];
      double wa = q[i] * tx[a];
      for (int b = 0; b < p; ++b) {
        int gy = (s.first_index[3 * i + 1] + b) % K1;
        double wab = wa * ty[b];
        double* row = grid_values + (static_cast<size_t>(gx) * K1 + gy) * K2;
        for (int c = 0; c < p; ++c) row[(s.first_index[3 * i + 2] + c) % K2] += wab * tz[c];
      }
    }
  }
}

void gather_forces(const PmeSplines& s, const std::vector<double>& q, int atoms, const std::array<int, 3>& grid,
                   int order, const Vec3& box, const int* plane_slot, const double* potential,
                   std::vector<Vec3>& forces) {
  const int p = order, K0 = grid[0], K1 = grid[1], K2 = grid[2];
  for (int i = 0; i < atoms; ++i) {
    if (q[i] == 0) continue;
    const double *tx = s.weights(i, 0, p), *ty = s.weights(i, 1, p), *tz = s.weights(i, 2, p);
    const double *dx = s.derivatives(i, 0, p), *dy = s.derivatives(i, 1, p), *dz = s.derivatives(i, 2, p);
    double fx = 0, fy = 0, fz = 0;
    for (int a = 0; a < p; ++a) {
      const int gx = plane_slot[(s.first_index[3 * i] + a) % K0];
      for (int b = 0; b < p; ++b) {
        int gy = (s.first_index[3 * i + 1] + b) % K1;
        const double* row = potential + (static_cast<size_t>(gx) * K1 + gy) * K2;
        for (int c = 0; c < p; ++c) {
          double g = row[(s.first_index[3 * i + 2] + c) % K2];
          fx += dx[a] * ty[b] * tz[c] * g;
          fy += tx[a] * dy[b] * tz[c] * g;
          fz += tx[a] * ty[b] * dz[c] * g;
        }
      }
    }
    forces[i][0] -= q[i] * fx * K0 / box[0];
    forces[i][1] -= q[i] * fy * K1 / box[1];
    forces[i][2] -= q[i] * fz * K2 / box[2];
  }
}

PmeInfluence::PmeInfluence(std::array<int, 3> grid, int order, double beta) : grid_(grid), beta_(beta) {
  for (int d = 0; d < 3; ++d) {
    KILN_CHECK(grid[d] >= 2 * (order - 1), "PME grid {} in {} is below 2 * (pme-order - 1)", grid[d], "xyz"[d]);
    auto mod = bspline_moduli(grid[d], order);
    inverse_moduli_[d].resize(grid[d]);
    for (int m = 0; m < grid[d]; ++m) inverse_moduli_[d][m] = 1.0 / mod[m];
  }
}

double PmeInfluence::solve(std::complex<double>* transformed, const Vec3& box, int b_begin, int b_end,
                           Mat3* virial) const {
  // Solve: E = 1/2 sum_m eterm(m) |F(Q)(m)|^2 with eterm = f exp(-pi^2 m^2 / beta^2) / (pi V m^2) B(m);
  // then F(Q) *= eterm so that the inverse transform gives the convolution dE/dQ.
  const int K0 = grid_[0], K1 = grid_[1], K2 = grid_[2], K2c = K2 / 2 + 1, columns = b_end - b_begin;
  const double volume = box[0] * box[1] * box[2];
  const double pi2_over_beta2 = std::numbers::pi * std::numbers::pi / (beta_ * beta_);
  const double prefactor = kCoulombFactor / (std::numbers::pi * volume);
  double energy = 0;
  Mat3 w{};
  for (int a = 0; a < K0; ++a) {
    double mx = (a <= K0 / 2 ? a : a - K0) / box[0];
    for (int b = b_begin; b < b_end; ++b) {
      double my = (b <= K1 / 2 ? b : b - K1) / box[1];
      double bxy = inverse_moduli_[0][a] * inverse_moduli_[1][b];
      for (int c = 0; c < K2c; ++c) {
        double mz = c / box[2];
        double m2 = mx * mx + my * my + mz * mz;
        std::complex<double>& v = transformed[(static_cast<size_t>(a) * columns + (b - b_begin)) * K2c + c];
        if (m2 == 0) {
          v = 0;
          continue;
        }
        double eterm = prefactor * std::exp(-pi2_over_beta2 * m2) / m2 * bxy * inverse_moduli_[2][c];
        // The half-complex layout holds m_z and -m_z once: count the others twice.
        double weight = (c == 0 || (K2 % 2 == 0 && c == K2 / 2)) ? 1.0 : 2.0;
        double e_m = 0.5 * weight * eterm * (v.real() * v.real() + v.imag() * v.imag());
        energy += e_m;
        if (virial) {
          // Under a strain eps, V -> V (1 + tr eps) and m -> (1 - eps^T) m: W_ab = -dE/deps_ab.
          const Vec3 m{mx, my, mz};
          const double cm = 2 * (1 / m2 + pi2_over_beta2);
          for (int r = 0; r < 3; ++r)
            for (int t = 0; t < 3; ++t) w[r][t] += e_m * ((r == t ? 1.0 : 0.0) - cm * m[r] * m[t]);
        }
        v *= eterm;
      }
    }
  }
  if (virial) *virial += w;
  return energy;
}

}  // namespace kiln::md
