#!/usr/bin/env bash
# Step-0 energies of kiln mdrun against OpenMM on spc216.gro replicated n x n x n (as gmx genconf
# -nbox n n n), from the same .gro and .top. Exit 77 (CTest: skipped) when OpenMM or gromacs-data
# is missing.   Usage: compare_openmm.sh <kiln> <n> <mdp> <workdir> [openmm_reference.py flags]
set -euo pipefail
kiln=$1 n=$2 mdp=$3 work=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
top_dir=/usr/share/gromacs/top
if ! $python -c 'import openmm' 2>/dev/null; then echo "SKIP: OpenMM (python3-simtk) is not installed"; exit 77; fi
if [ ! -f $top_dir/spc216.gro ]; then echo "SKIP: gromacs-data is not installed"; exit 77; fi
rm -rf "$work" && mkdir -p "$work"
$python - "$top_dir/spc216.gro" "$n" "$work" <<'PY'
import sys
src, n, work = sys.argv[1], int(sys.argv[2]), sys.argv[3]
lines = open(src).read().splitlines()
count = int(lines[1])
atoms = lines[2:2 + count]
box = [float(v) for v in lines[2 + count].split()]
out = [f'spc216 replicated {n}x{n}x{n}', f'{count * n ** 3:5d}']
k = 0
for a in range(n):
    for b in range(n):
        for c in range(n):
            for j, line in enumerate(atoms):
                x, y, z = (float(line[20 + 8 * d:28 + 8 * d]) for d in range(3))
                resnr = (k * (count // 3) + j // 3 + 1) % 100000
                atomnr = (k * count + j + 1) % 100000
                out.append(f'{resnr:5d}{line[5:10]}{line[10:15]}{atomnr:5d}'
                           f'{x + a * box[0]:8.3f}{y + b * box[1]:8.3f}{z + c * box[2]:8.3f}')
            k += 1
out.append(''.join(f'{n * v:10.5f}' for v in box))
open(f'{work}/conf.gro', 'w').write('\n'.join(out) + '\n')
open(f'{work}/topol.top', 'w').write(
    '#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spc.itp"\n\n[ system ]\n'
    f'spc216 x {n ** 3}\n\n[ molecules ]\nSOL {count // 3 * n ** 3}\n')
PY
"$kiln" mdrun -s "$work/conf.gro" -p "$work/topol.top" -f "$mdp" -o "$work/out" --device cpu > "$work/kiln.out"
settings=$(grep -o 'cut-off [0-9.]* nm.*degrees of freedom' "$work/out/md.log")
cutoff=$(sed -E 's/cut-off ([0-9.]+) nm.*/\1/' <<< "$settings")
echo "kiln: $settings"
if grep -q 'reaction-field' <<< "$settings"; then
  electrostatics=(--reaction-field "$(sed -E 's/.*epsilon-rf ([0-9.e+-]+).*/\1/' <<< "$settings")")
else
  read -r gx gy gz < <(sed -E 's/.*grid ([0-9]+)x([0-9]+)x([0-9]+).*/\1 \2 \3/' <<< "$settings")
  electrostatics=(--grid "$gx" "$gy" "$gz")
fi
$python "$here/openmm_reference.py" --gro "$work/conf.gro" --top "$work/topol.top" --cutoff "$cutoff" \
  "${electrostatics[@]}" --kiln-json "$work/out/energy.json" "$@"
