#pragma once
// The HPCG benchmark run (the reference's main.cpp): setup, reference timing, validation,
// optimised setup, timed CG sets, rating. Rank 0 writes the report.
#include <array>
#include <optional>
#include <string>
#include <vector>

#include "kiln/dist/communicator.h"
#include "kiln/hpc/hpcg/engine.h"
#include "kiln/hpc/hpcg/hpcg_params.h"
#include "kiln/hpc/hpcg/validation.h"
#include "kiln/runtime/device.h"

namespace kiln::hpcg {

// Checks what needs no process or device: the local box (check_local_dimensions) and the run time
// (finite, 0 <= rt <= kMaxRunSeconds); throws naming the value. run_hpcg calls it first.
void check_params(const HpcgParams& params);

// Bytes one process holds for a local nx x ny x nz box: every level's sliced-ELL matrix (27 slots
// of 8 + 4 bytes a row) and injection map, the coarse levels' two V-cycle vectors, and the dozen
// fine-level vectors CG, the validation and the timing keep at once.
double estimated_bytes_per_process(int nx, int ny, int nz);

// Empty when the report directory can be created and written (a probe file is created and
// removed); else why not.
std::string report_dir_problem(const std::string& dir);

// Wall-clock seconds of each part of `kiln hpcg` (what --rt counts and what it does not).
struct PhaseSeconds {
  double setup = 0;         // problem generation and the engine's layout
  double validation = 0;    // reference SpMV+MG timing, reference CG, spectral and symmetry tests
  double optimization = 0;  // the optimised CG that sets the iterations per set
  double timed = 0;         // the timed sets: the phase --rt sets (sets run until it has passed)
  double profile = 0;       // one extra set with every kernel timed
  double bandwidth = 0;     // the copy-bandwidth measurement
  double total = 0;
};

struct HpcgResults {
  HpcgParams params;
  Geometry geometry;
  int processes = 1;
  std::string engine;
  std::string device_name;
  std::vector<std::int64_t> rows, nonzeros;  // global, per level
  double matrix_bytes = 0;                   // all ranks
  double setup_seconds = 0;                  // times[9]: problem generation and optimisation
  double optimization_seconds = 0;           // times[7]
  double reference_spmv_mg_seconds = 0;      // times[8]
  int ref_iterations = 50;
  double ref_tolerance = 0;
  int opt_iterations = 0;  // per timed set
  int tolerance_failures = 0;
  int cg_sets = 0;
  CgTimes timed;  // the timed phase (times[0..5])
  SpectralTest spectral;
  SymmetryTest symmetry;
  NormsTest norms;
  KernelProfile profile;  // one extra profiled set
  int profiled_iterations = 0;
  PhaseSeconds phases;
  // The bandwidth bound holds for data streamed from memory: it is not a bound when the working
  // set (all the data of the processes sharing one last-level cache) fits in that cache.
  double working_set_bytes = 0;  // per last-level cache
  double cache_bytes = 0;        // the last-level cache (0: unknown)
  bool bound_applies() const;
  bool valid() const;
  // Floating-point operations of the timed phase: as executed and credited at 50 per set.
  double flops() const;
  double credited_flops() const;
  double rating_gflops() const;  // the official rating (with convergence and setup overhead)
  // The bandwidth bound: the reference's flops per iteration over the bytes an iteration moves,
  // at the copy bandwidth. Two byte counts:
  //  - kernel_bytes_per_iteration: each kernel as HPCG specifies it (every SymGS sweep, SpMV and
  //    fine residual passes over the whole matrix at 12 B a nonzero; each vector once): the bound
  //    the rating is held to (about 640 GFLOP/s at 4.1 TB/s);
  //  - bytes_per_iteration: what Kiln's algorithm must move (residual at the injected points
  //    only, forward sweeps from zero reading half the slots): a stricter, higher bound.
  double kernel_bytes_per_iteration() const;
  double bytes_per_iteration() const;
  double flops_per_iteration() const;
  double bound_gflops() const;         // with kernel_bytes_per_iteration
  double strict_bound_gflops() const;  // with bytes_per_iteration
};

HpcgResults run_hpcg(const HpcgParams& params, const dist::Communicator& comm);

// The reference's report (a YAML-like .txt) on rank 0; returns its path. Written under a temporary
// name, flushed, synced and renamed, every step checked: a full disk is an error naming the file,
// never a cut report.
std::string write_report(const HpcgResults& results);
// The summary printed on stdout.
std::string summary(const HpcgResults& results);

}  // namespace kiln::hpcg
