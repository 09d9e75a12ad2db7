#include "kiln/hpc/md/pme.h"

#include <fftw3.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "kiln/hpc/md/bspline.h"
#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

void bspline_weights(double w, int n, double* theta, double* dtheta) { bspline_weights_of(w, n, theta, dtheta); }

// |b(m)|^-2 = |sum_{k=0}^{p-2} M_p(k + 1) exp(2 pi i m k / K)|^2 for m = 0..K-1.
std::vector<double> bspline_moduli(int K, int order) {
  std::vector<double> theta(order), dtheta(order);
  bspline_weights(0.0, order, theta.data(), dtheta.data());
  // With w = 0, theta[k] = M_p(p - 1 - k): the values M_p(1..p-1) in reverse.
  std::vector<double> m_values(order, 0.0);  // m_values[k] = M_p(k + 1)
  for (int k = 0; k < order - 1; ++k) m_values[k] = theta[order - 2 - k];
  std::vector<double> mod(K);
  for (int m = 0; m < K; ++m) {
    std::complex<double> s = 0;
    for (int k = 0; k < order - 1; ++k) s += m_values[k] * std::polar(1.0, 2 * std::numbers::pi * m * k / K);
    mod[m] = std::norm(s);
  }
  // Odd orders vanish at m = K/2: take the neighbours' mean there, as Darden's code does.
  for (int m = 0; m < K; ++m)
    if (mod[m] < 1e-7) mod[m] = 0.5 * (mod[(m - 1 + K) % K] + mod[(m + 1) % K]);
  return mod;
}

struct Pme::Plans {
  int n0, n1, n2, n2c;
  double* real = nullptr;
  fftw_complex* complex = nullptr;
  fftw_plan forward = nullptr, backward = nullptr;
  Plans(int a, int b, int c) : n0(a), n1(b), n2(c), n2c(c / 2 + 1) {
    real = fftw_alloc_real(static_cast<size_t>(n0) * n1 * n2);
    complex = fftw_alloc_complex(static_cast<size_t>(n0) * n1 * n2c);
    KILN_CHECK(real != nullptr && complex != nullptr, "PME: cannot allocate the {}x{}x{} grid", n0, n1, n2);
    forward = fftw_plan_dft_r2c_3d(n0, n1, n2, real, complex, FFTW_ESTIMATE);
    backward = fftw_plan_dft_c2r_3d(n0, n1, n2, complex, real, FFTW_ESTIMATE);
    KILN_CHECK(forward != nullptr && backward != nullptr, "PME: FFTW could not plan a {}x{}x{} transform", n0, n1, n2);
  }
  ~Plans() {
    if (forward) fftw_destroy_plan(forward);
    if (backward) fftw_destroy_plan(backward);
    fftw_free(real);
    fftw_free(complex);
  }
};

Pme::Pme(std::array<int, 3> grid, int order, double beta) : grid_(grid), order_(order), beta_(beta) {
  for (int d = 0; d < 3; ++d) {
    KILN_CHECK(grid[d] >= 2 * (order - 1), "PME grid {} in {} is below 2 * (pme-order - 1)", grid[d], "xyz"[d]);
    auto mod = bspline_moduli(grid[d], order);
    bspline_moduli_[d].resize(grid[d]);
    for (int m = 0; m < grid[d]; ++m) bspline_moduli_[d][m] = 1.0 / mod[m];
  }
  plans_ = std::make_unique<Plans>(grid[0], grid[1], grid[2]);
}

Pme::~Pme() = default;

