#pragma once
// The simulated system, flattened from the topology: per-atom charges, masses and LJ types, the
// LJ parameter matrix, exclusions and the bonded and constraint terms with global atom indices.
// Every engine (CPU now, GPU later) starts from this.
#include <string>
#include <vector>

namespace kiln::md {

struct HarmonicBond {
  int i, j;
  double b0, kb;  // nm, kJ/mol/nm^2
};
struct HarmonicAngle {
  int i, j, k;         // j is the vertex
  double theta0, kth;  // rad, kJ/mol/rad^2
};
// GROMACS [ dihedrals ] function 1, 9 (each of 9's terms its own entry) and 4:
// k (1 + cos(n phi - phi_s)), phi the IUPAC angle between planes ijk and jkl (trans = pi).
struct PeriodicDihedral {
  int i, j, k, l;
  double phi_s, k_phi;  // rad, kJ/mol
  int n;
};
// Function 3, Ryckaert-Bellemans: sum_n c[n] cos^n(psi), psi = phi - pi (polymer convention).
struct RbDihedral {
  int i, j, k, l;
  double c[6];  // kJ/mol
};
// A [ pairs ] 1-4 interaction: c12/r^12 - c6/r^6 and f qq / r, no cut-off and no shift, as
// GROMACS's LJ-14 and Coulomb-14 (qq already scaled by fudgeQQ).
struct Pair14 {
  int i, j;
  double c6, c12, qq;
};
// A distance constraint (constraints = h-bonds turns bonds with a hydrogen into these; LINCS).
struct Constraint {
  int i, j;
  double length;  // nm
};
// A rigid water: oxygen o, hydrogens o+1 and o+2, as GROMACS's [ settles ].
struct SettleWater {
  int o;
  double d_oh, d_hh;
};

struct MdSystem {
  std::string name;
  int atom_count = 0;
  std::vector<double> charges;  // e
  std::vector<double> masses;   // amu
  std::vector<int> types;       // index into the LJ matrices
  int type_count = 0;
  std::vector<double> c6, c12;  // type_count x type_count, kJ/mol nm^6 and nm^12
  // For every atom, the sorted atoms (other than itself) it has no non-bonded interaction with.
  std::vector<std::vector<int>> exclusions;
  std::vector<HarmonicBond> bonds;
  std::vector<HarmonicAngle> angles;
  std::vector<PeriodicDihedral> proper_dihedrals;    // "Proper Dih." (functions 1 and 9)
  std::vector<PeriodicDihedral> periodic_impropers;  // "Per. Imp. Dih." (function 4)
  std::vector<RbDihedral> rb_dihedrals;              // "Ryckaert-Bell." (function 3)
  std::vector<Pair14> pairs;                         // "LJ-14" and "Coulomb-14"
  std::vector<SettleWater> settles;
  std::vector<Constraint> constraints;
  std::vector<std::string> atom_names, residue_names;
  std::vector<int> residue_numbers;
  // A domain-decomposed rank's local system (domain_decomposition.h): each atom's number in the whole
  // system, for messages. Empty: index + 1.
  std::vector<int> atom_numbers;
  int atom_number(int i) const { return atom_numbers.empty() ? i + 1 : atom_numbers[i]; }
  int constraint_count() const { return 3 * static_cast<int>(settles.size()) + static_cast<int>(constraints.size()); }
  bool excluded(int i, int j) const;
};

}  // namespace kiln::md
