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
  void use_domain_decomposition(std::function<void(std::span<double>)> grid_sum, bool root);
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
  std::unique_ptr<Pme> pme_;  // none with reaction-field
  DispersionCorrection dispersion_;
};

}  // namespace kiln::md
