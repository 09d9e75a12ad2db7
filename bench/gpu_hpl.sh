#!/usr/bin/env bash
# kiln HPL on one GPU, with its peers in the same run (same process launcher, same device):
#   1. cuBLAS DGEMM (n x n x n) and cuSOLVER getrf at N=40000   (`kiln hpl --peer ...`)
#   2. the NB sweep at N=${NB_SWEEP_N:-40000}
#   3. the N sweep up to ${N_MAX:-120000} with the best NB of step 2
#   bench/gpu_hpl.sh BUILD_DIR          (a CUDA build of kiln; logs and summary.txt go to $OUT)
# Budget: about 6 minutes on an H200 (most of it the N sweep: the N=120000 solve is ~25 s).
set -euo pipefail
BUILD=${1:?usage: bench/gpu_hpl.sh BUILD_DIR}
cd "$(dirname "$0")/.."
KILN=$(realpath "$BUILD/apps/kiln/kiln")
OUT=${OUT:-out/gpu_hpl}
mkdir -p "$OUT"
N_MAX=${N_MAX:-120000}
NB_SWEEP_N=${NB_SWEEP_N:-40000}
NBS=${NBS:-"256 384 512 768 1024"}
NS=${NS:-"10000 20000 30000 40000 60000 80000 100000 $N_MAX"}
NBMIN=${NBMIN:-16}
DEVICE=${DEVICE:-cuda}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
SUMMARY=$OUT/summary.txt
{
  echo "kiln gpu_hpl.sh $(date -u +%Y-%m-%dT%H:%MZ)"
  nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit --format=csv,noheader 2>/dev/null || true
  "$KILN" check-device | sed -n '1,4p'
} | tee "$SUMMARY"

hpl_dat() {  # hpl_dat "Ns" "NBs" -> HPL.dat on stdout (1 x 1 grid, PFACT/RFACT Right, NBMIN, NDIV 2, DEPTH 1)
  local ns=($1) nbs=($2)
  cat <<DAT
HPLinpack benchmark input file
kiln bench/gpu_hpl.sh
HPL.out      output file name (if any)
6            device out (6=stdout,7=stderr,file)
${#ns[@]}            # of problems sizes (N)
${ns[*]}     Ns
${#nbs[@]}            # of NBs
${nbs[*]}    NBs
0            PMAP process mapping (0=Row-,1=Column-major)
1            # of process grids (P x Q)
1            Ps
1            Qs
16.0         threshold
1            # of panel fact
2            PFACTs (0=left, 1=Crout, 2=Right)
1            # of recursive stopping criterium
$NBMIN       NBMINs (>= 1)
1            # of panels in recursion
2            NDIVs
1            # of recursive panel fact.
2            RFACTs (0=left, 1=Crout, 2=Right)
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
}

echo "== peers (same device, this run)" | tee -a "$SUMMARY"
timeout 120 "$KILN" hpl --device "$DEVICE" --peer dgemm --n 40000 --repeats 3 2>&1 | tee "$OUT/peer_dgemm.txt" | tee -a "$SUMMARY"
timeout 120 "$KILN" hpl --device "$DEVICE" --peer getrf --n 40000 --repeats 3 2>&1 | tee "$OUT/peer_getrf.txt" | tee -a "$SUMMARY"

echo "== NB sweep at N=$NB_SWEEP_N (after a warm-up solve at N=5000)" | tee -a "$SUMMARY"
hpl_dat "5000 $NB_SWEEP_N" "$NBS" > "$OUT/HPL_nb.dat"
timeout 150 "$KILN" hpl --device "$DEVICE" --dat "$OUT/HPL_nb.dat" > "$OUT/hpl_nb_sweep.txt" 2>&1 || true
grep -E '^W|PASSED|FAILED|rror' "$OUT/hpl_nb_sweep.txt" | paste - - | awk '{print $1, "N="$2, "NB="$3, "time="$6, "Gflops="$7, $NF}' \
  | grep -v "N=5000 " | tee -a "$SUMMARY"
BEST_NB=$(grep '^W' "$OUT/hpl_nb_sweep.txt" | awk -v n="$NB_SWEEP_N" '$2 == n {print $7, $3}' | sort -g | tail -1 | awk '{print $2}')
BEST_NB=${BEST_NB:-512}
echo "best NB at N=$NB_SWEEP_N: $BEST_NB" | tee -a "$SUMMARY"

echo "== N sweep with NB=$BEST_NB" | tee -a "$SUMMARY"
hpl_dat "$NS" "$BEST_NB" > "$OUT/HPL_n.dat"
KILN_HPL_PHASES=1 timeout 300 "$KILN" hpl --device "$DEVICE" --dat "$OUT/HPL_n.dat" > "$OUT/hpl_n_sweep.txt" 2>&1 || true
grep -E '^W|PASSED|FAILED|rror' "$OUT/hpl_n_sweep.txt" | paste - - | awk '{print $1, "N="$2, "NB="$3, "time="$6, "Gflops="$7, $NF}' \
  | tee -a "$SUMMARY"

grep 'kiln hpl phases' "$OUT/hpl_n_sweep.txt" | tee -a "$SUMMARY" || true

# The largest N's rate against the DGEMM peer, and the first N at 90% of that final rate.
dgemm=$(awk '/PEER dgemm/ {print $4}' "$OUT/peer_dgemm.txt")
grep '^W' "$OUT/hpl_n_sweep.txt" | awk -v dgemm="${dgemm:-0}" '
  { n[NR] = $2; g[NR] = $7 / 1000 }
  END {
    if (NR == 0) { print "no N-sweep results"; exit }
    final = g[NR];
    printf "largest N=%d: %.2f TFLOP/s = %.1f%% of DGEMM (%.2f TFLOP/s)\n", n[NR], final, dgemm > 0 ? 100 * final / dgemm : 0, dgemm;
    for (i = 1; i <= NR; i++) if (g[i] >= 0.9 * final) { printf "first N at >= 90%% of the final rate: %d (%.2f TFLOP/s)\n", n[i], g[i]; break }
  }' | tee -a "$SUMMARY"
