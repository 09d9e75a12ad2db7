#include "kiln/hpc/md/engine.h"

#include "kiln/hpc/md/units.h"
#include "kiln/runtime/error.h"

namespace kiln::md {

std::vector<std::pair<std::string, double>> named_terms(const StepEnergies& e, const MdSystem& s) {
  std::vector<std::pair<std::string, double>> t;
  if (!s.bonds.empty()) t.emplace_back("Bond", e.bond);
  if (!s.angles.empty()) t.emplace_back("Angle", e.angle);
  if (!s.proper_dihedrals.empty()) t.emplace_back("Proper Dih.", e.proper_dih);
  if (!s.rb_dihedrals.empty()) t.emplace_back("Ryckaert-Bell.", e.rb_dih);
  if (!s.periodic_impropers.empty()) t.emplace_back("Per. Imp. Dih.", e.improper_dih);
  if (!s.pairs.empty()) {
    t.emplace_back("LJ-14", e.lj14);
    t.emplace_back("Coulomb-14", e.coulomb14);
  }
  t.emplace_back("LJ (SR)", e.lj);
  if (e.has_dispcorr) t.emplace_back("Disper. corr.", e.disp_corr);
  t.emplace_back("Coulomb (SR)", e.coulomb_sr);
  if (e.has_recip) t.emplace_back("Coul. recip.", e.coulomb_recip);
  t.emplace_back("Potential", e.potential);
  t.emplace_back("Kinetic En.", e.kinetic);
  t.emplace_back("Total Energy", e.total);
  t.emplace_back("Conserved En.", e.conserved);
  t.emplace_back("Temperature", e.temperature);
  if (e.has_dispcorr) t.emplace_back("Pres. DC", e.pres_dc);
  t.emplace_back("Pressure", e.pressure);
  if (!s.constraints.empty()) t.emplace_back("Constr. rmsd", e.constr_rmsd);
  if (e.has_box) {
    const double volume = e.box[0] * e.box[1] * e.box[2];
    double mass = 0;
    for (double m : s.masses) mass += m;
    const double pv = e.pressure * volume / kPressureFactor;  // kJ/mol
    t.emplace_back("Box-X", e.box[0]);
    t.emplace_back("Box-Y", e.box[1]);
    t.emplace_back("Box-Z", e.box[2]);
    t.emplace_back("Volume", volume);
    t.emplace_back("Density", mass * kAtomicMassUnitKg / (volume * 1e-27));  // kg/m^3
    t.emplace_back("pV", pv);
    t.emplace_back("Enthalpy", e.total + pv);
  }
  return t;
}

#if !KILN_WITH_CUDA
std::unique_ptr<MdEngine> make_cuda_engine(const MdSystem&, const EngineSettings&, MdState) {
  KILN_FAIL("mdrun: this build has no CUDA backend (configure with KILN_CUDA=ON); use --device cpu");
}
GpuForceResult cuda_force_evaluation(const MdSystem&, const EngineSettings&, const std::vector<Vec3>&, const Vec3&,
                                     const std::vector<Vec3>*) {
  KILN_FAIL("mdrun: this build has no CUDA backend (configure with KILN_CUDA=ON)");
}
#endif

}  // namespace kiln::md
