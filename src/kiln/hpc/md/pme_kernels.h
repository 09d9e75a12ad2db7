#pragma once
// The parts of smooth PME that the one-grid transform (pme.h) and the slab-decomposed one
// (pme_decomposition.h) share, so both compute the same terms in the same order: the B-spline
// weights of each atom, the charge spread, the reciprocal-space solve and the force gather.
#include <array>
#include <complex>
#include <vector>

#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// Per atom and dimension: the first grid index (plus K, kept non-negative for the modulo of the
// spread and gather) and the order weights and derivatives.
struct PmeSplines {
  std::vector<int> first_index;
  std::vector<double> theta, dtheta;

  // For x[0, atoms), u = K x / L wrapped into [0, K).
  void compute(const std::vector<Vec3>& x, const Vec3& box, const std::array<int, 3>& grid, int order, int atoms);
  // Atom i's `order` weights (and their derivatives) along dimension d.
  const double* weights(int i, int d, int order) const { return &theta[(3 * i + d) * order]; }
  const double* derivatives(int i, int d, int order) const { return &dtheta[(3 * i + d) * order]; }
  // The x-planes the B-splines of atom i's charge reach (periodic), marked 1 in `planes` (K0 entries).
  void mark_x_planes(int i, int order, int planes, unsigned char* marked) const;
};

// The spread and gather take `plane_slot` (K0 entries): the grid's global x-plane gx is stored as
// local plane plane_slot[gx], K1 * K2 reals in (y, z) row-major order. The one-grid transform's
// slots are 0..K0-1; a slab-decomposed rank's are the planes its atoms reach, and they must reach
// no other.

// Q(k) += sum_i q_i prod_d M_p(u_id - k_d) over x[0, atoms) (atoms with q = 0 are skipped).
void spread_charges(const PmeSplines& splines, const std::vector<double>& q, int atoms, const std::array<int, 3>& grid,
                    int order, const int* plane_slot, double* grid_values);

// F_i -= q_i sum_k grad(prod_d M_p)(k) C(k), for x[0, atoms), from the potential grid C.
void gather_forces(const PmeSplines& splines, const std::vector<double>& q, int atoms, const std::array<int, 3>& grid,
                   int order, const Vec3& box, const int* plane_slot, const double* potential,
                   std::vector<Vec3>& forces);

// The influence function: eterm(m) = f exp(-pi^2 m^2 / beta^2) / (pi V m^2) B(m), with the
// B-spline moduli B = prod_d |b_d(m_d)|^-2.
class PmeInfluence {
 public:
  // Refuses a grid below 2 * (order - 1) points in a dimension, naming it.
  PmeInfluence(std::array<int, 3> grid, int order, double beta);

  // Over the half-complex points m = (a, b, c), a in [0, K0), b in [b_begin, b_end), c in
  // [0, K2/2], stored [a][b - b_begin][c]: returns this block's share of E = 1/2 sum_m eterm |F(Q)|^2,
  // adds its virial to `virial` if given, and multiplies F(Q) by eterm (so the inverse transform
  // is dE/dQ). m = 0 is zeroed.
  double solve(std::complex<double>* transformed, const Vec3& box, int b_begin, int b_end, Mat3* virial) const;

 private:
  std::array<int, 3> grid_;
  double beta_;
  std::array<std::vector<double>, 3> inverse_moduli_;  // |b(m)|^-2 per dimension
};

}  // namespace kiln::md
