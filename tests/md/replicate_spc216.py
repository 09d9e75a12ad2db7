#!/usr/bin/env python3
"""spc216.gro replicated nx x ny x nz (as gmx genconf -nbox nx ny nz) and its topology (OPLS-AA SPC
from gromacs-data): writes <outdir>/conf.gro and <outdir>/topol.top.
Usage: replicate_spc216.py <spc216.gro> <nx> <ny> <nz> <outdir>"""
import sys

src, nx, ny, nz, work = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
lines = open(src).read().splitlines()
count = int(lines[1])
atoms = lines[2:2 + count]
box = [float(v) for v in lines[2 + count].split()]
copies = nx * ny * nz
out = [f'spc216 replicated {nx}x{ny}x{nz}', f'{count * copies:5d}']
k = 0
for a in range(nx):
    for b in range(ny):
        for c in range(nz):
            for j, line in enumerate(atoms):
                x, y, z = (float(line[20 + 8 * d:28 + 8 * d]) for d in range(3))
                resnr = (k * (count // 3) + j // 3 + 1) % 100000
                atomnr = (k * count + j + 1) % 100000
                out.append(f'{resnr:5d}{line[5:10]}{line[10:15]}{atomnr:5d}'
                           f'{x + a * box[0]:8.3f}{y + b * box[1]:8.3f}{z + c * box[2]:8.3f}')
            k += 1
out.append(f'{nx * box[0]:10.5f}{ny * box[1]:10.5f}{nz * box[2]:10.5f}')
open(f'{work}/conf.gro', 'w').write('\n'.join(out) + '\n')
open(f'{work}/topol.top', 'w').write(
    '#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spc.itp"\n\n[ system ]\n'
    f'spc216 x {copies}\n\n[ molecules ]\nSOL {count // 3 * copies}\n')
