#!/usr/bin/env bash
# Issue 23's speed table on the H200 machine in one call: water boxes of about 24k, 96k, 384k and
# 1.5M atoms (spc216.gro replicated by `gmx genconf -nbox`: 3x3x4, 5x5x6, 8x8x9, 13x13x14 =
# 23,328, 97,200, 373,248 and 1,533,168 atoms) at GROMACS's standard settings (dt 2 fs, PME, rc 1.0
# nm, Verlet, constraints h-bonds (SETTLE), v-rescale 300 K), run by
#   - GROMACS 2022.5 from Debian 12 (carried in .mdpeers/ by tools/fetch-md-peers.sh), on the CPU
#     cores (`gmx mdrun -nb cpu -nt <cores> -pin on -resethway`, its own choice of thread-MPI
#     ranks, OpenMP threads and nstlist), and
#   - kiln mdrun --device cuda (--precision mixed, --resethway), on the same conf.gro, topol.top
#     and .mdp (with KILN_NSTLIST for nstlist: kiln has no dynamic pruning, GROMACS raises the
#     .mdp's 10 itself),
# printing one JSON line per box and engine and a table of ns/day with kiln/GROMACS ratios.
#   bench/gpu_mdrun_peers.sh [BUILD_DIR] [--dry-run]
# --dry-run builds the boxes and runs grompp on each (no mdrun): the part that runs on a machine
# without a GPU or whose CPU gmx refuses. Environment:
#   SIZES ("3x3x4 5x5x6 8x8x9 13x13x14"); GMX_STEPS ("1000 400 120 60") and KILN_STEPS
#   ("6000 4000 2000 1000"), one per size; KILN_NSTLIST (20); KILN_DEVICE (cuda; cpu for a check
#   here) and KILN_PRECISION (mixed); GMX_BINARY (gmx; gmx_d: GROMACS's double-precision build);
#   GMX_NT (nproc); GMX_EXTRA (more gmx mdrun flags, e.g.
#   "-ntmpi 1 -ntomp 16"); RUN_TIMEOUT (180 s per mdrun; GROMACS gets -maxh 0.55 of it, since it
#   stops only at its next list step); OUT (out/gpu_mdrun_peers: logs, JSON, table); WORK
#   (/tmp/kiln_mdrun_peers: the boxes, 106 MB of .gro at 1.5M atoms); MDPEERS (/opt/mdpeers, where
#   .mdpeers/gromacs-2022.tar.xz is unpacked).
# The step counts keep the whole script near 5 minutes on the H200 machine's 16 cores (GROMACS
# 2022 with SSE4.1 kernels, as Debian builds it, does roughly 1-2 M atom-steps/s there: an
# estimate from this 2-core machine, 5184 atoms at 4.7 ns/day on 2 threads, to be replaced by the
# measurement). Both engines time the second half only (-resethway / --resethway).
set -uo pipefail
cd "$(dirname "$0")/.."
BUILD=build
DRY=0
for a in "$@"; do case "$a" in --dry-run) DRY=1 ;; *) BUILD=$a ;; esac; done
SIZES=(${SIZES:-3x3x4 5x5x6 8x8x9 13x13x14})
GMX_STEPS=(${GMX_STEPS:-1000 400 120 60})
KILN_STEPS=(${KILN_STEPS:-6000 4000 2000 1000})
KILN_NSTLIST=${KILN_NSTLIST:-20}
KILN_DEVICE=${KILN_DEVICE:-cuda}
KILN_PRECISION=${KILN_PRECISION:-mixed}
GMX_NT=${GMX_NT:-$(nproc)}
RUN_TIMEOUT=${RUN_TIMEOUT:-180}
OUT=${OUT:-out/gpu_mdrun_peers}
WORK=${WORK:-/tmp/kiln_mdrun_peers}
MDPEERS=${MDPEERS:-/opt/mdpeers}
mkdir -p "$OUT" "$WORK"
OUT=$(realpath "$OUT")
[ ${#GMX_STEPS[@]} -ge ${#SIZES[@]} ] && [ ${#KILN_STEPS[@]} -ge ${#SIZES[@]} ] ||
  { echo "GMX_STEPS and KILN_STEPS need one count per size (${#SIZES[@]})" >&2; exit 2; }
JSON=$OUT/mdrun_peers.jsonl
: > "$JSON"

# GROMACS: the carried packages (unpacked once), else a gmx on PATH (Debian's gromacs package here).
GMX=
if [ -f .mdpeers/gromacs-2022.tar.xz ]; then
  if [ ! -x $MDPEERS/usr/bin/${GMX_BINARY:-gmx} ]; then mkdir -p $MDPEERS && tar xJf .mdpeers/gromacs-2022.tar.xz -C $MDPEERS; fi
  GMX=$MDPEERS/usr/bin/${GMX_BINARY:-gmx}
  # The carried libraries first; libudev last, for a machine that has none of its own. fftw, openblas
  # and libX11 come from .devdeps (tools/gpu-build.sh's /opt/deps, already on LD_LIBRARY_PATH there).
  export LD_LIBRARY_PATH=$MDPEERS/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}:$MDPEERS/fallback
  export GMXLIB=$MDPEERS/usr/share/gromacs/top
elif command -v gmx > /dev/null; then
  GMX=$(command -v ${GMX_BINARY:-gmx})
  export GMXLIB=${GMXLIB:-/usr/share/gromacs/top}
else
  echo "no GROMACS: run tools/fetch-md-peers.sh (carry .mdpeers) or install Debian's gromacs" >&2; exit 1
fi
export GMX_MAXBACKUP=-1  # overwrite, no #backup# files
if ! "$GMX" --version > "$OUT/gmx_version.txt" 2>&1; then
  echo "gmx does not start (missing library?):"; tail -5 "$OUT/gmx_version.txt"; exit 1
fi
gmx_version=$(sed -n 's/^GROMACS version: *//p' "$OUT/gmx_version.txt")
gmx_simd=$(sed -n 's/^SIMD instructions: *//p' "$OUT/gmx_version.txt")
echo "GROMACS $gmx_version, SIMD $gmx_simd, RDTSCP $(sed -n 's/^RDTSCP usage: *//p' "$OUT/gmx_version.txt"); GMXLIB=$GMXLIB"
grep -qw rdtscp /proc/cpuinfo || echo "this CPU has no rdtscp: Debian's gmx mdrun (built with RDTSCP) will refuse it"
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2-), $(nproc) threads; gmx mdrun -nt $GMX_NT"

