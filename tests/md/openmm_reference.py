#!/usr/bin/python3
"""Step-0 energy terms of a GROMACS .gro/.top from OpenMM (Reference platform, double precision),
set up to compute what GROMACS's Verlet scheme computes, and optionally compared with kiln mdrun's
energy.json.

OpenMM differs from GROMACS by default in three ways, each made equal here:
- LJ potential-shift: GROMACS subtracts V_LJ(rc) from every pair inside the cut-off. The LJ force
  OpenMM's GromacsTopFile builds (a CustomNonbondedForce for comb-rule 1 and 3, NonbondedForce's
  own for comb-rule 2) gets the same shift.
- Coulomb potential-shift: GROMACS subtracts f q_i q_j erfc(beta rc)/rc for every non-excluded pair
  inside the cut-off; added here as a CustomNonbondedForce with NonbondedForce's exclusions.
- PME: beta from ewald-rtol by GROMACS's bisection, the grid as given. OpenMM's Reference PME uses
  B-splines of order 5, so the kiln run compared with it uses pme-order = 5.
The Ewald self energy is in GROMACS's "Coulomb (SR)" (Verlet kernels) but in OpenMM's reciprocal
force group; it is moved across analytically.
1-4 pairs: OpenMM keeps their Coulomb (and, for comb-rule 2, LJ) as NonbondedForce exceptions; they
are moved into forces of their own (zeroed exceptions keep the Ewald exclusion correction, as
GROMACS's excluded pairs) so that LJ-14 and Coulomb-14 are compared as terms. Bonded forces are
compared per OpenMM force class: PeriodicTorsionForce holds GROMACS's "Proper Dih." and "Per. Imp.
Dih." together.

With --dispcorr, "Disper. corr." (in the Potential) and "Pres. DC" of GROMACS's DispCorr = EnerPres
come from OpenMM's own long-range correction (dispersion_correction below says how its definition is
bridged to GROMACS's); systems with one LJ atom type only (water).

Usage: openmm_reference.py --gro conf.gro --top topol.top --cutoff 0.9 --ewald-rtol 1e-5
           --grid 16 16 16 [--include-dir DIR] [--dispcorr] [--kiln-json energy.json --tolerance 1e-4]
Exit status 0 when every compared term agrees within the relative tolerance, 1 otherwise.
"""
import argparse
import json
import math
import sys

import openmm as mm
from openmm import app, unit

ONE_4PI_EPS0 = 138.935457833  # kJ mol^-1 nm e^-2, GROMACS 2022's value (OpenMM's is 138.935456)


def ewald_coefficient(rc, rtol):
    """GROMACS's calc_ewaldcoeff_q, written out independently of kiln's C++."""
    beta, doublings = 5.0, 0
    while True:
        doublings += 1
        beta *= 2
        if math.erfc(beta * rc) <= rtol:
            break
    low, high = 0.0, beta
    for _ in range(doublings + 60):
        beta = 0.5 * (low + high)
        if math.erfc(beta * rc) > rtol:
            low = beta
        else:
            high = beta
    return beta


def _defines(names):
    # OpenMM 7.7's GromacsTopFile iterates a defines dict with Python 2's iteritems(): give it an
    # object that has one, or None when there are none.
    class Defines(dict):
        def iteritems(self):
            return iter(self.items())
    return Defines.fromkeys(names, '') if names else None


