#pragma once
// Launchers of the MD engine's GPU kernels (kernels.cu). Plain C++ signatures, so the host code
// (cuda_engine.cpp) is compiled by the host compiler with fmt and the vendor header and kernels.cu
// needs neither. Streams are passed as void* (a cudaStream_t); every launcher is followed by
// KILN_CUDA_CHECK_LAUNCH(). `Real` is float (mixed precision: pair and PME arithmetic and forces
// in float, positions, velocities, the update, SETTLE and energy sums in double) or double; both
// are instantiated in kernels.cu.
//
// Positions, velocities and forces are arrays of 3n values (x, y, z per atom, the layout of
// std::vector<Vec3>), in atom order. The pair list works on "slots": atoms sorted into columns of
// the xy plane, by z within a column, each column padded to whole clusters of 8 slots (slot_atom
// -1 for padding), as GROMACS's cluster grid.
#include <cstddef>
#include <cstdint>

#include "kiln/hpc/md/vrescale.h"

namespace kiln::md::gpu {

inline constexpr int kClusterSize = 8;
inline constexpr int kReduceBlocks = 256;  // fixed grids for reductions

// Device accumulators (doubles), zeroed by the host where a sum starts.
enum Accumulator : int {
  kLj,
  kCoulombSr,
  kCoulombRecip,
  kBond,
  kAngle,
  kProperDih,
  kRbDih,
  kImproperDih,
  kLj14,
  kCoulomb14,
  kVirial,                // trace of sum r (x) F of the forces, kJ/mol
  kConstraintDeviation2,  // sum over LINCS constraints of ((length - d) / d)^2 after the step
  kConstraintVirial,      // trace of SETTLE's constraint-force virial
  kKineticOld,            // 1/2 m v^2 of v(t - dt/2)
  kKineticNew,            // of v(t + dt/2)
  kThermostatWork,        // sum of (lambda^2 - 1) Ekin(t - dt/2) over the steps so far, this one included
  kStepWork,              // this step's part of it
  kLambda,                // this step's v-rescale factor
  kMomentumX,
  kMomentumY,
  kMomentumZ,
  kAccumulatorCount
};

// Problems kernels cannot throw for; the host reads them with the energies and at the end.
enum Flag : int {
  // ~(step << 32 | atom) of the first step, and its lowest atom, with a force above the limit
  // (complements, so that atomicMax keeps the first: see flag_first in kernels.cu)
  kForce,
  kSettleWater,     // ~oxygen of the lowest water SETTLE could not constrain
  kFarExclusion,    // ~(i << 32 | j) of the lowest excluded pair farther apart than the cut-off
  kOverlap,         // ~(i << 32 | j) of the lowest non-excluded pair closer than 0.001 nm
  kBufferExceeded,  // steps at which the two largest displacements since the list build reached the buffer
  kPrunedInCutoff,  // atom pairs within the cut-off (at energy steps) in cluster pairs the prune dropped
  kFlagCount
};

struct ColumnGrid {
  int ncx = 1, ncy = 1;   // columns in x and y
  double sx = 1, sy = 1;  // column widths, nm
  int max_slots = 0;      // n + 7 * columns: every column padded to whole clusters
  int max_clusters = 0;   // max_slots / 8
};

struct Box {
  double x, y, z;
};

// ---- the cluster-pair list ---------------------------------------------------------------------
std::size_t sort_temp_bytes(int n);
// Column and z keys of every atom (positions wrapped into the box), counts per column.
void assign_columns(int n, const double* x, Box box, ColumnGrid grid, std::uint64_t* keys, int* values,
                    int* column_counts, void* stream);
void sort_by_column(int n, const std::uint64_t* keys_in, std::uint64_t* keys_out, const int* values_in, int* values_out,
                    void* temp, std::size_t temp_bytes, void* stream);
// column_atom_start[c], column_cluster_start[c] (ncol + 1 each; the last holds the totals).
void column_offsets(int ncol, const int* column_counts, int* column_atom_start, int* column_cluster_start,
                    void* stream);
// slot_atom (max_slots, prefilled with -1 by the host) from the sorted atoms.
void fill_slots(int n, const std::uint64_t* sorted_keys, const int* sorted_atoms, const int* column_atom_start,
                const int* column_cluster_start, int* slot_atom, void* stream);
// Bounding boxes (centre, half extent) of every cluster, from wrapped positions.
void cluster_bounds(ColumnGrid grid, const int* column_cluster_start, const int* slot_atom, const double* x, Box box,
                    float* bounds, void* stream);
// Pass 1 (pair_mask == nullptr): how many j-clusters jc >= ic within rlist each i-cluster has, into
// counts. Pass 2: the j-clusters and their interaction masks (bit 8a + b: slot a of i with slot b
// of j interacts: both real, not excluded, b > a within one cluster) from pair_start.
// Exclusions: CSR (excl_offsets, excl_atoms); `span` the largest |i - j| of an excluded pair.
void cluster_pairs(ColumnGrid grid, const int* column_cluster_start, const float* bounds, Box box, double rlist,
                   const int* slot_atom, const int* excl_offsets, const int* excl_atoms, int span, int* counts,
                   const int* pair_start, int* pair_cluster, std::uint64_t* pair_mask, void* stream);
// Exclusive prefix sum of counts[0..n) into out[0..n] (out[n] the total), one block.
void exclusive_scan(int n, const int* counts, int* out, void* stream);

// ---- forces ------------------------------------------------------------------------------------
struct NonbondedParams {
  double coulomb_factor;  // 1/(4 pi eps0), units.h
  double cutoff, beta;
  bool reaction_field;
  double k_rf, c_rf;
  int type_count;
};
// xq[slot] = (wrapped position, charge), slot_type[slot]: padding gets charge 0, type 0.
template <class Real>
void pack_slots(int max_slots, const int* slot_atom, const double* x, const double* charges, const int* types, Box box,
                Real* xq, int* slot_type, void* stream);
// The cluster-pair kernel: LJ and Coulomb (Ewald real space or reaction-field) of every pair in
// the list within the cut-off, forces added to f (atom order); with `energies`, LJ, Coulomb and
// the virial trace added to acc. With inner_mask (dynamic pruning) the kernel walks the pruned
// list: cluster pairs whose inner mask is 0 are skipped, and at energy steps their atom pairs
// within the cut-off are counted into flags[kPrunedInCutoff] (pairs pruning should have kept).
template <class Real>
void nonbonded(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
               const int* pair_cluster, const std::uint64_t* pair_mask, const std::uint64_t* inner_mask, const Real* xq,
               const int* slot_type, const int* slot_atom, const Real* c6, const Real* c12, NonbondedParams p, Box box,
               Real* f, bool energies, double* acc, unsigned long long* flags, void* stream);
// Dynamic pruning (GROMACS's rolling prune): for the i-clusters ic with ic % parts == part, every
// cluster pair of the outer list keeps its mask in inner_mask when any of its interacting atom
// pairs is within rlist_inner at xq (one step's packed positions), else gets 0; the kept pairs are
// added to kept[part] (the host zeroes it). Cluster granularity (8x8), as GROMACS's GPU prune.
template <class Real>
void prune_pairs(int max_clusters, const int* column_cluster_start, int ncol, const int* pair_start,
                 const int* pair_cluster, const std::uint64_t* pair_mask, const Real* xq, Box box, double rlist_inner,
                 int part, int parts, std::uint64_t* inner_mask, unsigned long long* kept, void* stream);
// Excluded pairs (i < j, as pairs[2k], pairs[2k+1]): the erf part the reciprocal sum holds
// (Ewald) or reaction-field's k_rf r^2 - c_rf, as the CPU engine.
template <class Real>
void exclusion_corrections(int count, const int* pairs, const double* x, const double* charges, NonbondedParams p,
                           Box box, Real* f, bool energies, double* acc, unsigned long long* flags, void* stream);
struct GpuBond {
  int i, j;
  double b0, kb;
};
struct GpuAngle {
  int i, j, k;
  double theta0, kth;
};
// A torsion: kind 0 "Proper Dih." and 1 "Per. Imp. Dih." (p = phi_s, k, with multiplicity n),
// kind 2 "Ryckaert-Bell." (p = C0..C5).
struct GpuDihedral {
  int i, j, k, l;
  int kind, n;
  double p[6];
};
struct GpuPair14 {
  int i, j;
  double c6, c12, fqq;  // fqq: 1/(4 pi eps0) times fudgeQQ q_i q_j
};
// Torsions then 1-4 pairs, one thread each (dihedral_terms.h, the CPU engine's arithmetic).
template <class Real>
void dihedrals_and_pairs(int dihedral_count, const GpuDihedral* dihedrals, int pair_count, const GpuPair14* pairs,
                         const double* x, Box box, Real* f, bool energies, double* acc, void* stream);
template <class Real>
void bonded(int bond_count, const GpuBond* bonds, int angle_count, const GpuAngle* angles, const double* x, Box box,
            Real* f, bool energies, double* acc, void* stream);

// ---- PME ---------------------------------------------------------------------------------------
struct PmeGrid {
  int k0, k1, k2, order;
  double beta, coulomb_factor;
};
template <class Real>
void pme_spread(int n, const double* x, const double* charges, Box box, PmeGrid g, Real* grid, void* stream);
// On the half-complex transform (k0 x k1 x (k2/2 + 1) complex values, interleaved): energy and
// virial trace into acc (with `energies`), then multiplied by the influence function.
template <class Real>
void pme_solve(PmeGrid g, Box box, const Real* moduli0, const Real* moduli1, const Real* moduli2, Real* complex_grid,
               bool energies, double* acc, void* stream);
template <class Real>
void pme_gather(int n, const double* x, const double* charges, Box box, PmeGrid g, const Real* grid, Real* f,
                void* stream);

// ---- integration -------------------------------------------------------------------------------
// v-rescale: lambda from acc[kKineticOld] and this step's noise (drawn on the host, in the CPU
// engine's order), into acc[kLambda]; the work into kStepWork and kThermostatWork.
void vrescale(double* acc, VrescaleNoise noise, double ke_ref, int ndf, double factor, void* stream);
// v' = lambda v + dt f / m (lambda = acc[kLambda] when `scaled`, else 1), x' = x + dt v'. Records
// the first atom with |f| above max_force in flags.
template <class Real>
void leapfrog(int n, const double* x, const double* v, const Real* f, const double* inv_mass, double dt, bool scaled,
              const double* acc, double max_force, long long step, double* x_new, double* v_new,
              unsigned long long* flags, void* stream);
// SETTLE of each water (oxygen index in oxygens, distances d_oh, d_hh per water): x_new corrected
// with x as the reference, v_new = (x_new - x) / dt for its atoms; with `energies`, the constraint
// virial trace into acc.
void settle(int count, const int* oxygens, const double* distances, const double* masses, const double* x,
            double* x_new, double* v_new, Box box, double dt, bool energies, double* acc, unsigned long long* flags,
            void* stream);
// LINCS (lincs.h: the same coupling arrays and arithmetic as the CPU engine's), one thread per
// constraint in each of its passes: directions from x, the expansion to `order` terms, lincs-iter
// corrections for rotational lengthening. x_new is corrected and v_new gets the same change / dt;
// with `energies`, the constraint virial trace and the squared relative deviations into acc.
struct LincsArrays {
  int count, order, iterations;
  const int* atoms;  // i, j per constraint
  const double *length, *s;
  const int *start, *other;
  const double* coef;
  double *dir, *old_length, *blcc, *rhs, *solution, *term, *next, *lambda;  // work, per constraint or neighbour
};
void lincs(const LincsArrays& a, const double* x, const double* inv_mass, double* x_new, double* v_new, Box box,
           double dt, bool energies, double* acc, void* stream);
// c-rescale: x *= mu, v /= mu.
void scale_coordinates(int n, double mu, double* x, double* v, void* stream);
// acc[slot] = sum 1/2 m v^2 (the host zeroes it).
void kinetic_energy(int n, const double* v, const double* masses, double* acc, int slot, void* stream);
// Linear centre-of-mass motion removed: momentum into acc[kMomentumX..Z] (zeroed by the host), then
// v -= P / M.
void remove_com_velocity(int n, double* v, const double* masses, double total_mass, double* acc, void* stream);
// Counts in flags[kBufferExceeded] whether the two largest displacements since x_list reach buffer.
void check_displacement(int n, const double* x, const double* x_list, Box box, double buffer, double* partial,
                        unsigned long long* flags, void* stream);

}  // namespace kiln::md::gpu
