#pragma once
// The CPU engine's force evaluation, also used on its own for single-point energies (tests).
#include <memory>
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
  const PairList& pair_list() const { return list_; }
  // sum r (x) F of the last compute() (pairs, PME, bonded; not constraints), kJ/mol.
  const Mat3& virial() const { return virial_; }

 private:
  const MdSystem& system_;
  EngineSettings settings_;
  PairList list_;
  Mat3 virial_{};
  std::unique_ptr<Pme> pme_;  // none with reaction-field
  DispersionCorrection dispersion_;
};

}  // namespace kiln::md