def make_system(args):
    """The OpenMM System computing GROMACS's Verlet-scheme energies, with its force groups (also used
    by bench/md_nve_rdf_openmm.py for dynamics). Returns (system, gro, present, charges, beta, rf, c_rf)."""
    gro = app.GromacsGroFile(args.gro)
    top = app.GromacsTopFile(args.top, periodicBoxVectors=gro.getPeriodicBoxVectors(),
                             includeDir=args.include_dir, defines=_defines(args.define))
    rc = args.cutoff
    rf = args.reaction_field is not None
    system = top.createSystem(nonbondedMethod=app.CutoffPeriodic if rf else app.PME,
                              nonbondedCutoff=rc * unit.nanometer, constraints=None, rigidWater=not args.flexible)
    nb = next(f for f in system.getForces() if isinstance(f, mm.NonbondedForce))
    if rf:
        # GROMACS's epsilon-rf = 0 means infinity; OpenMM takes a number.
        eps_rf = args.reaction_field if args.reaction_field > 0 else 1e12
        nb.setReactionFieldDielectric(eps_rf)
        k_rf = (eps_rf - 1) / ((2 * eps_rf + 1) * rc ** 3)
        c_rf = 1 / rc + k_rf * rc ** 2
        beta = 0.0
    else:
        beta = ewald_coefficient(rc, args.ewald_rtol)
        nb.setPMEParameters(beta, *args.grid)
    nb.setUseDispersionCorrection(False)
    bonded_groups = {mm.HarmonicBondForce: (7, 'Bond'), mm.HarmonicAngleForce: (8, 'Angle'),
                     mm.PeriodicTorsionForce: (9, 'Proper Dih. + Per. Imp. Dih.'),
                     mm.RBTorsionForce: (10, 'Ryckaert-Bell.')}
    pair_lj = [f for f in system.getForces() if isinstance(f, mm.CustomBondForce)]
    present = {}
    for force in system.getForces():
        group, name = bonded_groups.get(type(force), (4, None))
        force.setForceGroup(group)
        if name:
            present[name] = group
    if pair_lj:  # comb-rule 1 and 3: GromacsTopFile's LJ of the pairs
        (pair_lj,) = pair_lj
        pair_lj.setUsesPeriodicBoundaryConditions(True)
        pair_lj.setForceGroup(6)
        if pair_lj.getNumBonds():
            present['LJ-14'] = 6
    coulomb14 = mm.CustomBondForce(f'{ONE_4PI_EPS0!r}*qq/r')
    coulomb14.addPerBondParameter('qq')
    lj14 = mm.CustomBondForce('4*eps*((sig/r)^12-(sig/r)^6)')
    lj14.addPerBondParameter('sig')
    lj14.addPerBondParameter('eps')
    for force in (coulomb14, lj14):
        force.setUsesPeriodicBoundaryConditions(True)
    for k in range(nb.getNumExceptions()):
        i, j, qq, sig, eps = nb.getExceptionParameters(k)
        qq = qq.value_in_unit(unit.elementary_charge ** 2)
        eps = eps.value_in_unit(unit.kilojoule_per_mole)
        if qq != 0:
            coulomb14.addBond(i, j, [qq])
        if eps != 0:
            lj14.addBond(i, j, [sig.value_in_unit(unit.nanometer), eps])
        if qq != 0 or eps != 0:
            nb.setExceptionParameters(k, i, j, 0.0, 1.0, 0.0)
    if coulomb14.getNumBonds():
        coulomb14.setForceGroup(5)
        system.addForce(coulomb14)
        present['Coulomb-14'] = 5
    if lj14.getNumBonds():
        lj14.setForceGroup(6)
        system.addForce(lj14)
        present['LJ-14'] = 6
    nb.setForceGroup(1)
    nb.setReciprocalSpaceForceGroup(2)
    customs = [f for f in system.getForces() if isinstance(f, mm.CustomNonbondedForce)]
    if customs:
        (lj,) = customs
        if lj.getEnergyFunction() != 'A1*A2/r^12-C1*C2/r^6':
            sys.exit(f'unexpected LJ expression from GromacsTopFile: {lj.getEnergyFunction()}')
        lj.setEnergyFunction(f'A1*A2*(1/r^12-{rc ** -12!r})-C1*C2*(1/r^6-{rc ** -6!r})')
        lj.setUseLongRangeCorrection(False)
        lj.setForceGroup(0)
    else:
        # Comb-rule 2: move LJ out of NonbondedForce into a shifted Lorentz-Berthelot force.
        lj = mm.CustomNonbondedForce(
            f'4*eps*((sig/r)^12-(sig/r)^6-(sig/{rc!r})^12+(sig/{rc!r})^6); sig=0.5*(s1+s2); eps=sqrt(e1*e2)')
        lj.addPerParticleParameter('s')
        lj.addPerParticleParameter('e')
        for i in range(nb.getNumParticles()):
            q, s, e = nb.getParticleParameters(i)
            lj.addParticle([s, e])
            nb.setParticleParameters(i, q, s, 0.0)
        for k in range(nb.getNumExceptions()):
            i, j, qq, s, e = nb.getExceptionParameters(k)
            lj.addExclusion(i, j)
        lj.setNonbondedMethod(mm.CustomNonbondedForce.CutoffPeriodic)
        lj.setCutoffDistance(rc)
        lj.setForceGroup(0)
        system.addForce(lj)
    charges = [nb.getParticleParameters(i)[0].value_in_unit(unit.elementary_charge)
               for i in range(nb.getNumParticles())]
    if rf:
        # OpenMM's reaction field already has c_rf; GROMACS's Verlet kernels also give excluded
        # pairs f qq (k_rf r^2 - c_rf), added here, and each atom -f q^2 c_rf / 2 (below).
        excluded = mm.CustomBondForce(f'{ONE_4PI_EPS0!r}*qq*({k_rf!r}*r^2-{c_rf!r})')
        excluded.addPerBondParameter('qq')
        excluded.setUsesPeriodicBoundaryConditions(True)
        for k in range(nb.getNumExceptions()):
            i, j = nb.getExceptionParameters(k)[:2]
            excluded.addBond(i, j, [charges[i] * charges[j]])
        excluded.setForceGroup(3)
        system.addForce(excluded)
    else:
        shift = mm.CustomNonbondedForce(f'-{ONE_4PI_EPS0!r}*q1*q2*{math.erfc(beta * rc) / rc!r}')
        shift.addPerParticleParameter('q')
        for q in charges:
            shift.addParticle([q])
        for k in range(nb.getNumExceptions()):
            i, j = nb.getExceptionParameters(k)[:2]
            shift.addExclusion(i, j)
        shift.setNonbondedMethod(mm.CustomNonbondedForce.CutoffPeriodic)
        shift.setCutoffDistance(rc)
        shift.setForceGroup(3)
        system.addForce(shift)
    return system, gro, present, charges, beta, rf, (c_rf if rf else 0.0)


