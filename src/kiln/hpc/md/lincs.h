#pragma once
// LINCS (Hess, Bekker, Berendsen and Fraaije 1997), as GROMACS runs it for constraints = h-bonds:
// the constraint equations linearised along the old bond directions and solved by the series
// (I - A)^-1 = I + A + A^2 + ... to lincs-order terms, then lincs-iter corrections for the
// lengthening that rotation causes. The coupling of constraints that share an atom (the matrix A)
// depends only on the topology and is built once; the CPU engine applies it here, the CUDA engine
// uploads the same arrays (cuda/kernels.cu).
#include <vector>

#include "kiln/hpc/md/md_system.h"
#include "kiln/hpc/md/vec3.h"

namespace kiln::md {

// constraints = h-bonds: every bond with a hydrogen (an atom whose name starts with H, as grompp
// decides) becomes a constraint of its b0 and leaves [ bonds ]. Exclusions stay as they were.
void constrain_h_bonds(MdSystem& system);

struct LincsCoupling {
  // For constraint c, its neighbours k in [start[c], start[c + 1]): constraint other[k], sharing one
  // atom; A[c][other] = coef[k] (B_c . B_other), coef = -+ invmass(shared) S_c S_other (minus when
  // the shared atom has the same role, i or j, in both).
  std::vector<int> start, other;
  std::vector<double> coef;
  std::vector<double> s;  // S_c = 1 / sqrt(1/m_i + 1/m_j)
};
LincsCoupling lincs_coupling(const MdSystem& system);

class Lincs {
 public:
  Lincs(const MdSystem& system, int order, int iterations);
  // `reference` satisfies the constraints; `updated` (unconstrained) is corrected in place. With
  // `virial`, adds sum r (x) f of the constraint forces m (constrained - unconstrained) / dt^2.
  void apply(const std::vector<Vec3>& reference, std::vector<Vec3>& updated, const Vec3& box, double dt,
             Mat3* virial) const;
  // The largest |length - d| / d over the constraints at positions x, and its rms (GROMACS's
  // "Constr. rmsd").
  double max_relative_deviation(const std::vector<Vec3>& x, const Vec3& box) const;
  double rms_relative_deviation(const std::vector<Vec3>& x, const Vec3& box) const;
  bool empty() const { return system_.constraints.empty(); }

 private:
  void solve(std::vector<double>& rhs, const std::vector<double>& blcc) const;
  const MdSystem& system_;
  LincsCoupling coupling_;
  int order_, iterations_;
};

}  // namespace kiln::md
