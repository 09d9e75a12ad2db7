#pragma once
// Smooth particle-mesh Ewald, reciprocal part (Essmann et al. 1995), on the CPU with FFTW3:
// charges spread with cardinal B-splines of order p, a real-to-complex 3-D FFT, the influence
// function with the B-spline moduli, the inverse FFT and the force gather. Rectangular boxes.
#include <array>
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

class PmeInfluence;
struct PmeSplines;

class Pme {
 public:
  Pme(std::array<int, 3> grid, int order, double beta);
  ~Pme();
  Pme(const Pme&) = delete;
  Pme& operator=(const Pme&) = delete;

  // Adds the reciprocal forces and returns the reciprocal energy ("Coul. recip.", kJ/mol); adds
  // the reciprocal virial sum r (x) F (from the energy's strain derivative) to `virial` if given.
  // With `atoms` >= 0 only x[0, atoms) are spread and get forces (a rank's home atoms).
  double compute(const std::vector<Vec3>& x, const std::vector<double>& charges, const Vec3& box,
                 std::vector<Vec3>& forces, Mat3* virial = nullptr, int atoms = -1);

  // Domain decomposition: called on the real-space charge grid after the spread, to sum every
  // rank's charges into it before the transform (so each rank solves the whole system's grid).
  void set_grid_reduction(std::function<void(std::span<double>)> sum) { grid_sum_ = std::move(sum); }

  const std::array<int, 3>& grid() const { return grid_; }
  int order() const { return order_; }

 private:
  struct Plans;
  std::array<int, 3> grid_;
  int order_;
  std::unique_ptr<PmeInfluence> influence_;
  std::unique_ptr<Plans> plans_;
  std::unique_ptr<PmeSplines> splines_;
  std::vector<int> identity_slots_;  // x-plane gx is stored at gx (pme_kernels.h)
  std::function<void(std::span<double>)> grid_sum_;
};

// Cardinal B-spline weights M_p(w + p - 1 - k) for k = 0..p-1 and their derivatives, for a
// fractional offset w in [0, 1): weight k belongs to grid point floor(u) - p + 1 + k.
void bspline_weights(double w, int order, double* theta, double* dtheta);

// |b(m)|^2 = |sum_{k=0}^{p-2} M_p(k + 1) exp(2 pi i m k / K)|^2 for m = 0..K-1 (the influence
// function divides by it); at odd orders' zeros, the neighbours' mean (as Darden's code).
std::vector<double> bspline_moduli(int K, int order);

}  // namespace kiln::md
