#include "kiln/hpc/md/engine.h"

#include "kiln/runtime/error.h"

namespace kiln::md {

std::vector<std::pair<std::string, double>> named_terms(const StepEnergies& e, bool has_bonds, bool has_angles) {
  std::vector<std::pair<std::string, double>> t;
  if (has_bonds) t.emplace_back("Bond", e.bond);
  if (has_angles) t.emplace_back("Angle", e.angle);
  t.emplace_back("LJ (SR)", e.lj);
  t.emplace_back("Coulomb (SR)", e.coulomb_sr);
  if (e.has_recip) t.emplace_back("Coul. recip.", e.coulomb_recip);
  t.emplace_back("Potential", e.potential);
  t.emplace_back("Kinetic En.", e.kinetic);
  t.emplace_back("Total Energy", e.total);
  t.emplace_back("Conserved En.", e.conserved);
  t.emplace_back("Temperature", e.temperature);
  t.emplace_back("Pressure", e.pressure);
  return t;
}

#if !KILN_WITH_CUDA
std::unique_ptr<MdEngine> make_cuda_engine(const MdSystem&, const EngineSettings&, MdState) {
  KILN_FAIL("mdrun: this build has no CUDA backend (configure with KILN_CUDA=ON); use --device cpu");
}
GpuForceResult cuda_force_evaluation(const MdSystem&, const EngineSettings&, const std::vector<Vec3>&, const Vec3&) {
  KILN_FAIL("mdrun: this build has no CUDA backend (configure with KILN_CUDA=ON)");
}
#endif

}  // namespace kiln::md