PRESFAC = 1e3 / 6.02214076e23 / 1e-27 / 1e5  # kJ mol^-1 nm^-3 in bar, GROMACS's PRESFAC


def dispersion_correction(system, gro, rc):
    """GROMACS's DispCorr = EnerPres energy and pressure from OpenMM's NonbondedForce dispersion correction
    (setUseDispersionCorrection: the energy with it on less the energy with it off). The two definitions
    differ, and each difference is bridged here, written out from the GROMACS manual and OpenMM's docs:
    - OpenMM corrects the r^-12 repulsion together with the r^-6 dispersion; EnerPres only the
      dispersion. OpenMM is given each atom's C6 with sigma = 1e-3 nm (epsilon = C6 / (4 sigma^6)), which
      leaves C6 as it is and makes the repulsion's share 1e-18 of it.
    - OpenMM averages C6 over the N (N + 1) / 2 pairs i <= j (self pairs in, excluded pairs in); GROMACS
      over the N (N - 1) / 2 pairs i < j less the excluded ones. OpenMM's tail is scaled by the ratio
      of the two averages, counted here from OpenMM's own particles and exclusions (for 216 waters
      0.99693: GROMACS's <C6> is C6(OW, OW) / 9, OpenMM's (M + 1) / (3 (3 M + 1)) of it).
    - OpenMM's LJ is not shifted, so its correction is the tail beyond rc only, -(2/3) pi N rho <C6> /
      rc^3. GROMACS's potential-shift added C6 / rc^6 to each pair inside rc; the correction takes that
      back for the rho (4/3) pi rc^3 - 1 neighbours each atom has there, assuming g(r) = 1: the energy
      is the tail times 2 - 3 / (4 pi rho rc^3).
    - Pressure: GROMACS's is the virial of the missing tail forces, -(4/3) pi rho^2 <C6> / rc^3 =
      2 E_tail / V (OpenMM has no pressure; its Monte Carlo barostat differentiates the energy instead).
    Returns (energy, pressure, lines describing the figures)."""
    lj = [f for f in system.getForces() if isinstance(f, mm.CustomNonbondedForce) and f.getForceGroup() == 0]
    (lj,) = lj
    names = [lj.getPerParticleParameterName(k) for k in range(lj.getNumPerParticleParameters())]
    c6 = []
    for i in range(lj.getNumParticles()):
        p = dict(zip(names, lj.getParticleParameters(i)))
        c6.append(p['C'] ** 2 if 'C' in p else 4 * p['e'] * p['s'] ** 6)
    kinds = {round(c, 15) for c in c6 if c != 0}
    if len(kinds) != 1:
        sys.exit(f'--dispcorr: {len(kinds)} LJ atom types; OpenMM combines unlike pairs by its own rule, '
                 'so only systems with one (water) are compared')
    c6_lj = max(c6)
    n = len(c6)
    n_lj = sum(1 for c in c6 if c != 0)
    excluded = {tuple(sorted(lj.getExclusionParticles(k))) for k in range(lj.getNumExclusions())}
    excluded_lj = sum(1 for i, j in excluded if c6[i] != 0 and c6[j] != 0)
    average_openmm = c6_lj * n_lj * (n_lj + 1) / 2 / (n * (n + 1) / 2)
    average_gromacs = c6_lj * (n_lj * (n_lj - 1) / 2 - excluded_lj) / (n * (n - 1) / 2 - len(excluded))

    tail = mm.System()
    for i in range(n):
        tail.addParticle(system.getParticleMass(i))
    tail.setDefaultPeriodicBoxVectors(*gro.getPeriodicBoxVectors())
    nb = mm.NonbondedForce()
    nb.setNonbondedMethod(mm.NonbondedForce.CutoffPeriodic)
    nb.setCutoffDistance(rc)
    nb.setUseSwitchingFunction(False)
    sigma = 1e-3
    for c in c6:
        nb.addParticle(0.0, sigma if c else 1.0, c / (4 * sigma ** 6) if c else 0.0)
    tail.addForce(nb)
    energies = []
    for on in (True, False):
        nb.setUseDispersionCorrection(on)
        context = mm.Context(tail, mm.VerletIntegrator(0.001), mm.Platform.getPlatformByName('Reference'))
        context.setPositions(gro.positions)
        state = context.getState(getEnergy=True)
        energies.append(state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole))
    openmm_tail = energies[0] - energies[1]
    box = gro.getPeriodicBoxVectors()
    volume = box[0][0].value_in_unit(unit.nanometer) * box[1][1].value_in_unit(unit.nanometer) * \
        box[2][2].value_in_unit(unit.nanometer)
    rho = n / volume
    gromacs_tail = openmm_tail * average_gromacs / average_openmm
    energy = gromacs_tail * (2 - 3 / (4 * math.pi * rho * rc ** 3))
    pressure = 2 * gromacs_tail / volume * PRESFAC
    lines = [f'dispersion correction: OpenMM tail (correction on - off) {openmm_tail:.9f} kJ/mol over its '
             f'{n * (n + 1) // 2} pairs, <C6> {average_openmm:.9e}',
             f'  GROMACS <C6> {average_gromacs:.9e} over {n * (n - 1) // 2 - len(excluded)} non-excluded pairs: '
             f'tail {gromacs_tail:.9f}, with the potential-shift part {energy:.9f} kJ/mol, Pres. DC {pressure:.6f} bar']
    return energy, pressure, lines


