#include "kiln/hpc/md/ewald_parameters.h"

#include <algorithm>
#include <cmath>

#include "kiln/runtime/error.h"

namespace kiln::md {

double ewald_coefficient(double cutoff, double rtol) {
  // Double beta until erfc falls below rtol, then bisect 60 times more than that took.
  double beta = 5;
  int doublings = 0;
  do {
    ++doublings;
    beta *= 2;
  } while (std::erfc(beta * cutoff) > rtol);
  double low = 0, high = beta;
  for (int i = 0; i < doublings + 60; ++i) {
    beta = 0.5 * (low + high);
    if (std::erfc(beta * cutoff) > rtol)
      low = beta;
    else
      high = beta;
  }
  return beta;
}

std::array<int, 3> pme_grid_size(const Vec3& box, double spacing, int pme_order, const std::array<int, 3>& given) {
  // Sizes FFTW handles fast: a short list for small grids, and above it a base times a power of
  // two, keeping only multiples of 4 (and 90), as GROMACS does.
  static constexpr int small_sizes[] = {6, 8, 10, 12, 14, 16, 20, 24, 25, 28, 32, 36, 40, 42, 44};
  static constexpr int bases[] = {45, 48, 50, 52, 54, 56, 60, 64, 70, 72, 75, 80, 81, 84};
  KILN_CHECK(spacing > 0, "fourierspacing {} must be positive", spacing);
  std::array<int, 3> n{};
  for (int d = 0; d < 3; ++d) {
    if (given[d] > 0) {
      KILN_CHECK(given[d] >= 2 * (pme_order - 1), "fourier-n{} = {} is below 2 * (pme-order - 1) = {}", "xyz"[d],
                 given[d], 2 * (pme_order - 1));
      n[d] = given[d];
      continue;
    }
    int nmin = std::max(static_cast<int>(box[d] / spacing + 0.999), 2 * (pme_order - 1));
    if (nmin <= small_sizes[std::size(small_sizes) - 1]) {
      n[d] = *std::find_if(std::begin(small_sizes), std::end(small_sizes), [&](int s) { return s >= nmin; });
      continue;
    }
    int fac2 = 1;
    while (fac2 * bases[std::size(bases) - 1] < nmin) fac2 *= 2;
    // The smallest allowed candidate >= nmin among fac2 * base for all bases but the first.
    for (int i = static_cast<int>(std::size(bases)) - 1; i > 0; --i) {
      int attempt = fac2 * bases[i];
      if (((attempt % 4 == 0 && attempt != 140) || attempt == 90) && attempt >= nmin) n[d] = attempt;
    }
  }
  return n;
}

}  // namespace kiln::md
