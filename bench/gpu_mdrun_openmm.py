#!/usr/bin/env python3
"""OpenMM's CUDA platform on a GROMACS .gro/.top for bench/gpu_mdrun.sh: NVE (Verlet integrator,
2 fs), PME with the given cut-off and error tolerance, rigid water, mixed precision. Prints
'ns/day <value>' for the timed steps (after --warmup steps, default 200)."""
import argparse
import time

import openmm
from openmm import app, unit

p = argparse.ArgumentParser()
p.add_argument('--gro', required=True)
p.add_argument('--top', required=True)
p.add_argument('--steps', type=int, default=5000)
p.add_argument('--cutoff', type=float, default=0.9)
p.add_argument('--ewald-rtol', type=float, default=1e-5)
p.add_argument('--top-dir', default='/usr/share/gromacs/top')
p.add_argument('--platform', default='CUDA', help='CUDA (the benchmark); Reference or CPU to try the script')
p.add_argument('--warmup', type=int, default=200)
a = p.parse_args()

gro = app.GromacsGroFile(a.gro)
top = app.GromacsTopFile(a.top, periodicBoxVectors=gro.getPeriodicBoxVectors(), includeDir=a.top_dir)
system = top.createSystem(nonbondedMethod=app.PME, nonbondedCutoff=a.cutoff * unit.nanometer,
                          ewaldErrorTolerance=a.ewald_rtol, rigidWater=True)
integrator = openmm.VerletIntegrator(0.002 * unit.picoseconds)
platform = openmm.Platform.getPlatformByName(a.platform)
properties = {'Precision': 'mixed'} if a.platform == 'CUDA' else {}
sim = app.Simulation(top.topology, system, integrator, platform, properties)
sim.context.setPositions(gro.positions)
sim.context.setVelocitiesToTemperature(300 * unit.kelvin, 1993)
sim.step(a.warmup)
sim.context.getState(getEnergy=True)
start = time.perf_counter()
sim.step(a.steps)
sim.context.getState(getEnergy=True)  # waits for the GPU
seconds = time.perf_counter() - start
print(f'atoms {system.getNumParticles()}')
print(f'ns/day {a.steps * 0.002e-3 / seconds * 86400:.3f}')
