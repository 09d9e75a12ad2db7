#pragma once
// GROMACS's Verlet-buffer estimate (calc_verletbuf, as in GROMACS 2022) and its pair-list tuning
// (increaseNstlist and the dynamic-pruning set-up of pairlist_tuning): the pair-list radius rlist
// for which the energy drift from pairs that enter the cut-off during a list's lifetime stays below
// `verlet-buffer-tolerance` (kJ/mol/ps per atom), assuming atoms move freely (Gaussian
// displacements of variance kT t^2 / m, constrained atoms by the rotation about their heaviest
// partner) through a uniform density, with the pair potentials' first three derivatives at the
// cut-off. The estimate is an overestimate of the drift by design (see GROMACS's reference manual).
#include <string>
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/mdp_options.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

struct VerletBufferInput {
  double cutoff = 1.0;  // rc = rvdw = rcoulomb
  double beta = 0;      // Ewald coefficient (PME); unused with reaction-field
  bool reaction_field = false;
  double epsilon_rf = 0;  // 0: infinity
  double dt = 0.002;
  double tolerance = 0.005;  // kJ/mol/ps per atom
  double temperature = 300;  // K: the (largest) reference temperature
  double volume = 1;         // nm^3
};

// rlist (nm, on GROMACS's 0.001 nm resolution) for a list built every `nstlist` steps and used for
// `lifetime` steps after the one it was built at (GROMACS: nstlist - 1; nstlistPrune for its GPU
// pruning). cluster_size 1 is an atom-pair list, 4 the 4x4 cluster-pair list that GROMACS assumes
// for every list it builds (its 8x8 GPU lists too: the estimate is then conservative).
double verlet_buffer_rlist(const MdSystem& s, const VerletBufferInput& in, int nstlist, int lifetime,
                           int cluster_size = 4);

// The list set-up mdrun chooses (GROMACS's increaseNstlist and setupDynamicPairlistPruning).
struct PairListPlan {
  int nstlist = 10;
  double rlist = 1.0;  // the (outer) list radius
  bool dynamic_pruning = false;
  int nstlist_prune = -1;        // steps an inner list lives before it is pruned again
  double rlist_inner = 1.0;      // the pruned (inner) list radius
  int rolling_parts = 1;         // the inner list is pruned one part every nstlist_prune / rolling_parts steps
  std::vector<std::string> log;  // GROMACS's md.log lines for the choices
};

// `gpu`: GROMACS's GPU choices (list size factor 1.4, rolling pruning every 2 steps); else its CPU
// ones (1.25). `nstlist_override` > 0 is gmx mdrun -nstlist (that nstlist, its buffer estimated);
// `dynamic_pruning` false is GMX_DISABLE_DYNAMICPRUNING. The box bounds rlist (half the smallest
// edge): an nstlist whose rlist does not fit is not taken.
PairListPlan plan_pair_lists(const MdSystem& s, const VerletBufferInput& in, int mdp_nstlist, const Vec3& box, bool gpu,
                             int nstlist_override, bool dynamic_pruning);

}  // namespace kiln::md