def build(args):
    system, gro, present, charges, beta, rf, c_rf = make_system(args)
    integrator = mm.VerletIntegrator(0.001)
    platform = mm.Platform.getPlatformByName('Reference')
    context = mm.Context(system, integrator, platform)
    context.setPositions(gro.positions)
    q2 = sum(q * q for q in charges)
    self_energy = -ONE_4PI_EPS0 * (0.5 * c_rf if rf else beta / math.sqrt(math.pi)) * q2

    def group(g):
        state = context.getState(getEnergy=True, groups={g})
        return state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)

    terms = {'LJ (SR)': group(0), 'Coulomb (SR)': group(1) + group(3) + self_energy}
    if not rf:  # OpenMM has the Ewald self energy in its reciprocal group; GROMACS in Coulomb (SR)
        terms['Coul. recip.'] = group(2) - self_energy
    listed = {name: group(g) for name, g in present.items()}
    if args.flexible:  # flexible water's bonds and angles, as one term
        terms['Bond + Angle'] = listed.pop('Bond') + listed.pop('Angle')
    terms.update(listed)
    other = group(4)  # forces no term above has: none expected
    if other != 0:
        sys.exit(f'OpenMM has {other} kJ/mol in forces that are not compared term by term')
    notes = []
    if args.dispcorr:
        energy, pressure, notes = dispersion_correction(system, gro, args.cutoff)
        terms['Disper. corr.'] = energy
    terms['Potential'] = sum(terms.values())  # disjoint terms
    if args.dispcorr:
        terms['Pres. DC'] = pressure
    return terms, beta, notes


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--gro', required=True)
    p.add_argument('--top', required=True)
    p.add_argument('--include-dir', default='/usr/share/gromacs/top')
    p.add_argument('--define', action='append', default=[])
    p.add_argument('--flexible', action='store_true', help='water with bonds and angles (define FLEXIBLE)')
    p.add_argument('--cutoff', type=float, required=True)
    p.add_argument('--ewald-rtol', type=float, default=1e-5)
    p.add_argument('--grid', type=int, nargs=3, help='PME grid (kiln md.log says which)')
    p.add_argument('--reaction-field', type=float, metavar='EPSILON_RF',
                   help='reaction-field electrostatics instead of PME (0: infinity, as GROMACS)')
    p.add_argument('--dispcorr', action='store_true',
                   help="add GROMACS's DispCorr = EnerPres terms from OpenMM's dispersion correction")
    p.add_argument('--kiln-json')
    p.add_argument('--tolerance', type=float, default=1e-4)
    args = p.parse_args()
    if args.reaction_field is None and args.grid is None:
        p.error('give --grid (PME) or --reaction-field')
    terms, beta, notes = build(args)
    if args.reaction_field is None:
        print(f'OpenMM {mm.__version__} Reference platform, double precision; beta {beta:.6f} nm^-1, '
              f'grid {args.grid[0]}x{args.grid[1]}x{args.grid[2]}, PME order 5')
    else:
        print(f'OpenMM {mm.__version__} Reference platform, double precision; reaction-field, '
              f'epsilon-rf {args.reaction_field:g}')
    for line in notes:
        print(line)
    if not args.kiln_json:
        for name, value in terms.items():
            print(f'{name:>15} {value:16.6f}')
        return 0
    with open(args.kiln_json) as f:
        kiln = json.load(f)['frames'][0]
    for name in terms:  # OpenMM's sums of kiln's terms
        if ' + ' in name:
            kiln[name] = sum(kiln.get(part, 0.0) for part in name.split(' + '))
    failed = False
    print(f'{"term":>15} {"OpenMM":>16} {"kiln":>16} {"rel. diff":>10}')
    for name, value in terms.items():
        rel = abs(kiln[name] - value) / abs(value)
        ok = rel <= args.tolerance
        failed |= not ok
        print(f'{name:>15} {value:16.6f} {kiln[name]:16.6f} {rel:10.2e} {"ok" if ok else "MISMATCH"}')
    print('kiln and OpenMM agree' if not failed else f'kiln and OpenMM differ beyond {args.tolerance:g}')
    return 1 if failed else 0


if __name__ == '__main__':
    sys.exit(main())
