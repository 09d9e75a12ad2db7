#pragma once
// What one HPL run reports: its time and the inputs of the scaled residual check; and what one
// kernel configuration of a GPU peer measured.
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace kiln::hpl {

struct RunResult {
  double seconds = 0;   // factorisation + back-substitution, wall clock, slowest process
  double gflops = 0;    // (2/3 N^3 + 3/2 N^2) / seconds / 1e9
  double residual = 0;  // ||Ax-b||_oo / (eps * (||A||_oo * ||x||_oo + ||b||_oo) * N)
  double norm_r = 0;    // ||Ax-b||_oo
  double norm_a = 0;    // ||A||_oo
  double norm_x = 0;    // ||x||_oo
  double norm_b = 0;    // ||b||_oo
  bool passed = false;  // residual < threshold (and finite)
};

// One configuration of the trailing-update DGEMM peer (`kiln hpl --peer update-algos`).
struct PeerAlgo {
  std::string config;  // "cublasDgemm" or the candidate's cuBLASLt configuration
  double tflops = 0;
};

// max(m, |v|) that keeps a NaN. std::max drops one (NaN < m is false), and with it a NaN in x or in
// Ax-b vanished from the norms: a NaN solution passed the residual check.
inline double max_abs_keeping_nan(double m, double v) {
  double a = std::fabs(v);
  return std::isnan(m) || std::isnan(a) ? std::numeric_limits<double>::quiet_NaN() : std::max(m, a);
}

// HPL's operation count for an order-n solve.
inline double hpl_flops(double n) { return 2.0 / 3.0 * n * n * n + 1.5 * n * n; }

}  // namespace kiln::hpl
