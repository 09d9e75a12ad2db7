#!/usr/bin/env python3
"""One small organic molecule from gromacs-data's force fields, built from internal coordinates,
put at the centre of spc216.gro with the waters that overlap it removed (as gmx solvate would):
writes <outdir>/conf.gro and <outdir>/topol.top.
  propanol: OPLS-AA's 1propanol.itp (RB dihedrals, [ pairs ] with gen-pairs, fudge 0.5/0.5) in SPC
  urea:     AMBER99SB-ILDN's urea.itp (function 9 dihedrals, function 4 impropers) in TIP3P, with
            the [ angles ] and [ pairs ] that file lacks added (parameters from [ angletypes ] and
            gen-pairs, fudgeLJ 0.5, fudgeQQ 0.8333), written to <outdir>/urea.itp
Every solute atom is displaced by up to 0.01 nm (fixed seed) so that no dihedral sits at an
extremum of its potential and every term has non-zero forces.
OpenMM 7.7's reader needs the function column grompp defaults to 1 (1propanol.itp's [ pairs ] and
urea.itp's [ bonds ] leave it out): topol_openmm.top includes copies of the molecule's .itp with it
written out, topol.top the files as they are.
Usage: solvate_molecule.py <spc216.gro> <propanol|urea> <outdir>"""
import math
import random
import sys


def place(a, b, c, bond, angle, torsion):
    """The atom d with |cd| = bond, angle bcd and dihedral abcd (degrees), from a, b, c (NeRF)."""
    angle, torsion = math.radians(angle), math.radians(torsion)
    bc = [c[i] - b[i] for i in range(3)]
    nbc = math.sqrt(sum(v * v for v in bc))
    bc = [v / nbc for v in bc]
    ab = [b[i] - a[i] for i in range(3)]
    n = [ab[1] * bc[2] - ab[2] * bc[1], ab[2] * bc[0] - ab[0] * bc[2], ab[0] * bc[1] - ab[1] * bc[0]]
    nn = math.sqrt(sum(v * v for v in n))
    n = [v / nn for v in n]
    m = [n[1] * bc[2] - n[2] * bc[1], n[2] * bc[0] - n[0] * bc[2], n[0] * bc[1] - n[1] * bc[0]]
    d2 = [-bond * math.cos(angle), bond * math.sin(angle) * math.cos(torsion), bond * math.sin(angle) * math.sin(torsion)]
    return [c[i] + d2[0] * bc[i] + d2[1] * m[i] + d2[2] * n[i] for i in range(3)]


def propanol():
    """Atoms in 1propanol.itp's order: C H H H C H H C H H OA HO."""
    c5 = [0.0, 0.0, 0.0]
    c1 = [0.153, 0.0, 0.0]
    c8 = place([0.0, 1.0, 0.0], c1, c5, 0.153, 112.0, 0.0)
    o11 = place(c1, c5, c8, 0.141, 109.5, 180.0)
    h12 = place(c5, c8, o11, 0.0945, 108.5, 175.0)
    h1 = [place(c8, c5, c1, 0.109, 110.7, t) for t in (60.0, 180.0, 300.0)]
    h5 = [place(o11, c8, c5, 0.109, 110.7, t) for t in (65.0, -55.0)]
    h8 = [place(c1, c5, c8, 0.109, 110.7, t) for t in (62.0, -58.0)]
    atoms = [('C', c1), ('H', h1[0]), ('H', h1[1]), ('H', h1[2]), ('C', c5), ('H', h5[0]), ('H', h5[1]),
             ('C', c8), ('H', h8[0]), ('H', h8[1]), ('OA', o11), ('HO', h12)]
    return 'POL', atoms, 'oplsaa.ff/forcefield.itp', ['oplsaa.ff/1propanol.itp', 'oplsaa.ff/spc.itp']


def with_function_column(text):
    """The .itp with grompp's default function 1 written on interaction lines that leave it out."""
    atoms_per_line = {'bonds': 2, 'pairs': 2, 'angles': 3, 'dihedrals': 4}
    section, out = None, []
    for line in text.splitlines():
        body = line.split(';')[0].strip()
        if body.startswith('['):
            section = body.strip('[] ')
        elif body and len(body.split()) == atoms_per_line.get(section, -1):
            line = body + ' 1'
        out.append(line)
    return '\n'.join(out) + '\n'


