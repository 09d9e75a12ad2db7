#!/usr/bin/env bash
# Validates `kiln simulate` against measured `kiln pretrain-gpt` runs: calibrates the device, then
# for each configuration trains a few iterations (the last log window is the measurement: elapsed
# time per iteration, and the allocator's peak from "mem alloc/reserved/peak (MiB)") and runs the
# simulator with the very same flags, and prints predicted against measured time and memory.
# Usage: bash bench/simulate_validate.sh [build] [cpu|cuda]    (outputs in $OUT_DIR, default <build>/sim-validate)
# Environment: CALIBRATION=file uses that calibration instead of measuring one; RUNS_ONLY=1 trains and keeps
# the run logs without simulating; SIMULATE_ONLY=1 simulates against run logs already in $OUT_DIR (so the
# training runs can happen on the GPU machine and the predictions anywhere); CONFIGS_FROM/CONFIGS_TO pick
# a range of the configurations (1-based, inclusive).
#   cpu:  5 small GPT-2 / Llama shapes (minutes on 2 cores)
#   cuda: 20 configurations on one H200 (bf16, local and transformer_engine layers, recompute)
set -euo pipefail
BUILD=${1:-build}
DEVICE=${2:-cpu}
K=$BUILD/apps/kiln/kiln
[ -x "$K" ] || K=$BUILD/kiln
SRC=$(cd "$(dirname "$0")/.." && pwd)
OUT_DIR=${OUT_DIR:-$BUILD/sim-validate}
mkdir -p "$OUT_DIR/tok"
# A byte-level GPT-2 tokenizer (256 bytes and <|endoftext|>, no merges: nothing is fetched).
python3 - "$OUT_DIR/tok" <<'PY'
import json, sys
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs, n = bs[:], 0
for b in range(256):
    if b not in bs:
        bs.append(b); cs.append(256 + n); n += 1
vocab = {chr(c): b for b, c in zip(bs, cs)}
vocab["<|endoftext|>"] = 256
json.dump(vocab, open(sys.argv[1] + "/vocab.json", "w"))
open(sys.argv[1] + "/merges.txt", "w").write("#version: 0.2\n")
PY
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$OUT_DIR/tok/vocab.json" --merge-file "$OUT_DIR/tok/merges.txt")
DATA=$OUT_DIR/shakespeare_text_document
if [ ! -f "$DATA.bin" ]; then
  "$K" preprocess-data --input "$SRC/tests/data/tinyshakespeare_100k.txt" --input-format text --text-documents line \
    --append-eod "${TOK[@]}" --output-prefix "$OUT_DIR/shakespeare" > "$OUT_DIR/preprocess.txt"
fi
if [ "$DEVICE" = cpu ]; then
  SYSTEM=cpu
  DEV=(--device cpu)
  SIM=()
  CONFIGS=(
    "--num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 --micro-batch-size 8 --global-batch-size 16"
    "--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4 --global-batch-size 8"
    "--num-layers 4 --hidden-size 128 --num-attention-heads 4 --seq-length 128 --micro-batch-size 4 --global-batch-size 8 --recompute-granularity full"
    "--num-layers 4 --hidden-size 256 --num-attention-heads 8 --group-query-attention --num-query-groups 2 --seq-length 128 --micro-batch-size 2 --global-batch-size 4 --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0"
    "--num-layers 2 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --micro-batch-size 2 --global-batch-size 4 --bf16"
  )
else
  SYSTEM=h200
  # --gpus 1: the H200 system entry describes an 8-GPU node; the runs here use one of its GPUs
  DEV=(--device cuda)
  SIM=(--gpus 1)
  LLAMA="--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights --attention-dropout 0 --hidden-dropout 0 --group-query-attention"
  CONFIGS=()
  for impl in local transformer_engine; do
    CONFIGS+=(
      "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 --bf16 --transformer-impl $impl"
      "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 16 --global-batch-size 32 --bf16 --transformer-impl $impl"
      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 --bf16 --transformer-impl $impl"
      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 4 --global-batch-size 16 --bf16 --transformer-impl $impl --recompute-granularity selective"
      "--num-layers 24 --hidden-size 1024 --num-attention-heads 16 --seq-length 2048 --micro-batch-size 8 --global-batch-size 16 --bf16 --transformer-impl $impl --recompute-granularity full"
      "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 8 --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 --bf16 --transformer-impl $impl $LLAMA"
      "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 8 --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 --bf16 --transformer-impl $impl $LLAMA"
      "--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 8 --seq-length 4096 --micro-batch-size 4 --global-batch-size 8 --bf16 --transformer-impl $impl $LLAMA --recompute-granularity full"
      "--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --num-query-groups 8 --ffn-hidden-size 14336 --seq-length 2048 --micro-batch-size 1 --global-batch-size 4 --bf16 --transformer-impl $impl $LLAMA --recompute-granularity full"
      "--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 --transformer-impl $impl"
    )
  done
