#pragma once
// The reference kernels: HPCG 3.1's ComputeX_ref functions, on the reference's data structure
// (rows in natural order, each with its nonzeros listed compactly in stencil order). They are the
// twins every optimised kernel is tested against, the kernels of `--kernels ref`, and the
// definition of what the optimised ones must compute. Plain loops, no tricks: keep them frozen.
#include <cstdint>
#include <span>
#include <vector>

#include "kiln/hpc/hpcg/geometry.h"
#include "kiln/hpc/hpcg/halo_plan.h"
#include "kiln/hpc/hpcg/layout.h"

namespace kiln::hpcg {

struct RefMatrix {
  LevelLayout layout;  // natural ordering
  HaloPlan halo;
  std::vector<std::uint8_t> nonzeros_in_row;
  std::vector<int> columns;         // nrow * 27, the first nonzeros_in_row[i] used
  std::vector<double> values;       // nrow * 27
  std::vector<int> diagonal;        // position of row i's diagonal in columns/values
  std::vector<int> fine_of_coarse;  // for levels with a coarser one: coarse row -> fine row (injection)
  std::vector<double> rhs;          // b of the reference problem (exact solution: ones)
  std::int64_t local_nonzeros = 0;
};

// GenerateProblem + SetupHalo for one level (fine_of_coarse filled when `coarse` is given).
RefMatrix generate_ref_matrix(const Geometry& geometry, const Geometry* coarse);

// Fills x's halo points from the neighbours (the reference's ExchangeHalo).
void exchange_halo_ref(const RefMatrix& A, std::span<double> x);

// y = A x; x must hold ncol values (its halo is exchanged here).
void compute_spmv_ref(const RefMatrix& A, std::span<double> x, std::span<double> y);
// One symmetric Gauss-Seidel sweep, forward then backward in natural order.
void compute_symgs_ref(const RefMatrix& A, std::span<const double> r, std::span<double> x);
// rc = (r - Ax)[fine_of_coarse]: the reference's ComputeRestriction_ref given Axf.
void compute_restriction_ref(const RefMatrix& A, std::span<const double> r, std::span<const double> ax,
                             std::span<double> rc);
// x[fine_of_coarse] += xc.
void compute_prolongation_ref(const RefMatrix& A, std::span<const double> xc, std::span<double> x);
// Local part of x.y (the caller sums over the processes).
double compute_dot_product_ref(int n, std::span<const double> x, std::span<const double> y);
// w = alpha x + beta y.
void compute_waxpby_ref(int n, double alpha, std::span<const double> x, double beta, std::span<const double> y,
                        std::span<double> w);

}  // namespace kiln::hpcg