def urea():
    """Atoms in urea.itp's order: C O N1 H11 H12 N2 H21 H22 (planar)."""
    c = [0.0, 0.0, 0.0]
    o = [0.0, 0.1229, 0.0]
    n1 = place([1.0, 1.0, 0.0], o, c, 0.1335, 121.0, 0.0)
    n2 = place([1.0, 1.0, 0.0], o, c, 0.1335, 121.0, 180.0)
    h11 = place(o, c, n1, 0.101, 120.0, 0.0)
    h12 = place(o, c, n1, 0.101, 120.0, 180.0)
    h21 = place(o, c, n2, 0.101, 120.0, 0.0)
    h22 = place(o, c, n2, 0.101, 120.0, 180.0)
    atoms = [('C', c), ('O', o), ('N1', n1), ('H11', h11), ('H12', h12), ('N2', n2), ('H21', h21), ('H22', h22)]
    return 'URE', atoms, 'amber99sb-ildn.ff/forcefield.itp', ['urea.itp', 'amber99sb-ildn.ff/tip3p.itp']


UREA_EXTRA = '''
[ angles ]
; from [ angletypes ]
 2 1 3
 2 1 6
 3 1 6
 1 3 4
 1 3 5
 4 3 5
 1 6 7
 1 6 8
 7 6 8

[ pairs ]
 2 4 1
 2 5 1
 2 7 1
 2 8 1
 3 7 1
 3 8 1
 6 4 1
 6 5 1
'''


def main():
    src, name, work = sys.argv[1], sys.argv[2], sys.argv[3]
    resname, solute, forcefield, itps = {'propanol': propanol, 'urea': urea}[name]()
    rng = random.Random(23)
    lines = open(src).read().splitlines()
    count = int(lines[1])
    water = [(l[10:15].strip(), [float(l[20 + 8 * d:28 + 8 * d]) for d in range(3)]) for l in lines[2:2 + count]]
    box = [float(v) for v in lines[2 + count].split()]
    centre = [sum(p[i] for _, p in solute) / len(solute) for i in range(3)]
    solute = [(n, [p[i] - centre[i] + box[i] / 2 + rng.uniform(-0.01, 0.01) for i in range(3)]) for n, p in solute]

    def too_close(p):
        for _, q in solute:
            d2 = 0.0
            for i in range(3):
                d = p[i] - q[i]
                d -= box[i] * round(d / box[i])
                d2 += d * d
            if d2 < 0.25 ** 2:
                return True
        return False

    kept = [water[k:k + 3] for k in range(0, count, 3) if not any(too_close(p) for _, p in water[k:k + 3])]
    out = [f'{name} in {len(kept)} waters (spc216.gro)', f'{len(solute) + 3 * len(kept):5d}']
    atom = 0
    for n, p in solute:
        atom += 1
        out.append(f'{1:5d}{resname:<5}{n:>5}{atom:5d}{p[0]:8.3f}{p[1]:8.3f}{p[2]:8.3f}')
    for r, mol in enumerate(kept):
        for n, p in mol:
            atom += 1
            out.append(f'{r + 2:5d}{"SOL":<5}{n:>5}{atom:5d}{p[0]:8.3f}{p[1]:8.3f}{p[2]:8.3f}')
    out.append(f'{box[0]:10.5f}{box[1]:10.5f}{box[2]:10.5f}')
    open(f'{work}/conf.gro', 'w').write('\n'.join(out) + '\n')
    if name == 'urea':
        itp = open('/usr/share/gromacs/top/amber99sb-ildn.ff/urea.itp').read()
        open(f'{work}/urea.itp', 'w').write(itp + UREA_EXTRA)
    molecule_itp = itps[0] if itps[0].startswith('/') or '/' not in itps[0] else '/usr/share/gromacs/top/' + itps[0]
    if '/' not in itps[0]:
        molecule_itp = f'{work}/{itps[0]}'
    open(f'{work}/molecule_openmm.itp', 'w').write(with_function_column(open(molecule_itp).read()))
    molecules = f'\n[ system ]\n{name} in water\n\n[ molecules ]\n{resname} 1\nSOL {len(kept)}\n'
    for top, files in (('topol.top', itps), ('topol_openmm.top', ['molecule_openmm.itp'] + itps[1:])):
        includes = ''.join(f'#include "{f}"\n' for f in [forcefield] + files)
        open(f'{work}/{top}', 'w').write(includes + molecules)


if __name__ == '__main__':
    main()
