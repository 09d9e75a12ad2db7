#!/usr/bin/env bash
# The pipeline bubble of `kiln pretrain-gpt` measured on CPUs (mpirun, one process per stage): for
# each schedule (1F1B, interleaved with v = 2 model chunks per rank, zero-bubble ZB-H1), p = 2 and 4 stages and m = 4 and
# 8 micro-batches per step, trains a few steps of an 8-layer GPT and draws step $STEP with
# --profile-schedule; the measured idle fraction of the ranks' time in that step (1 - busy / (step x
# p), busy = the forward and backward passes, idle = waiting for an activation or a gradient) is
# printed beside the theory: (p - 1) / (m + p - 1) for 1F1B and (p - 1) / (v m + p - 1) for the
# interleaved schedule (the bubble of (p - 1) passes shrinks v times, each pass being 1/v of a stage);
# for zero-bubble, ZB-H1's (p - 1)(F + B - W) / (m (F + B + W) + (p - 1)(F + B - W)) with the step's
# own mean F, B (input gradients) and W (weight gradients) times, read from the drawn timeline's
# log line, and, for reference, (p - 1) / (3 m + p - 1), its value for F = B = W.
# Each configuration runs RUNS times; the table gives the median (and every run's value): the ranks
# share the machine's cores with whatever else runs, which lengthens passes at random.
# Usage: bash bench/pipeline_bubble.sh [build]   (outputs: PNGs and logs in $OUT_DIR, default <build>/pipeline-bubble)
# Environment: STEP (default 2: the first step includes warm-up), ITERS (default 2), RUNS (default 3), MPIRUN (default mpirun),
# SCHEDULES (default "1f1b interleaved zero-bubble"), STAGES (default "2 4"), MICRO (default "4 8").
set -euo pipefail
BUILD=${1:-build}
K=$(cd "$BUILD" && pwd)/apps/kiln/kiln
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${OUT_DIR:-$BUILD/pipeline-bubble}
STEP=${STEP:-2}
ITERS=${ITERS:-2}
RUNS=${RUNS:-3}
MPIRUN=${MPIRUN:-mpirun}
SCHEDULES=${SCHEDULES:-1f1b interleaved zero-bubble}
STAGES=${STAGES:-2 4}
MICRO=${MICRO:-4 8}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
W=$OUT_DIR
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA (W is emptied first)

# Equal stages: the layers dominate (a byte vocabulary keeps the output layer and the loss small).
RUN=(--num-layers 8 --hidden-size 256 --num-attention-heads 8 --seq-length 128 --make-vocab-size-divisible-by 4
     "${TOK[@]}" --data-path "$DATA" --split 100,0,0 --eval-iters 0 --device cpu --no-progress --seed 7
     --micro-batch-size 2 --train-iters "$ITERS" --lr 1e-4 --log-interval "$ITERS")

# The machine's load: the ranks share its cores with whatever else runs (the measured idle time
# includes the waits that other processes cause).
echo "$(date -u +%Y-%m-%d) on $(nproc) cores, load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "| p | m | schedule | measured idle (median of $RUNS runs) | the runs | theory |"
echo "|---|---|---|---|---|---|"
for p in $STAGES; do
  for m in $MICRO; do
    for schedule in $SCHEDULES; do
      v=1
      extra=(--pipeline-schedule "$schedule")
      [ "$schedule" = interleaved ] && v=2 && extra+=(--num-layers-per-virtual-pipeline-stage $((8 / p / v)))
      runs=()
      for r in $(seq 1 "$RUNS"); do
        name=p${p}_m${m}_${schedule}_run$r
        "$MPIRUN" --oversubscribe -np "$p" "$K" pretrain-gpt "${RUN[@]}" --global-batch-size $((2 * m)) \
          --pipeline-model-parallel-size "$p" "${extra[@]}" --profile-schedule "$W/$name.png" \
          --profile-schedule-step "$STEP" > "$W/$name.txt" 2>&1
        runs+=("$(sed -n 's/.*idle \([0-9.]*\)% of the ranks.*/\1/p' "$W/$name.txt")")
      done
      median=$(printf '%s\n' "${runs[@]}" | sort -g | sed -n "$(((RUNS + 1) / 2))p")
      if [ "$schedule" = zero-bubble ]; then
        # F, B, W: the mean pass times of the last run's drawn step (its log line).
        theory=$(python3 - "$W/$name.txt" "$p" "$m" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
p, m = int(sys.argv[2]), int(sys.argv[3])
f, b, w = (float(x) for x in re.search(r"mean F ([0-9.e+-]+) s, B ([0-9.e+-]+) s, W ([0-9.e+-]+) s", text).groups())
zb = (p - 1) * (f + b - w) / (m * (f + b + w) + (p - 1) * (f + b - w))
print(f"{100 * zb:.1f}% (F {f * 1e3:.0f}, B {b * 1e3:.0f}, W {w * 1e3:.0f} ms); {100 * (p - 1) / (3 * m + p - 1):.1f}% if F = B = W")
PY
)
      else
        theory=$(python3 -c "p,m,v=$p,$m,$v; print(f'{100*(p-1)/(v*m+p-1):.1f}%')")
      fi
      label=$([ "$schedule" = interleaved ] && echo "interleaved, v = $v" || ([ "$schedule" = 1f1b ] && echo 1F1B || echo "zero-bubble (ZB-H1)"))
      echo "| $p | $m | $label | ${median}% | $(printf '%s%% ' "${runs[@]}")| $theory |"
    done
  done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
