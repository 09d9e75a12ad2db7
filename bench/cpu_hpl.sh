#!/usr/bin/env bash
# kiln hpl next to Debian's hpcc (its HPL part) on the CPU, same N, NB, grid and HPL.dat options,
# alternating runs so both see the same machine load.
#   bench/cpu_hpl.sh [BUILD_DIR] [N] [NB] [P] [Q] [ROUNDS]
# OpenBLAS threads per process default to cores / (P*Q); override with OPENBLAS_NUM_THREADS.
# Logs go to $OUT (default out/cpu_hpl); the last lines are a side-by-side table.
set -euo pipefail
BUILD=${1:-build}
N=${2:-8000}
NB=${3:-128}
P=${4:-1}
Q=${5:-1}
ROUNDS=${6:-2}
cd "$(dirname "$0")/.."
KILN=$(realpath "$BUILD/apps/kiln/kiln")
OUT=${OUT:-out/cpu_hpl}
mkdir -p "$OUT"
OUT=$(realpath "$OUT")
command -v hpcc >/dev/null || { echo "hpcc not found: apt-get install hpcc" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
NP=$((P * Q))
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-$(( $(nproc) / NP > 0 ? $(nproc) / NP : 1 ))}

# One HPL.dat for both: HPL's defaults otherwise (PFACT Right, NBMIN 4, NDIV 2, RFACT Crout,
# BCAST 1ringM, DEPTH 1, SWAP mix 64).
DAT=$OUT/HPL.dat
cat > "$DAT" <<DAT
HPLinpack benchmark input file
kiln bench/cpu_hpl.sh
HPL.out      output file name (if any)
8            device out (6=stdout,7=stderr,file)
1            # of problems sizes (N)
$N           Ns
1            # of NBs
$NB          NBs
0            PMAP process mapping (0=Row-,1=Column-major)
1            # of process grids (P x Q)
$P           Ps
$Q           Qs
16.0         threshold
1            # of panel fact
2            PFACTs (0=left, 1=Crout, 2=Right)
1            # of recursive stopping criterium
4            NBMINs (>= 1)
1            # of panels in recursion
2            NDIVs
1            # of recursive panel fact.
1            RFACTs (0=left, 1=Crout, 2=Right)
1            # of broadcast
1            BCASTs (0=1rg,1=1rM,2=2rg,3=2rM,4=Lng,5=LnM)
1            # of lookahead depth
1            DEPTHs (>=0)
2            SWAP (0=bin-exch,1=long,2=mix)
64           swapping threshold
0            L1 in (0=transposed,1=no-transposed) form
0            U  in (0=transposed,1=no-transposed) form
1            Equilibration (0=no,1=yes)
8            memory alignment in double (> 0)
DAT
# hpcc reads hpccinf.txt: the same 31 lines plus its PTRANS lines (kept tiny).
{ cat "$DAT"; printf '%s\n' '##### This line (no. 32) is ignored (it serves as a separator). ######' \
  '0  Number of additional problem sizes for PTRANS' '1000  values of N' \
  '0  number of additional blocking sizes for PTRANS' '64  values of NB'; } > "$OUT/hpccinf.txt"
sed -i '4s/^8 /6 /' "$DAT"   # kiln: report on stdout

echo "machine: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; N=$N NB=$NB P=$P Q=$Q;" \
     "OPENBLAS_NUM_THREADS=$OPENBLAS_NUM_THREADS; $(date -u +%Y-%m-%dT%H:%MZ)" | tee "$OUT/summary.txt"
# --bind-to none: Open MPI binds each rank to one core by default with 1-2 ranks, which would put
# all of a rank's OpenBLAS threads on that core (both programs equally, at half the machine).
run_hpcc() {
  (cd "$OUT" && rm -f hpccoutf.txt && mpirun --bind-to none --oversubscribe -np "$NP" hpcc >/dev/null 2>&1 && cp hpccoutf.txt "hpcc_$1.txt")
}
run_kiln() {
  mpirun --bind-to none --oversubscribe -np "$NP" "$KILN" hpl --dat "$DAT" > "$OUT/kiln_$1.txt"
}
# The order alternates from round to round, so a load that rises or falls during the run does not
# favour whichever goes first.
for round in $(seq 1 "$ROUNDS"); do
  if [ $((round % 2)) -eq 1 ]; then run_hpcc "$round"; run_kiln "$round"; else run_kiln "$round"; run_hpcc "$round"; fi
  hpcc_line=$(grep -A2 '^T/V' "$OUT/hpcc_$round.txt" | grep '^W' | head -1)
  hpcc_resid=$(grep -m1 -E '^\|\|Ax-b\|\|_oo/' "$OUT/hpcc_$round.txt" | awk '{print $NF}')
  kiln_line=$(grep '^W' "$OUT/kiln_$round.txt" | head -1)
  kiln_resid=$(grep -m1 -E 'PASSED|FAILED' "$OUT/kiln_$round.txt" | awk '{print $NF}')
  printf 'round %s  hpcc: %s %s\n' "$round" "$hpcc_line" "$hpcc_resid" | tee -a "$OUT/summary.txt"
  printf 'round %s  kiln: %s %s\n' "$round" "$kiln_line" "$kiln_resid" | tee -a "$OUT/summary.txt"
done
# Medians over the rounds.
for who in hpcc kiln; do
  grep "  $who: " "$OUT/summary.txt" | awk '{print $10}' | sort -g | awk -v who="$who" '
    { v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; printf "median %s: %.3f Gflops over %d rounds\n", who, m, NR }'
done | tee -a "$OUT/summary.txt"