KILN=$(realpath "$BUILD/apps/kiln/kiln" 2> /dev/null)
if [ $DRY = 0 ] && [ ! -x "$KILN" ]; then echo "no kiln binary at $BUILD/apps/kiln/kiln" >&2; exit 1; fi
[ -f "$GMXLIB/spc216.gro" ] || { echo "no spc216.gro in GMXLIB=$GMXLIB" >&2; exit 1; }

# The step counts per engine and box differ; everything else is one .mdp (GROMACS's defaults where
# not named: nstcalcenergy 100, nstcomm 100, vdw-modifier potential-shift, DispCorr no).
write_mdp() {  # $1 file, $2 nsteps, $3 nstenergy, $4 nstlist
  cat > "$1" << MDP
integrator           = md
dt                   = 0.002
nsteps               = $2
cutoff-scheme        = Verlet
nstlist              = $4
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
nstenergy            = $3
nstcomm              = 100
MDP
}

# The first energy block of an md.log (GROMACS's and kiln's share the layout): its Potential.
potential_step0() {
  python3 - "$1" << 'PY'
import sys
lines = open(sys.argv[1], errors='replace').read().splitlines()
for i, l in enumerate(lines):
    if l.strip() == 'Energies (kJ/mol)':
        j = i + 1
        while j + 1 < len(lines) and lines[j].strip():
            names = [lines[j][k:k + 15].strip() for k in range(0, len(lines[j]), 15)]
            values = lines[j + 1].split()
            if 'Potential' in names and len(values) == len(names):
                print(float(values[names.index('Potential')])); sys.exit()
            j += 2
        break
print('null')
PY
}