fi
CAL=${CALIBRATION:-$OUT_DIR/calibration_$SYSTEM.json}
if [ -z "${CALIBRATION:-}" ] && [ -z "${SIMULATE_ONLY:-}" ]; then
  "$K" simulate --calibrate --calibration "$CAL" "${DEV[@]}" | tee "$OUT_DIR/calibrate.txt"
fi
RESULTS=$OUT_DIR/results.tsv
: > "$RESULTS"
i=0
for cfg in "${CONFIGS[@]}"; do
  i=$((i + 1))
  [ "$i" -ge "${CONFIGS_FROM:-1}" ] && [ "$i" -le "${CONFIGS_TO:-999}" ] || continue
  # shellcheck disable=SC2206
  FLAGS=($cfg "${TOK[@]}" --lr 1e-4 --train-iters 6 --log-interval 3 --eval-iters 0 --no-progress --seed 1 "${DEV[@]}")
  if [ -z "${SIMULATE_ONLY:-}" ] &&
    ! "$K" pretrain-gpt "${FLAGS[@]}" --data-path "$DATA" --split 100,0,0 > "$OUT_DIR/run_$i.txt" 2>&1; then
    echo "config $i: pretrain-gpt failed (see $OUT_DIR/run_$i.txt)" >&2
    continue
  fi
  grep -q "^ iteration" "$OUT_DIR/run_$i.txt" 2>/dev/null || { echo "config $i: no measured run" >&2; continue; }
  [ -n "${RUNS_ONLY:-}" ] && { echo "config $i: $(grep '^ iteration' "$OUT_DIR/run_$i.txt" | tail -1 | cut -c1-200)"; continue; }
  "$K" simulate "${FLAGS[@]}" "${SIM[@]}" --system "$SYSTEM" --calibration "$CAL" > "$OUT_DIR/sim_$i.txt" 2>&1 ||
    { echo "config $i: simulate failed (see $OUT_DIR/sim_$i.txt)" >&2; continue; }
  python3 - "$OUT_DIR/run_$i.txt" "$OUT_DIR/sim_$i.txt" "$cfg" >> "$RESULTS" <<'PY'
import re, sys
run, sim, cfg = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
lines = [l for l in run.splitlines() if l.startswith(" iteration")]
last = lines[-1]
ms = float(re.search(r"elapsed time per iteration \(ms\): ([0-9.]+)", last).group(1))
peak = float(re.search(r"mem alloc/reserved/peak \(MiB\): [0-9.]+/[0-9.]+/([0-9.]+)", last).group(1))
pms = float(re.search(r"predicted: elapsed time per iteration \(ms\): ([0-9.]+)", sim).group(1))
ppeak = float(re.search(r"predicted mem peak \(MiB\): ([0-9.]+)", sim).group(1))
print(f"{ms}\t{pms}\t{peak}\t{ppeak}\t{cfg}")
PY
done
python3 - "$RESULTS" <<'PY' | tee "$OUT_DIR/table.txt"
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"{'#':>2} {'meas ms':>9} {'pred ms':>9} {'err':>7} {'meas MiB':>9} {'pred MiB':>9} {'err':>7}  configuration")
for i, (ms, pms, peak, ppeak, cfg) in enumerate(rows, 1):
    ms, pms, peak, ppeak = map(float, (ms, pms, peak, ppeak))
    print(f"{i:>2} {ms:>9.1f} {pms:>9.1f} {100 * (pms / ms - 1):>+6.1f}% {peak:>9.1f} {ppeak:>9.1f} {100 * (ppeak / peak - 1):>+6.1f}%  {cfg}")
PY
