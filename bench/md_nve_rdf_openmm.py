#!/usr/bin/python3
"""NVE dynamics of a GROMACS .gro/.top on OpenMM's Reference platform (double precision) with the
energy function of tests/md/openmm_reference.py (GROMACS's potential-shifted LJ and Coulomb, PME at
kiln's beta and grid, B-spline order 5), for bench/md_nve_rdf.sh: leap-frog (VerletIntegrator) at
--dt, rigid water (SETTLE), positions and velocities from the .gro (velocities as GROMACS writes
them), the start constrained. Writes the energies every --energy-every steps as JSON
({"frames": [{"step", "time", "Potential", "Kinetic En.", "Conserved En."}]}) and the positions every
--frames-every steps as a multi-frame .gro.
Usage: md_nve_rdf_openmm.py --gro start.gro --top topol.top --cutoff 0.9 --grid 16 16 16
           --steps 5000 --energies openmm_energy.json --frames openmm_frames.gro"""
import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), '..', 'tests', 'md'))
import openmm as mm  # noqa: E402
from openmm import unit  # noqa: E402

from openmm_reference import make_system  # noqa: E402


def read_velocities(path):
    lines = open(path).read().splitlines()
    n = int(lines[1])
    v = []
    for line in lines[2:2 + n]:
        if len(line) < 68:
            sys.exit(f'{path} has no velocities')
        v.append(mm.Vec3(float(line[44:52]), float(line[52:60]), float(line[60:68])))
    return v, lines[2:2 + n], lines[2 + n]


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument('--gro', required=True)
    p.add_argument('--top', required=True)
    p.add_argument('--include-dir', default='/usr/share/gromacs/top')
    p.add_argument('--cutoff', type=float, required=True)
    p.add_argument('--ewald-rtol', type=float, default=1e-5)
    p.add_argument('--grid', type=int, nargs=3, required=True)
    p.add_argument('--dt', type=float, default=0.002)
    p.add_argument('--steps', type=int, default=5000)
    p.add_argument('--energy-every', type=int, default=10)
    p.add_argument('--frames-every', type=int, default=250)
    p.add_argument('--energies', required=True)
    p.add_argument('--frames', required=True)
    a = p.parse_args()
    a.define, a.flexible, a.reaction_field = [], False, None
    system, gro, _, _, beta, _, _ = make_system(a)
    integrator = mm.VerletIntegrator(a.dt)
    integrator.setConstraintTolerance(1e-10)
    context = mm.Context(system, integrator, mm.Platform.getPlatformByName('Reference'))
    context.setPositions(gro.positions)
    velocities, atom_lines, box_line = read_velocities(a.gro)
    context.setVelocities(velocities)
    context.applyConstraints(1e-10)
    context.applyVelocityConstraints(1e-10)
    frames, gro_out = [], []
    start = time.perf_counter()
    for step in range(0, a.steps + 1):
        if step % a.energy_every == 0:
            state = context.getState(getEnergy=True)
            pot = state.getPotentialEnergy().value_in_unit(unit.kilojoule_per_mole)
            kin = state.getKineticEnergy().value_in_unit(unit.kilojoule_per_mole)
            frames.append({'step': step, 'time': step * a.dt, 'Potential': pot, 'Kinetic En.': kin,
                           'Conserved En.': pot + kin})
        if step % a.frames_every == 0:
            x = context.getState(getPositions=True, enforcePeriodicBox=True).getPositions(asNumpy=False)
            gro_out.append(f'OpenMM Reference NVE t= {step * a.dt:.5f} step= {step}')
            gro_out.append(f'{len(atom_lines):5d}')
            for line, r in zip(atom_lines, x):
                r = r.value_in_unit(unit.nanometer)
                gro_out.append(f'{line[:20]}{r[0]:8.3f}{r[1]:8.3f}{r[2]:8.3f}')
            gro_out.append(box_line)
        if step < a.steps:
            integrator.step(1)
    seconds = time.perf_counter() - start
    with open(a.energies, 'w') as f:
        json.dump({'engine': f'OpenMM {mm.__version__} Reference', 'beta': beta, 'seconds': seconds,
                   'frames': frames}, f)
    with open(a.frames, 'w') as f:
        f.write('\n'.join(gro_out) + '\n')
    print(f'OpenMM {mm.__version__} Reference: {a.steps} steps in {seconds:.1f} s '
          f'({seconds / max(a.steps, 1) * 1000:.1f} ms/step)')


if __name__ == '__main__':
    main()