double Pme::compute(const std::vector<Vec3>& x, const std::vector<double>& q, const Vec3& box,
                    std::vector<Vec3>& forces, Mat3* virial, int atoms) {
  const int n = atoms < 0 ? static_cast<int>(x.size()) : atoms, p = order_;
  const int K0 = grid_[0], K1 = grid_[1], K2 = grid_[2];
  Plans& pl = *plans_;
  first_index_.resize(3 * n);
  theta_.resize(3 * n * p);
  dtheta_.resize(3 * n * p);
  std::fill(pl.real, pl.real + static_cast<size_t>(K0) * K1 * K2, 0.0);
  // Spread: Q(k) = sum_i q_i prod_d M_p(u_id - k_d), u = K x / L (wrapped into [0, K)).
  for (int i = 0; i < n; ++i) {
    for (int d = 0; d < 3; ++d) {
      double f = x[i][d] / box[d];
      f -= std::floor(f);
      double u = f * grid_[d];
      int iu = static_cast<int>(u);
      if (iu >= grid_[d]) iu = grid_[d] - 1;  // f rounded up to 1
      bspline_weights(u - iu, p, &theta_[(3 * i + d) * p], &dtheta_[(3 * i + d) * p]);
      first_index_[3 * i + d] = iu - p + 1 + grid_[d];  // kept non-negative for the modulo below
    }
    if (q[i] == 0) continue;
    const double* tx = &theta_[(3 * i + 0) * p];
    const double* ty = &theta_[(3 * i + 1) * p];
    const double* tz = &theta_[(3 * i + 2) * p];
    for (int a = 0; a < p; ++a) {
      int gx = (first_index_[3 * i] + a) % K0;
      double wa = q[i] * tx[a];
      for (int b = 0; b < p; ++b) {
        int gy = (first_index_[3 * i + 1] + b) % K1;
        double wab = wa * ty[b];
        double* row = pl.real + (static_cast<size_t>(gx) * K1 + gy) * K2;
        for (int c = 0; c < p; ++c) row[(first_index_[3 * i + 2] + c) % K2] += wab * tz[c];
      }
    }
  }
  if (grid_sum_) grid_sum_(std::span<double>(pl.real, static_cast<size_t>(K0) * K1 * K2));
  fftw_execute(pl.forward);
  // Solve: E = 1/2 sum_m eterm(m) |F(Q)(m)|^2 with eterm = f exp(-pi^2 m^2 / beta^2) / (pi V m^2) B(m);
  // then F(Q) *= eterm so that the inverse transform gives the convolution dE/dQ.
  const double volume = box[0] * box[1] * box[2];
  const double pi2_over_beta2 = std::numbers::pi * std::numbers::pi / (beta_ * beta_);
  const double prefactor = kCoulombFactor / (std::numbers::pi * volume);
  double energy = 0;
  Mat3 w{};
  for (int a = 0; a < K0; ++a) {
    double mx = (a <= K0 / 2 ? a : a - K0) / box[0];
    for (int b = 0; b < K1; ++b) {
      double my = (b <= K1 / 2 ? b : b - K1) / box[1];
      double bxy = bspline_moduli_[0][a] * bspline_moduli_[1][b];
      for (int c = 0; c < pl.n2c; ++c) {
        double mz = c / box[2];
        double m2 = mx * mx + my * my + mz * mz;
        fftw_complex& v = pl.complex[(static_cast<size_t>(a) * K1 + b) * pl.n2c + c];
        if (m2 == 0) {
          v[0] = v[1] = 0;
          continue;
        }
        double eterm = prefactor * std::exp(-pi2_over_beta2 * m2) / m2 * bxy * bspline_moduli_[2][c];
        // The half-complex layout holds m_z and -m_z once: count the others twice.
        double weight = (c == 0 || (K2 % 2 == 0 && c == K2 / 2)) ? 1.0 : 2.0;
        double e_m = 0.5 * weight * eterm * (v[0] * v[0] + v[1] * v[1]);
        energy += e_m;
        if (virial) {
          // Under a strain eps, V -> V (1 + tr eps) and m -> (1 - eps^T) m: W_ab = -dE/deps_ab.
          const Vec3 m{mx, my, mz};
          const double c = 2 * (1 / m2 + pi2_over_beta2);
          for (int r = 0; r < 3; ++r)
            for (int s = 0; s < 3; ++s) w[r][s] += e_m * ((r == s ? 1.0 : 0.0) - c * m[r] * m[s]);
        }
        v[0] *= eterm;
        v[1] *= eterm;
      }
    }
  }
  if (virial) *virial += w;
  fftw_execute(pl.backward);
  // Gather: F_i = -q_i sum_k grad(prod_d M_p) * C(k).
  for (int i = 0; i < n; ++i) {
    if (q[i] == 0) continue;
    const double* tx = &theta_[(3 * i + 0) * p];
    const double* ty = &theta_[(3 * i + 1) * p];
    const double* tz = &theta_[(3 * i + 2) * p];
    const double* dx = &dtheta_[(3 * i + 0) * p];
    const double* dy = &dtheta_[(3 * i + 1) * p];
    const double* dz = &dtheta_[(3 * i + 2) * p];
    double fx = 0, fy = 0, fz = 0;
    for (int a = 0; a < p; ++a) {
      int gx = (first_index_[3 * i] + a) % K0;
      for (int b = 0; b < p; ++b) {
        int gy = (first_index_[3 * i + 1] + b) % K1;
        const double* row = pl.real + (static_cast<size_t>(gx) * K1 + gy) * K2;
        for (int c = 0; c < p; ++c) {
          double g = row[(first_index_[3 * i + 2] + c) % K2];
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
  return energy;
}

}  // namespace kiln::md
