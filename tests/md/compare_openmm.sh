#!/usr/bin/env bash
# Step-0 energies of kiln mdrun against OpenMM on spc216.gro replicated n x n x n (as gmx genconf
# -nbox n n n), or on a small molecule in it (<n> = propanol or urea: solvate_molecule.py), or on the
# committed inputs in data/<n>/ (villin: a protein in water), from the same .gro and .top. Exit 77
# (CTest: skipped) when OpenMM or gromacs-data is missing.
# Usage: compare_openmm.sh <kiln> <n|propanol|urea|villin> <mdp> <workdir> [openmm_reference.py flags]
set -euo pipefail
kiln=$1 n=$2 mdp=$3 work=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
python=/usr/bin/python3
top_dir=/usr/share/gromacs/top
if ! $python -c 'import openmm' 2>/dev/null; then echo "SKIP: OpenMM (python3-simtk) is not installed"; exit 77; fi
if [ ! -f $top_dir/spc216.gro ]; then echo "SKIP: gromacs-data is not installed"; exit 77; fi
rm -rf "$work" && mkdir -p "$work"
if [ -d "$here/data/$n" ]; then  # committed inputs (the villin headpiece: data/villin/README)
  cp "$here/data/$n"/* "$work/"
elif [[ $n =~ ^[0-9]+$ ]]; then
  $python "$here/replicate_spc216.py" "$top_dir/spc216.gro" "$n" "$n" "$n" "$work"
else
  $python "$here/solvate_molecule.py" "$top_dir/spc216.gro" "$n" "$work"
fi
openmm_top=$work/topol.top
if [ -f "$work/topol_openmm.top" ]; then openmm_top=$work/topol_openmm.top; fi
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
$python "$here/openmm_reference.py" --gro "$work/conf.gro" --top "$openmm_top" --cutoff "$cutoff" \
  "${electrostatics[@]}" --kiln-json "$work/out/energy.json" "$@"
