#pragma once
// The CPU engine's force evaluation, also used on its own for single-point energies (tests).
#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "kiln/hpc/md/dispersion_correction.h"
#include "kiln/hpc/md/engine.h"
#include "kiln/hpc/md/nonbonded.h"
#include "kiln/hpc/md/pair_list.h"
#include "kiln/hpc/md/pme.h"
#include "kiln/hpc/md/pme_decomposition.h"

namespace kiln::md {

class CpuForceField {
 public:
  CpuForceField(const MdSystem& system, const EngineSettings& settings);
  // Forces (overwritten) and the potential terms of `energies` at positions x, with the dispersion
  // correction for this box (energy and Pres. DC; the caller adds pres_dc to its pressure). The pair
  // list must have been built (build_pair_list) for positions close enough to x.
  void compute(const std::vector<Vec3>& x, const Vec3& box, std::vector<Vec3>& forces, StepEnergies& energies);
  void build_pair_list(const std::vector<Vec3>& x, const Vec3& box);
  // Domain decomposition: from now on the system is a rank's local one (domain_decomposition.h),
  // atoms [0, home_count) its own; PME spreads and gathers those and sums its grid through
  // `grid_sum`; the whole-system terms (PME's energy and virial, the dispersion correction) count on
  // the root rank only, so that the sum over ranks has them once.
  void use_local_system(const MdSystem& local, int home_count);
  // `ranks`: how many share the grid (for the bytes counted, pme_counters).
  void use_domain_decomposition(std::function<void(std::span<double>)> grid_sum, bool root, int ranks);
  // Slab-decomposed PME instead (pme_decomposition.h): every rank computes its share of the
  // reciprocal energy and virial, and the forces on its home atoms. Collective over `comm`.
  // `slab_axis`: the planes' normal (0, 1, 2).
  void use_slab_pme(const dist::Communicator& comm, int slab_axis);
  // PME's calls, wall seconds and bytes sent to other ranks on this rank so far (replicated: what a
  // bandwidth-optimal all-reduce of the grid sends from each rank, 2 (ranks - 1) / ranks of it, a
  // call; one rank: none).
  struct PmeCounters {
    std::int64_t calls = 0;
    double seconds = 0;
    std::int64_t bytes_sent = 0;
  };
  const PmeCounters& pme_counters() const { return pme_counters_; }
  const PairList& pair_list() const { return list_; }
  // sum r (x) F of the last compute() (pairs, PME, bonded; not constraints), kJ/mol.
  const Mat3& virial() const { return virial_; }

 private:
  const MdSystem* system_;
  EngineSettings settings_;
  int home_count_ = -1;
  bool counts_global_terms_ = true;
  PairList list_;
  Mat3 virial_{};
  std::unique_ptr<Pme> pme_;           // none with reaction-field
  std::unique_ptr<SlabPme> slab_pme_;  // instead of pme_ under slab-decomposed PME
  std::int64_t replicated_grid_bytes_ = 0;
  PmeCounters pme_counters_;
  DispersionCorrection dispersion_;
};

}  // namespace kiln::md
