#!/usr/bin/env bash
# kiln mdrun's CUDA engine on water boxes of about 24k, 96k and 384k atoms (spc216.gro replicated
# 3x3x4, 5x5x6 and 8x8x9: 23,328, 97,200 and 373,248 atoms), N steps each, printing ns/day; and
# OpenMM's CUDA platform on the same .gro/.top with the same cut-off, PME accuracy, rigid water,
# 2 fs steps and no thermostat (NVE), when `$PYTHON -c 'import openmm'` works and it has CUDA.
#   bench/gpu_mdrun.sh [BUILD_DIR] [NSTEPS] [PRECISION]     (defaults: build 5000 mixed)
# Environment: SIZES ("3x3x4 5x5x6 8x8x9"), PYTHON (python3), OUT (out/gpu_mdrun), NSTLIST (20),
# DEVICE (cuda; cpu tries the script on a machine without a GPU, PRECISION then unused).
set -euo pipefail
BUILD=${1:-build}
NSTEPS=${2:-5000}
PRECISION=${3:-mixed}
SIZES=${SIZES:-3x3x4 5x5x6 8x8x9}
PYTHON=${PYTHON:-python3}
NSTLIST=${NSTLIST:-20}
DEVICE=${DEVICE:-cuda}
cd "$(dirname "$0")/.."
KILN=$(realpath "$BUILD/apps/kiln/kiln")
OUT=${OUT:-out/gpu_mdrun}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
TOP_DIR=${GMXLIB:-/usr/share/gromacs/top}; TOP_DIR=${TOP_DIR%%:*}
[ -f $TOP_DIR/spc216.gro ] || { echo "gromacs-data is not installed ($TOP_DIR/spc216.gro)" >&2; exit 1; }

# GROMACS's usual water settings: rc 0.9 nm, PME 0.12 nm order 4 at ewald-rtol 1e-5, SETTLE.
cat > "$OUT/bench.mdp" <<MDP
integrator      = md
dt              = 0.002
nsteps          = $NSTEPS
cutoff-scheme   = Verlet
nstlist         = $NSTLIST
rcoulomb        = 0.9
rvdw            = 0.9
coulombtype     = PME
fourierspacing  = 0.12
pme-order       = 4
ewald-rtol      = 1e-5
tcoupl          = no
gen-vel         = yes
gen-temp        = 300
gen-seed        = 1993
nstenergy       = $NSTEPS
nstcomm         = 100
MDP

have_openmm=0
if $PYTHON -c 'import openmm; openmm.Platform.getPlatformByName("CUDA")' 2>/dev/null; then have_openmm=1; fi
[ $have_openmm = 1 ] || echo "OpenMM with a CUDA platform is not importable by $PYTHON: kiln only"

results=()
for size in $SIZES; do
  IFS=x read -r nx ny nz <<< "$size"
  work=$OUT/$size
  mkdir -p "$work"
  /usr/bin/python3 tests/md/replicate_spc216.py $TOP_DIR/spc216.gro "$nx" "$ny" "$nz" "$work"
  atoms=$(sed -n 2p "$work/conf.gro" | tr -d ' ')
  precision=()
  [ "$DEVICE" = cpu ] || precision=(--precision "$PRECISION")
  "$KILN" mdrun -s "$work/conf.gro" -p "$work/topol.top" -f "$OUT/bench.mdp" -o "$work/kiln" --device "$DEVICE" \
    "${precision[@]}" > "$work/kiln.log" 2>&1 || { tail -5 "$work/kiln.log"; exit 1; }
  kiln_nsday=$(awk '/^Performance:/ {print $2}' "$work/kiln.log")
  openmm_nsday=-
  if [ $have_openmm = 1 ]; then
    $PYTHON bench/gpu_mdrun_openmm.py --gro "$work/conf.gro" --top "$work/topol.top" --steps "$NSTEPS" \
      --cutoff 0.9 --ewald-rtol 1e-5 > "$work/openmm.log" 2>&1 || { tail -5 "$work/openmm.log"; exit 1; }
    openmm_nsday=$(awk '/^ns\/day/ {print $2}' "$work/openmm.log")
  fi
  echo "$size: $atoms atoms, kiln $kiln_nsday ns/day, OpenMM CUDA $openmm_nsday ns/day"
  results+=("$(printf '%-8s %9s %14s %16s' "$size" "$atoms" "$kiln_nsday" "$openmm_nsday")")
done
echo
echo "kiln mdrun --device $DEVICE ${precision[*]}, $NSTEPS steps of 2 fs, nstlist $NSTLIST (OpenMM: mixed)"
printf '%-8s %9s %14s %16s\n' box atoms "kiln ns/day" "OpenMM ns/day"
printf '%s\n' "${results[@]}"