declare -A gmx_nsday kiln_nsday atoms_of
status=0
for i in "${!SIZES[@]}"; do
  size=${SIZES[$i]}
  IFS=x read -r nx ny nz <<< "$size"
  w=$WORK/$size
  mkdir -p "$w" "$OUT/$size"
  L=$OUT/$size
  t0=$(date +%s)
  if [ ! -s "$w/conf.gro" ]; then
    "$GMX" genconf -f "$GMXLIB/spc216.gro" -nbox "$nx" "$ny" "$nz" -o "$w/conf.gro" > "$L/genconf.log" 2>&1 ||
      { echo "$size: gmx genconf failed"; tail -5 "$L/genconf.log"; status=1; continue; }
  fi
  atoms=$(sed -n 2p "$w/conf.gro" | tr -d ' ')
  atoms_of[$size]=$atoms
  printf '#include "oplsaa.ff/forcefield.itp"\n#include "oplsaa.ff/spc.itp"\n\n[ system ]\nspc216 x %d\n\n[ molecules ]\nSOL %d\n' \
    $((nx * ny * nz)) $((atoms / 3)) > "$w/topol.top"
  gsteps=${GMX_STEPS[$i]}
  ksteps=${KILN_STEPS[$i]}
  write_mdp "$w/gmx.mdp" "$gsteps" 1000 10  # nstenergy: GROMACS's default (a multiple of nstcalcenergy)
  write_mdp "$w/kiln.mdp" "$ksteps" $((ksteps / 2)) "$KILN_NSTLIST"
  (cd "$w" && "$GMX" grompp -f gmx.mdp -c conf.gro -p topol.top -o topol.tpr -po mdout.mdp -maxwarn 0) \
    > "$L/grompp.log" 2>&1 || { echo "$size: gmx grompp failed"; grep -A6 -E "ERROR|Fatal" "$L/grompp.log" | head -20; status=1; continue; }
  echo "$size: $atoms atoms, genconf + grompp $(( $(date +%s) - t0 )) s$(grep -o 'Estimate for the relative computational load of the PME mesh part: [0-9.]*' "$L/grompp.log" | sed 's/.*: /, PME load /')"
  [ $DRY = 1 ] && continue

  # GROMACS on the CPU cores.
  # -maxh: GROMACS stops itself (and still reports its performance) before timeout would kill it.
  maxh=$(awk -v t="$RUN_TIMEOUT" 'BEGIN {printf "%.4f", 0.55 * t / 3600}')
  (cd "$w" && timeout "$RUN_TIMEOUT" "$GMX" mdrun -s topol.tpr -deffnm gmx -nb cpu -nt "$GMX_NT" -pin on -resethway \
    -maxh "$maxh" -noconfout ${GMX_EXTRA:-}) > "$L/gmx_mdrun.out" 2>&1
  rc=$?
  cp "$w/gmx.log" "$L/gmx_md.log" 2> /dev/null
  g=$(awk '/^Performance:/ {print $2}' "$w/gmx.log" 2> /dev/null)
  if [ $rc != 0 ] || [ -z "$g" ]; then
    echo "$size: gmx mdrun failed (rc $rc):"
    grep -A8 -E "Fatal error|rdtscp|RDTSCP|Illegal|not supported" "$L/gmx_mdrun.out" | head -16
    [ $rc = 124 ] && echo "  (stopped at RUN_TIMEOUT=$RUN_TIMEOUT s: lower GMX_STEPS)"
    g=null
  fi
  gmx_nsday[$size]=$g
  layout=$(grep -m1 -E "^Using [0-9]+ MPI (thread|process)" "$w/gmx.log" 2> /dev/null | sed 's/Using //')
  omp=$(grep -m1 -E "^Using [0-9]+ OpenMP thread" "$w/gmx.log" 2> /dev/null | sed 's/Using //')
  npme=$(grep -m1 -oE "[0-9]+ separate PME ranks" "$w/gmx.log" 2> /dev/null)
  nstlist=$(grep -m1 -oE "Changing nstlist from [0-9]+ to [0-9]+, rlist from [0-9.]+ to [0-9.]+" "$w/gmx.log" 2> /dev/null)
  [ -n "$nstlist" ] || nstlist="nstlist 10 (unchanged)"
  kernels=$(grep -m1 -oE "Using [A-Za-z0-9 ]*nonbonded short-range kernels" "$w/gmx.log" 2> /dev/null)
  e0=$(potential_step0 "$w/gmx.log")
  gdone=$(grep -m1 -oE "^Step [0-9]+: Run time exceeded" "$w/gmx.log" 2> /dev/null)
  [ -n "$gdone" ] && echo "$size: GROMACS stopped early by -maxh ($gdone): its ns/day covers fewer steps"
  printf '{"bench":"mdrun_peers","engine":"gromacs","version":"%s","simd":"%s","box":"%s","atoms":%s,"steps":%s,"timed":"second half (-resethway)","ns_per_day":%s,"layout":"%s; %s; %s","nstlist":"%s","kernels":"%s","potential_step0":%s}\n' \
    "$gmx_version" "$gmx_simd" "$size" "$atoms" "$gsteps" "$g" "$layout" "$omp" "${npme:-no separate PME ranks}" "$nstlist" "$kernels" "$e0" \
    | tee -a "$JSON"

  # kiln on the GPU (or KILN_DEVICE).
  precision=()
  [ "$KILN_DEVICE" = cpu ] || precision=(--precision "$KILN_PRECISION")
  timeout "$RUN_TIMEOUT" "$KILN" mdrun -s "$w/conf.gro" -p "$w/topol.top" -f "$w/kiln.mdp" -o "$w/kiln" \
    --device "$KILN_DEVICE" "${precision[@]}" --resethway > "$L/kiln_md.log" 2>&1
  rc=$?
  k=$(awk '/^Performance:/ {print $2}' "$L/kiln_md.log")
  if [ $rc != 0 ] || [ -z "$k" ]; then
    echo "$size: kiln mdrun failed (rc $rc):"; tail -6 "$L/kiln_md.log"; k=null; status=1
  fi
  kiln_nsday[$size]=$k
  builds=$(grep -oE "pair list: [0-9]+ builds[^;]*; the two largest displacements reached the buffer at [0-9]+ steps|pair list: [0-9]+ builds.*pairs" "$L/kiln_md.log")
  e0=$(potential_step0 "$L/kiln_md.log")
  printf '{"bench":"mdrun_peers","engine":"kiln","device":"%s","precision":"%s","box":"%s","atoms":%s,"steps":%s,"timed":"second half (--resethway)","ns_per_day":%s,"nstlist":%s,"pair_list":"%s","potential_step0":%s}\n' \
    "$KILN_DEVICE" "${precision[1]:-double}" "$size" "$atoms" "$ksteps" "$k" "$KILN_NSTLIST" "$builds" "$e0" | tee -a "$JSON"
  rm -rf "$w/kiln" "$w"/gmx.{edr,trr,xtc,cpt}
