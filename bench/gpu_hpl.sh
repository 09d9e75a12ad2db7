#!/usr/bin/env bash
# kiln HPL on one GPU, with its peers in the same run (same process launcher, same device):
#   1. cuBLAS DGEMM n x n x n at n=40000 (DGEMM_NS), HPL's first trailing update (DGEMM
#      (N-NB) x (N-NB) x NB) at N_MAX for each NB, cuSOLVER getrf at N=40000 and N_MAX
#      (`kiln hpl --peer ...`)
#   2. the NB sweep at N_MAX (default 120000, the issue's size)
#   3. the N sweep up to N_MAX with the best NB of step 2
#   4. the largest N that fits in the GPU's memory (the first of N_BIG that is accepted), best NB
#   bench/gpu_hpl.sh BUILD_DIR          (a CUDA build of kiln; logs and summary.txt go to $OUT)
# Budget: about 6 minutes on an H200 (an N=120000 solve is ~25 s).
set -euo pipefail
BUILD=${1:?usage: bench/gpu_hpl.sh BUILD_DIR}
cd "$(dirname "$0")/.."
KILN=$(realpath "$BUILD/apps/kiln/kiln")
OUT=${OUT:-out/gpu_hpl}
mkdir -p "$OUT"
N_MAX=${N_MAX:-120000}
NBS=${NBS:-"512 1024 1536 2048"}
NS=${NS:-"10000 20000 30000 40000 60000 80000 100000 $N_MAX"}
N_BIG=${N_BIG:-"137000 136000 134000"}
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
{
  for n in ${DGEMM_NS:-40000}; do timeout 150 "$KILN" hpl --device "$DEVICE" --peer dgemm --n $n --repeats 3; done
  for nb in $NBS; do timeout 120 "$KILN" hpl --device "$DEVICE" --peer update --n "$N_MAX" --nb "$nb" --repeats 3; done
  timeout 120 "$KILN" hpl --device "$DEVICE" --peer getrf --n 40000 --repeats 3
  timeout 200 "$KILN" hpl --device "$DEVICE" --peer getrf --n "$N_MAX" --repeats 1
} 2>&1 | tee "$OUT/peers.txt" | tee -a "$SUMMARY"

# One line per run: N, NB, seconds, TFLOP/s, residual verdict.
results() { grep -E '^W|PASSED|FAILED|rror' "$1" | paste - - | awk '{print $1, "N="$2, "NB="$3, "time="$6, "Gflops="$7, $NF}'; }

echo "== NB sweep at N=$N_MAX (KILN_HPL_PHASES=1: panel stream and update stream breakdown)" | tee -a "$SUMMARY"
hpl_dat "$N_MAX" "$NBS" > "$OUT/HPL_nb.dat"
KILN_HPL_PHASES=1 timeout 300 "$KILN" hpl --device "$DEVICE" --dat "$OUT/HPL_nb.dat" > "$OUT/hpl_nb_sweep.txt" 2>&1 || true
results "$OUT/hpl_nb_sweep.txt" | tee -a "$SUMMARY"
grep -E 'kiln hpl (phases|update)' "$OUT/hpl_nb_sweep.txt" | tee -a "$SUMMARY" || true
BEST_NB=$(grep '^W' "$OUT/hpl_nb_sweep.txt" | awk '{print $7, $3}' | sort -g | tail -1 | awk '{print $2}')
BEST_NB=${BEST_NB:-1024}
echo "best NB at N=$N_MAX: $BEST_NB" | tee -a "$SUMMARY"

echo "== N sweep with NB=$BEST_NB" | tee -a "$SUMMARY"
hpl_dat "$NS" "$BEST_NB" > "$OUT/HPL_n.dat"
timeout 300 "$KILN" hpl --device "$DEVICE" --dat "$OUT/HPL_n.dat" > "$OUT/hpl_n_sweep.txt" 2>&1 || true
results "$OUT/hpl_n_sweep.txt" | tee -a "$SUMMARY"

echo "== the largest N that fits (first accepted of: $N_BIG), NB=$BEST_NB" | tee -a "$SUMMARY"
for n in $N_BIG; do
  if timeout 150 "$KILN" hpl --device "$DEVICE" --n "$n" --nb "$BEST_NB" --nbmin "$NBMIN" --pfact 2 --rfact 2 \
      > "$OUT/hpl_big.txt" 2>&1; then
    results "$OUT/hpl_big.txt" | tee -a "$SUMMARY"
    break
  fi
  grep -m1 "does not fit" "$OUT/hpl_big.txt" | tee -a "$SUMMARY" || true
done

# The issue-size rate against the fastest DGEMM peer, and the first N at 90% of that final rate.
dgemm=$(awk '/PEER dgemm/ {print $4}' "$OUT/peers.txt" | sort -g | tail -1)
update=$(awk -v nb="NB=$BEST_NB" '/PEER update/ && $4 == nb {print $5}' "$OUT/peers.txt" | tail -1)
getrf=$(awk -v n="N=$N_MAX" '/PEER getrf/ && $3 == n {print $4}' "$OUT/peers.txt" | tail -1)
grep '^W' "$OUT/hpl_n_sweep.txt" | awk -v dgemm="${dgemm:-0}" -v update="${update:-0}" -v getrf="${getrf:-0}" '
  { n[NR] = $2; g[NR] = $7 / 1000 }
  END {
    if (NR == 0) { print "no N-sweep results"; exit }
    final = g[NR];
    printf "N=%d: %.2f TFLOP/s = %.1f%% of the fastest square DGEMM (%.2f TFLOP/s)\n", n[NR], final, (dgemm > 0 ? 100 * final / dgemm : 0), dgemm;
    printf "  = %.1f%% of its own first trailing update as one DGEMM (%.2f TFLOP/s); %.2fx cuSOLVER getrf at this N (%.2f TFLOP/s)\n", (update > 0 ? 100 * final / update : 0), update, (getrf > 0 ? final / getrf : 0), getrf;
    for (i = 1; i <= NR; i++) if (g[i] >= 0.9 * final) { printf "first N at >= 90%% of that rate: %d (%.2f TFLOP/s)\n", n[i], g[i]; break }
  }' | tee -a "$SUMMARY"
