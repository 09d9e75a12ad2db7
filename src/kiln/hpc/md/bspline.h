#pragma once
// Cardinal B-spline weights of PME, shared by the CPU (pme.cpp) and GPU (cuda/kernels.cu) code.
#include "kiln/hpc/md/host_device.h"

namespace kiln::md {

// Weights M_p(w + p - 1 - k) for k = 0..p-1 and their derivatives, for a fractional offset w in
// [0, 1): weight k belongs to grid point floor(u) - p + 1 + k. The recursion
// M_k(u) = (u M_{k-1}(u) + (k - u) M_{k-1}(u - 1)) / (k - 1) is kept for the n points around u, up
// to order n - 1; the derivative of order n is a difference of those.
template <class Real>
KILN_MD_HD void bspline_weights_of(Real w, int n, Real* theta, Real* dtheta) {
  for (int k = 0; k < n; ++k) theta[k] = 0;
  theta[1] = w;
  theta[0] = 1 - w;
  for (int k = 3; k <= n - 1; ++k) {
    Real div = Real(1) / (k - 1);
    theta[k - 1] = div * w * theta[k - 2];
    for (int j = 1; j <= k - 2; ++j)
      theta[k - j - 1] = div * ((w + j) * theta[k - j - 2] + (k - j - w) * theta[k - j - 1]);
    theta[0] = div * (1 - w) * theta[0];
  }
  dtheta[0] = -theta[0];
  for (int j = 1; j < n; ++j) dtheta[j] = theta[j - 1] - theta[j];
  Real div = Real(1) / (n - 1);
  theta[n - 1] = div * w * theta[n - 2];
  for (int j = 1; j <= n - 2; ++j)
    theta[n - j - 1] = div * ((w + j) * theta[n - j - 2] + (n - j - w) * theta[n - j - 1]);
  theta[0] = div * (1 - w) * theta[0];
}

}  // namespace kiln::md