done

[ $DRY = 1 ] && { echo "dry run: boxes and grompp only (in $WORK, logs in $OUT)"; exit $status; }
{
  echo
  echo "ns/day, water (SPC, OPLS-AA) at dt 2 fs, rc 1.0 nm, PME 0.12 nm order 4, h-bonds/SETTLE, v-rescale; second half timed"
  printf '%-9s %9s %16s %18s %8s\n' box atoms "GROMACS CPU" "kiln $KILN_DEVICE" "ratio"
  for size in "${SIZES[@]}"; do
    g=${gmx_nsday[$size]:-null}; k=${kiln_nsday[$size]:-null}
    r=-; [ "$g" != null ] && [ "$k" != null ] && r=$(awk -v k="$k" -v g="$g" 'BEGIN {printf "%.2f", k / g}')
    printf '%-9s %9s %16s %18s %8s\n' "$size" "${atoms_of[$size]:--}" "$g" "$k" "$r"
  done
  echo "GROMACS $gmx_version ($gmx_simd kernels) -nb cpu -nt $GMX_NT ${GMX_EXTRA:-}; kiln --device $KILN_DEVICE ${precision[*]:-}, nstlist $KILN_NSTLIST"
} | tee "$OUT/mdrun_peers_table.txt"
exit $status
