#pragma once
// Launchers of the HPCG GPU kernels (kernels.cu). Plain C++ signatures, so the host code
// (cuda_engine.cpp, cusparse_peer.cpp) is compiled by the host compiler with the vendor header and
// fmt, and kernels.cu needs neither (nvcc's front end cannot compile fmt's C++20 code). Streams
// are passed as void* (a cudaStream_t); every launcher is followed by KILN_CUDA_CHECK_LAUNCH().
#include <cstdint>

#include "kiln/hpc/hpcg/layout.h"

namespace kiln::hpcg::gpu {

inline constexpr int kReduceBlocks = 1024;  // fixed, so reductions always add in the same order

void generate(const LevelLayout& L, double* values, int* columns, double* rhs, void* stream);
void spmv(int nrow, const double* values, const int* columns, const double* x, double* y, void* stream);
// Gauss-Seidel update of rows first..first+count-1, or of rows[first..first+count-1], reading only
// the slots in `slots` (the others multiply zeros: see lower_colour_slots).
void relax(int first, int count, const int* rows, unsigned slots, const double* values, const int* columns,
           const double* r, double* x, void* stream);
// rc[coarse_of_injected[q]] = (r - A x)[first + q]; x[first + q] += xc[coarse_of_injected[q]].
void residual_restriction(int first, int ncoarse, const int* coarse_of_injected, const double* values,
                          const int* columns, const double* r, const double* x, double* rc, void* stream);
// out[q] = coarse_of_injected(coarse, q) for q < n.
void fill_coarse_of_injected(const LevelLayout& coarse, int n, int* out, void* stream);
void prolongation(int first, int ncoarse, const int* coarse_of_injected, const double* xc, double* x, void* stream);
void waxpby(int n, double alpha, const double* x, double beta, const double* y, double* w, void* stream);
void fill(std::int64_t n, double value, double* v, void* stream);
// Reductions: kReduceBlocks partials, then finish() into *out (device).
void dot_partials(int n, const double* x, const double* y, double* partial, void* stream);
void cg_update_partials(int n, double alpha, const double* p, const double* ap, double* x, double* r, double* partial,
                        void* stream);
void max_abs_difference_partials(int n, const double* a, const double* b, double* partial, void* stream);
void finish(const double* partial, double* out, bool take_max, void* stream);
void gather(int n, const int* rows, const double* x, double* out, void* stream);
void exaggerate_diagonal(const LevelLayout& L, double* values, double* saved, double* b, void* stream);
void restore_diagonal(int nrow, double* values, const double* saved, void* stream);

// The cuSPARSE peer's natural-order CSR of a one-process nx x ny x nz problem, and A*ones.
void generate_csr(int nx, int ny, int nz, int* offsets, int* columns, double* values, double* expected, void* stream);
void generate_csr(int nx, int ny, int nz, std::int64_t* offsets, std::int64_t* columns, double* values,
                  double* expected, void* stream);
// *out_bits = bits of max |a - b| (non-negative doubles order like their bit patterns); zero it first.
void max_abs_difference_bits(std::int64_t n, const double* a, const double* b, unsigned long long* out_bits,
                             void* stream);

}  // namespace kiln::hpcg::gpu
