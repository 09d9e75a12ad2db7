#pragma once
// HPL on CPUs: the matrix block-cyclic over a P x Q process grid, OpenBLAS for the local BLAS.
#include <cstddef>
#include <vector>

#include "kiln/dist/process_grid.h"
#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/run_result.h"

namespace kiln::hpl {

// Runs one HPL solve (generate, factor + solve timed, check). Collective over grid.all(); call it
// only on processes with grid.in_grid(). Every process gets the same result.
RunResult solve_on_cpu(const RunConfig& run, const dist::ProcessGrid& grid);

// HPL's scaled residual check of x (all N entries, on every process): ||Ax-b||_oo / (eps
// (||A||_oo ||x||_oo + ||b||_oo) N) with A and b generated again from the run's seed, passed when
// finite and below run.threshold. What solve_on_cpu reports; its own function so that a test can
// show a wrong x fails it. Collective over grid.all().
RunResult check_cpu_solution(const RunConfig& run, const dist::ProcessGrid& grid, const std::vector<double>& x);

// Bytes one process of the grid needs for a run (its part of [A|b] plus the work buffers).
std::size_t cpu_bytes_per_process(const RunConfig& run, int my_row, int my_col);

}  // namespace kiln::hpl
