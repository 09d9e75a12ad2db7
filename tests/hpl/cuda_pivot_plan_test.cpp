// The GPU HPL's row interchanges as one permutation (build_pivot_plan + swap_gather, on a matrix
// stored by rows as the GPU solver keeps it) against the interchanges applied one by one on the CPU, with pivot
// sequences HPL's random matrices rarely produce: the same row below chosen several times, pivots inside the top block,
// no swap at all. Skipped without a GPU (and compiled to nothing without CUDA).
#include <gtest/gtest.h>

#if KILN_WITH_CUDA
#include <cuda_runtime.h>

#include <random>
#include <string>
#include <utility>
#include <vector>

#include "kiln/runtime/backend.h"
// After cuda_runtime.h, which gives it the CUDA runtime types.
#include "kiln/hpc/hpl/cuda/hpl_kernels.h"

namespace kiln::hpl {
namespace cuda_pivot_plan_test {

struct Case {
  std::string name;
  long m, j;
  int jb;
  long c0, c1;
  std::vector<int> pivots;  // global rows, one per k (>= j + k)
};

// A pivot sequence: `repeat` draws reuse an earlier row below, `inside` draws a row of the top.
std::vector<int> make_pivots(long m, long j, int jb, unsigned seed, double repeat, double inside) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0, 1);
  std::vector<int> p(jb);
  for (int k = 0; k < jb; ++k) {
    const long g = j + k;
    long row = g + static_cast<long>(u(rng) * static_cast<double>(m - g));
    if (k > 0 && u(rng) < repeat) {
      const long earlier = p[static_cast<int>(u(rng) * k)];
      if (earlier >= g) row = earlier;
    } else if (u(rng) < inside && g + 1 < j + jb) {
      row = g + 1 + static_cast<long>(u(rng) * static_cast<double>(j + jb - g - 1));
    }
    p[k] = static_cast<int>(std::min(row, m - 1));
  }
  return p;
}

template <class T>
T* device_copy(const std::vector<T>& host) {
  T* d = nullptr;
  EXPECT_EQ(cudaMalloc(&d, sizeof(T) * host.size()), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(d, host.data(), sizeof(T) * host.size(), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

TEST(HplCudaPivotPlan, GathersAndScattersLikeSequentialSwaps) {
  if (device_count(DeviceKind::CUDA) == 0) GTEST_SKIP() << "no CUDA GPU";
  const long m = 700, ld = 48, n = 40;  // m rows of n columns, row r at r * ld
  std::vector<Case> cases = {
      {"random", m, 100, 64, 3, 37, make_pivots(m, 100, 64, 1, 0.0, 0.0)},
      {"repeats below", m, 100, 64, 0, 40, make_pivots(m, 100, 64, 2, 0.5, 0.0)},
      {"inside the top", m, 0, 96, 5, 40, make_pivots(m, 0, 96, 3, 0.0, 0.5)},
      {"both", m, 300, 128, 1, 39, make_pivots(m, 300, 128, 4, 0.3, 0.3)},
      {"no swaps", m, 50, 32, 0, 40, {}},
      {"last rows", m, m - 20, 20, 0, 40, make_pivots(m, m - 20, 20, 5, 0.3, 0.3)},
  };
  for (int k = 0; k < 32; ++k) cases[4].pivots.push_back(static_cast<int>(50 + k));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    std::vector<double> a(static_cast<std::size_t>(ld) * m);
    for (long r = 0; r < m; ++r)
      for (long col = 0; col < ld; ++col) a[r * ld + col] = static_cast<double>(r * 1000 + col);
    std::vector<int> ipiv(static_cast<std::size_t>(c.j + c.jb), -1);
    for (int k = 0; k < c.jb; ++k) ipiv[c.j + k] = c.pivots[k];
    // Reference: the interchanges one by one on columns [c0, c1).
    std::vector<double> want = a;
    for (long col = c.c0; col < c.c1; ++col)
      for (int k = 0; k < c.jb; ++k) std::swap(want[(c.j + k) * ld + col], want[c.pivots[k] * ld + col]);

    double* d_a = device_copy(a);
    int* d_ipiv = device_copy(ipiv);
    int* d_plan = nullptr;
    double* d_w = nullptr;
    ASSERT_EQ(cudaMalloc(&d_plan, sizeof(int) * (1 + 3 * c.jb)), cudaSuccess);
    // W holds just columns [c0, c1), its rows ldw apart (a few more than the chunk's width).
    const long ldw = c.c1 - c.c0 + 3;
    ASSERT_EQ(cudaMalloc(&d_w, sizeof(double) * c.jb * ldw), cudaSuccess);
    ASSERT_EQ(cuda::build_pivot_plan(d_ipiv, c.j, c.jb, d_plan, nullptr), cudaSuccess);
    ASSERT_EQ(cuda::swap_gather(d_a, ld, c.jb, d_plan, d_w, ldw, c.c0, c.c1, nullptr), cudaSuccess);
    std::vector<double> got(a.size()), w(static_cast<std::size_t>(c.jb) * ldw);
    ASSERT_EQ(cudaMemcpy(got.data(), d_a, sizeof(double) * got.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(w.data(), d_w, sizeof(double) * w.size(), cudaMemcpyDeviceToHost), cudaSuccess);
    cudaFree(d_a);
    cudaFree(d_ipiv);
    cudaFree(d_plan);
    cudaFree(d_w);

    int wrong = 0;
    for (long col = 0; col < n; ++col)
      for (long r = 0; r < m; ++r) {
        const bool updated = col >= c.c0 && col < c.c1;
        const bool top = r >= c.j && r < c.j + c.jb;
        // The new top rows go to W (the matrix's top rows are overwritten by U12 later).
        double expect = updated ? want[r * ld + col] : a[r * ld + col];
        double actual = updated && top ? w[(r - c.j) * ldw + col - c.c0] : got[r * ld + col];
        if (actual != expect && ++wrong <= 5)
          ADD_FAILURE() << "row " << r << " column " << col << ": got " << actual << ", want " << expect;
      }
    EXPECT_EQ(wrong, 0);
  }
}

}  // namespace cuda_pivot_plan_test
}  // namespace kiln::hpl
#endif
