#include "kiln/hpc/md/pme.h"

#include <fftw3.h>

#include <cmath>
#include <complex>
#include <numbers>

#include "kiln/hpc/md/bspline.h"
#include "kiln/hpc/md/pme_kernels.h"
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

Pme::Pme(std::array<int, 3> grid, int order, double beta)
    : grid_(grid),
      order_(order),
      influence_(std::make_unique<PmeInfluence>(grid, order, beta)),
      plans_(std::make_unique<Plans>(grid[0], grid[1], grid[2])),
      splines_(std::make_unique<PmeSplines>()),
      identity_slots_(grid[0]) {
  for (int gx = 0; gx < grid[0]; ++gx) identity_slots_[gx] = gx;
}

Pme::~Pme() = default;

double Pme::compute(const std::vector<Vec3>& x, const std::vector<double>& q, const Vec3& box,
                    std::vector<Vec3>& forces, Mat3* virial, int atoms) {
  const int n = atoms < 0 ? static_cast<int>(x.size()) : atoms;
  const int K0 = grid_[0], K1 = grid_[1], K2 = grid_[2];
  Plans& pl = *plans_;
  std::fill(pl.real, pl.real + static_cast<size_t>(K0) * K1 * K2, 0.0);
  splines_->compute(x, box, grid_, order_, n);
  spread_charges(*splines_, q, n, grid_, order_, identity_slots_.data(), pl.real);
  if (grid_sum_) grid_sum_(std::span<double>(pl.real, static_cast<size_t>(K0) * K1 * K2));
  fftw_execute(pl.forward);
  const double energy = influence_->solve(reinterpret_cast<std::complex<double>*>(pl.complex), box, 0, K1, virial);
  fftw_execute(pl.backward);
  gather_forces(*splines_, q, n, grid_, order_, box, identity_slots_.data(), pl.real, forces);
  return energy;
}

}  // namespace kiln::md
