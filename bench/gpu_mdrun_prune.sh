#!/usr/bin/env bash
# Issue 23: kiln mdrun's CUDA engine with GROMACS's GPU pair-list set-up (nstlist raised from 10 as
# gmx mdrun does for a GPU, rlist from verlet-buffer-tolerance, rolling dynamic pruning of an inner
# list, PME on its own stream) against the earlier behaviour in the same call (nstlist 20, a fixed
# 0.1 nm buffer, one list: `verlet-buffer-tolerance = -1`, `rlist = 1.1`, --nstlist 20 --prune off),
# on spc216.gro replicated 3x3x4, 5x5x6, 8x8x9 and 13x13x14 (23,328 to 1,533,168 atoms;
# tests/md/replicate_spc216.py, no GROMACS needed) at bench/gpu_mdrun_peers.sh's settings (dt 2 fs,
# PME 0.12 nm order 4, ewald-rtol 1e-5, rc 1.0 nm, SETTLE, v-rescale 300 K, gen-vel), --resethway.
#   bench/gpu_mdrun_prune.sh [BUILD_DIR]
# Environment: SIZES, KILN_STEPS (one per size: "6000 4000 2000 1000"), PRECISION (mixed), OUT
# (out/gpu_mdrun_prune: md.logs, JSON lines, table), WORK (/tmp/kiln_mdrun_prune), RUN_TIMEOUT (150 s).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SIZES=(${SIZES:-3x3x4 5x5x6 8x8x9 13x13x14})
KILN_STEPS=(${KILN_STEPS:-6000 4000 2000 1000})
PRECISION=${PRECISION:-mixed}
RUN_TIMEOUT=${RUN_TIMEOUT:-150}
OUT=${OUT:-out/gpu_mdrun_prune}
WORK=${WORK:-/tmp/kiln_mdrun_prune}
mkdir -p "$OUT" "$WORK"
OUT=$(realpath "$OUT")
KILN=$(realpath "$BUILD/apps/kiln/kiln")
TOP_DIR=${GMXLIB:-/usr/share/gromacs/top}; TOP_DIR=${TOP_DIR%%:*}
[ -f "$TOP_DIR/spc216.gro" ] || { echo "no spc216.gro in $TOP_DIR (GMXLIB)" >&2; exit 1; }
JSON=$OUT/mdrun_prune.jsonl
: > "$JSON"

write_mdp() {  # $1 file, $2 nsteps, $3 extra lines
  cat > "$1" << MDP
integrator           = md
dt                   = 0.002
nsteps               = $2
cutoff-scheme        = Verlet
nstlist              = 10
rcoulomb             = 1.0
rvdw                 = 1.0
coulombtype          = PME
fourierspacing       = 0.12
pme-order            = 4
ewald-rtol           = 1e-5
vdw-modifier         = Potential-shift
tcoupl               = v-rescale
tc-grps              = System
tau-t                = 0.1
ref-t                = 300
constraints          = h-bonds
gen-vel              = yes
gen-temp             = 300
gen-seed             = 1993
nstenergy            = $(($2 / 2))
nstcomm              = 100
$3
MDP
}

declare -A nsday
for i in "${!SIZES[@]}"; do
  size=${SIZES[$i]}
  IFS=x read -r nx ny nz <<< "$size"
  w=$WORK/$size
  mkdir -p "$w" "$OUT/$size"
  [ -s "$w/conf.gro" ] || python3 tests/md/replicate_spc216.py "$TOP_DIR/spc216.gro" "$nx" "$ny" "$nz" "$w"
  atoms=$(sed -n 2p "$w/conf.gro" | tr -d ' ')
  steps=${KILN_STEPS[$i]}
  write_mdp "$w/new.mdp" "$steps" ""
  write_mdp "$w/old.mdp" "$steps" "verlet-buffer-tolerance = -1
rlist                = 1.1"
  for mode in new old; do
    flags=()
    [ $mode = old ] && flags=(--nstlist 20 --prune off)
    [ $mode = new ] && flags=(--prune on)
    log=$OUT/$size/$mode.log
    timeout "$RUN_TIMEOUT" "$KILN" mdrun -s "$w/conf.gro" -p "$w/topol.top" -f "$w/$mode.mdp" -o "$w/$mode" \
      --device cuda --precision "$PRECISION" --resethway "${flags[@]}" > "$log" 2>&1
    rc=$?
    cp "$w/$mode/md.log" "$OUT/$size/$mode.md.log" 2> /dev/null
    perf=$(awk '/^Performance:/ {print $2}' "$log")
    nsday[$size.$mode]=${perf:-null}
    python3 - "$log" "$size" "$atoms" "$mode" "$steps" "$rc" >> "$JSON" << 'PY'
import json, re, sys
log, size, atoms, mode, steps, rc = sys.argv[1:]
text = open(log, errors='replace').read()
def grab(pattern, cast=str):
    m = re.search(pattern, text)
    return cast(m.group(1)) if m else None
pot = None
lines = text.splitlines()
for i, l in enumerate(lines):
    if l.strip() == 'Energies (kJ/mol)':
        names = [lines[i + 1][k:k + 15].strip() for k in range(0, len(lines[i + 1]), 15)]
        vals = lines[i + 2].split()
        if 'Potential' in names and len(vals) == len(names): pot = float(vals[names.index('Potential')])
        break
print(json.dumps({'size': size, 'atoms': int(atoms), 'mode': mode, 'steps': int(steps), 'rc': int(rc),
                  'ns_per_day': grab(r'Performance:\s+([0-9.]+)', float),
                  'changing': grab(r'(Changing nstlist[^\n]*)'), 'outer': grab(r'outer list: ([^\n]*)'),
                  'inner': grab(r'inner list: ([^\n]*)'), 'builds': grab(r'pair list: (\d+) builds', int),
                  'buffer_reached_steps': grab(r'reached the buffer at (\d+) steps', int),
                  'prunes': grab(r'pruned list: (\d+) prunes', int),
                  'pruned_pairs_within_rc': grab(r'pruning dropped \(counted at energy steps\): (\d+)', int),
                  'potential_step0': pot}))
PY
    echo "$size ($atoms atoms) $mode: ${perf:-failed (rc $rc)} ns/day"; [ $rc = 0 ] || tail -3 "$log"
  done
done
{
  printf '%-10s %10s %14s %14s %8s\n' size atoms "old ns/day" "new ns/day" new/old
  for size in "${SIZES[@]}"; do
    o=${nsday[$size.old]}; n=${nsday[$size.new]}
    r=$(python3 -c "import sys; o, n = sys.argv[1:]; print(f'{float(n) / float(o):.2f}' if 'null' not in (o, n) else '-')" "$o" "$n")
    printf '%-10s %10s %14s %14s %8s\n' "$size" "$(sed -n 2p "$WORK/$size/conf.gro" | tr -d ' ')" "$o" "$n" "$r"
  done
} | tee "$OUT/table.txt"
