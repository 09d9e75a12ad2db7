#pragma once
// The reference's validation tests (TestCG, TestSymmetry, TestNorms) on any Engine.
#include <vector>

#include "kiln/hpc/hpcg/cg.h"

namespace kiln::hpcg {

struct SpectralTest {  // TestCG
  int expected_unpreconditioned = 12;
  int expected_preconditioned = 2;
  int max_unpreconditioned = 0;
  int max_preconditioned = 0;
  int passed = 0;
  int failed = 0;
};

struct SymmetryTest {  // TestSymmetry
  double departure_spmv = 0;
  double departure_mg = 0;
  std::vector<double> exact_solution_residuals;  // max |A xexact - b| per SpMV call
  int failed = 0;
};

struct NormsTest {  // TestNorms
  double mean = 0;
  double variance = 0;
  bool passed = false;
};

// CG on the matrix with an exaggerated diagonal, unpreconditioned then preconditioned, two calls
// each: at most 12 and 2 iterations to reach 1e-12.
SpectralTest test_cg(Engine& engine, CgWorkspace& work, Vector& b, Vector& x);

// |x'Ay - y'Ax| and |x'M^-1 y - y'M^-1 x| relative to machine precision for random x, y (at most
// 100 passes), and the residual of the exact solution through SpMV.
SymmetryTest test_symmetry(Engine& engine, const Vector& b, const Vector& xexact, unsigned seed);

// Mean and variance of the scaled residuals of the timed CG sets; passes below 1e-6.
NormsTest test_norms(const std::vector<double>& scaled_residuals);

}  // namespace kiln::hpcg
