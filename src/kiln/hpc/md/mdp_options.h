#pragma once
// The .mdp run parameters kiln mdrun supports, with GROMACS's defaults. Anything else in the file is
// refused naming the option and its line (a handful that only steer GROMACS's own output, such as
// nstlog, are accepted and have no effect; docs/mdrun.md lists them).
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "kiln/hpc/md/crescale.h"

namespace kiln::md {

enum class Thermostat { None, VRescale };
enum class ComMode { Linear, None };
enum class CoulombType { Pme, ReactionField };
// GROMACS's DispCorr: the long-range LJ correction of energy (Ener), energy and pressure (EnerPres),
// and with All also of the repulsion (dispersion_correction.h).
enum class DispCorr { No, EnerPres, Ener, AllEnerPres, AllEner };

struct MdpOptions {
  std::string source = "<defaults>";  // file name, for messages
  double dt = 0.001;                  // ps
  std::int64_t nsteps = 0;
  double tinit = 0.0;
  int nstlist = 10;
  double verlet_buffer_tolerance = 0.005;  // kJ/mol/ps per atom; -1: rlist as given
  double rlist = 1.0;
  double rcoulomb = 1.0;
  double rvdw = 1.0;
  CoulombType coulombtype = CoulombType::Pme;
  double epsilon_rf = 0.0;  // reaction-field dielectric; 0 = infinity (GROMACS's default)
  DispCorr dispcorr = DispCorr::No;
  double fourierspacing = 0.12;
  int fourier_n[3] = {0, 0, 0};  // 0: from fourierspacing
  int pme_order = 4;
  double ewald_rtol = 1e-5;
  Thermostat tcoupl = Thermostat::None;
  double tau_t = 0.1;
  double ref_t = 300.0;
  int nstenergy = 1000;
  int nstcalcenergy = 100;
  int nstcomm = 100;
  ComMode comm_mode = ComMode::Linear;
  bool gen_vel = false;
  double gen_temp = 300.0;
  std::int64_t gen_seed = -1;
  std::int64_t ld_seed = -1;
  bool continuation = false;
  bool pressure_coupling = false;  // pcoupl = c-rescale (isotropic)
  CRescale crescale;
  bool h_bond_constraints = false;  // constraints = h-bonds (LINCS)
  int lincs_order = 4, lincs_iter = 1;
  std::vector<std::string> defines;  // from `define = -DNAME[=value] ...`, for the topology
  // Energies every nstenergy steps are also checked for atoms with forces above this (kJ/mol/nm):
  // overlapping atoms stop the run with their numbers before the integration produces NaNs.
  double max_force = 1e7;
  // Trajectory output intervals in steps (0: none): compressed positions (.xtc) at
  // compressed_x_precision (1/nm), and positions, velocities and forces (.trr).
  std::int64_t nstxout_compressed = 0;
  float compressed_x_precision = 1000;
  std::int64_t nstxout = 0, nstvout = 0, nstfout = 0;
};

MdpOptions parse_mdp(const std::string& text, const std::string& name);
MdpOptions read_mdp(const std::filesystem::path& path);

}  // namespace kiln::md
