#pragma once
// HPL on CPUs: the matrix block-cyclic over a P x Q process grid, OpenBLAS for the local BLAS.
#include <cstddef>

#include "kiln/dist/process_grid.h"
#include "kiln/hpc/hpl/hpl_params.h"
#include "kiln/hpc/hpl/run_result.h"

namespace kiln::hpl {

// Runs one HPL solve (generate, factor + solve timed, check). Collective over grid.all(); call it
// only on processes with grid.in_grid(). Every process gets the same result.
RunResult solve_on_cpu(const RunConfig& run, const dist::ProcessGrid& grid);

// Bytes one process of the grid needs for a run (its part of [A|b] plus the work buffers).
std::size_t cpu_bytes_per_process(const RunConfig& run, int my_row, int my_col);

}  // namespace kiln::hpl
