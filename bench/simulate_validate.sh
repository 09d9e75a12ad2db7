#!/usr/bin/env bash
# Validates `kiln simulate` against measured `kiln pretrain-gpt` runs: calibrates the device, then
# for each configuration trains a few iterations (the last log window is the measurement: elapsed
# time per iteration, and the allocator's peak from "mem alloc/reserved/peak (MiB)") and runs the
# simulator with the very same flags, and prints predicted against measured time and memory.
# Usage: bash bench/simulate_validate.sh [build] [cpu|cuda]    (outputs in $OUT_DIR, default <build>/sim-validate)
# Environment: CALIBRATION=file uses that calibration instead of measuring one; RUNS_ONLY=1 trains and keeps
# the run logs without simulating; SIMULATE_ONLY=1 simulates against run logs already in $OUT_DIR (so the
# training runs can happen on the GPU machine and the predictions anywhere); CONFIGS_FROM/CONFIGS_TO pick
# a range of the configurations (1-based, inclusive); CONFIGS_FILE replaces the list (one per line);
# ITERS / LOG_INTERVAL the iterations and log window (cpu 6/3, cuda 12/4). Each table row starts with
# its configuration's number.
#   cpu:  5 small GPT-2 / Llama shapes (minutes on 2 cores)
#   cuda: 22 configurations on one H200 (GPT-2 124M/350M, Llama-shaped 1B/2.4B; local and
#         transformer_engine layers; fp32, bf16 and FP8 delayed/tensorwise/blockwise; dropout 0 and 0.1;
#         selective and full recompute)
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
  # SIM_SYSTEM: the built-in system entry the predictions use (h200, or h100-sxm when the runs were made on an H100).
  SYSTEM=${SIM_SYSTEM:-h200}
  # --gpus 1: the H200 system entry describes an 8-GPU node; the runs here use one of its GPUs.
  # Dropout is set on every configuration: 0 as LLM pretraining runs (transformer_engine layers then
  # run fused attention), 0.1 on a few to cover the unfused attention path with dropout (what
  # transformer_engine layers fall back to, models/transformer_te_ops.cpp). All 22 configurations,
  # 12 iterations each, and the calibration take about 5 minutes on one H200 (from the 2026-12-03
  # step times; docs/simulate.md). An 8B-shaped model does not fit one H200 as Kiln trains it (fp32
  # gradients and Adam state: 18 bytes per parameter, 144 GB), so the largest is a 2.4B shape. The
  # fp32 transformer_engine configuration keeps dropout 0.1 (the unfused path): without it te/'s
  # attention runs Kiln's own fp32 flash kernel, ~0.5 TFLOP/s on the H200 (2026-12-03 calibration),
  # about 4 s per iteration.
  DEV=(--device cuda)
  SIM=(--gpus 1)
  ND="--attention-dropout 0 --hidden-dropout 0"
  D1="--attention-dropout 0.1 --hidden-dropout 0.1"
  LLAMA="--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear --untie-embeddings-and-output-weights --group-query-attention"
  G124="--num-layers 12 --hidden-size 768 --num-attention-heads 12 --seq-length 1024"
  G350="--num-layers 24 --hidden-size 1024 --num-attention-heads 16"
  L1B="--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --num-query-groups 8 $LLAMA"
  L3B="--num-layers 24 --hidden-size 3072 --num-attention-heads 24 --num-query-groups 8 --ffn-hidden-size 8192 $LLAMA"
  TE="--bf16 --transformer-impl transformer_engine"
  LOCAL="--bf16 --transformer-impl local"
  CONFIGS=(
    "$G124 --micro-batch-size 8 --global-batch-size 32 $LOCAL $ND"
    "$G124 --micro-batch-size 8 --global-batch-size 32 $LOCAL $D1"
    "$G350 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 $LOCAL $ND"
    "$G350 --seq-length 2048 --micro-batch-size 4 --global-batch-size 8 $LOCAL $D1 --recompute-granularity selective"
    "$L1B --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 $LOCAL $ND"
    "$G124 --micro-batch-size 8 --global-batch-size 32 --transformer-impl local $ND"
    "$G124 --micro-batch-size 8 --global-batch-size 32 $TE $ND"
    "$G124 --micro-batch-size 16 --global-batch-size 32 $TE $ND"
    "$G124 --micro-batch-size 8 --global-batch-size 32 $TE $D1"
    "$G350 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 $TE $ND"
    "$G350 --seq-length 2048 --micro-batch-size 4 --global-batch-size 16 $TE $ND --recompute-granularity selective"
    "$G350 --seq-length 2048 --micro-batch-size 8 --global-batch-size 16 $TE $ND --recompute-granularity full"
    "$L1B --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 $TE $ND"
    "$L1B --seq-length 4096 --micro-batch-size 1 --global-batch-size 8 $TE $ND"
    "$L1B --seq-length 4096 --micro-batch-size 4 --global-batch-size 8 $TE $ND --recompute-granularity full"
    "$L3B --seq-length 2048 --micro-batch-size 1 --global-batch-size 4 $TE $ND"
    "$G124 --micro-batch-size 8 --global-batch-size 32 --transformer-impl transformer_engine $D1"
    "$L1B --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 $TE $ND --fp8-format hybrid --fp8-recipe delayed"
    "$L1B --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 $TE $ND --fp8-format hybrid --fp8-recipe tensorwise"
    "$L1B --seq-length 2048 --micro-batch-size 2 --global-batch-size 8 $TE $ND --fp8-format hybrid --fp8-recipe blockwise"
    "$G350 --seq-length 1024 --micro-batch-size 8 --global-batch-size 32 $TE $ND --fp8-format hybrid --fp8-recipe delayed"
    "$L1B --seq-length 4096 --micro-batch-size 4 --global-batch-size 8 $TE $ND --fp8-format hybrid --fp8-recipe blockwise --recompute-granularity full"
  )
fi
# CONFIGS_FILE: one configuration per line (line N is configuration N; an empty line keeps the
# numbering), instead of the list above: e.g. an archived session's list, to simulate its run logs.
if [ -n "${CONFIGS_FILE:-}" ]; then mapfile -t CONFIGS < "$CONFIGS_FILE"; fi
# The measurement is the last log window: on the GPU iterations 9-12 (steady state: the first
# iterations allocate, warm cuBLAS / cuDNN plans and the optimizer's state).
if [ "$DEVICE" = cpu ]; then ITERS=${ITERS:-6} LOG=${LOG_INTERVAL:-3}; else ITERS=${ITERS:-12} LOG=${LOG_INTERVAL:-4}; fi
CAL=${CALIBRATION:-$OUT_DIR/calibration_$SYSTEM.json}
# Calibrated only when predictions are made here: RUNS_ONLY trains and predicts nothing.
if [ -z "${CALIBRATION:-}" ] && [ -z "${SIMULATE_ONLY:-}" ] && [ -z "${RUNS_ONLY:-}" ]; then
  "$K" simulate --calibrate --calibration "$CAL" "${DEV[@]}" | tee "$OUT_DIR/calibrate.txt"
fi
RESULTS=$OUT_DIR/results.tsv
: > "$RESULTS"
i=0
for cfg in "${CONFIGS[@]}"; do
  i=$((i + 1))
  [ -n "$cfg" ] || continue
  [ "$i" -ge "${CONFIGS_FROM:-1}" ] && [ "$i" -le "${CONFIGS_TO:-999}" ] || continue
  # shellcheck disable=SC2206
  FLAGS=($cfg "${TOK[@]}" --lr 1e-4 --train-iters "$ITERS" --log-interval "$LOG" --eval-iters 0 --no-progress --seed 1 "${DEV[@]}")
  # RUN_PREFIX: a command the training runs under (e.g. a profiler: tools/gpu-session.sh simprof).
  # shellcheck disable=SC2206
  PREFIX=(${RUN_PREFIX:-})
  if [ -z "${SIMULATE_ONLY:-}" ] &&
    ! "${PREFIX[@]}" "$K" pretrain-gpt "${FLAGS[@]}" --data-path "$DATA" --split 100,0,0 > "$OUT_DIR/run_$i.txt" 2>&1; then
    echo "config $i: pretrain-gpt failed (see $OUT_DIR/run_$i.txt)" >&2
    continue
  fi
  grep -q "^ iteration" "$OUT_DIR/run_$i.txt" 2>/dev/null || { echo "config $i: no measured run" >&2; continue; }
  [ -n "${RUNS_ONLY:-}" ] && { echo "config $i: $(grep '^ iteration' "$OUT_DIR/run_$i.txt" | tail -1 | cut -c1-200)"; continue; }
  "$K" simulate "${FLAGS[@]}" "${SIM[@]}" --system "$SYSTEM" --calibration "$CAL" > "$OUT_DIR/sim_$i.txt" 2>&1 ||
    { echo "config $i: simulate failed (see $OUT_DIR/sim_$i.txt)" >&2; continue; }
  python3 - "$OUT_DIR/run_$i.txt" "$OUT_DIR/sim_$i.txt" "$cfg" "$i" >> "$RESULTS" <<'PY'
import re, sys
run, sim, cfg = open(sys.argv[1]).read(), open(sys.argv[2]).read(), sys.argv[3]
lines = [l for l in run.splitlines() if l.startswith(" iteration")]
last = lines[-1]
ms = float(re.search(r"elapsed time per iteration \(ms\): ([0-9.]+)", last).group(1))
peak = float(re.search(r"mem alloc/reserved/peak \(MiB\): [0-9.]+/[0-9.]+/([0-9.]+)", last).group(1))
pms = float(re.search(r"predicted: elapsed time per iteration \(ms\): ([0-9.]+)", sim).group(1))
ppeak = float(re.search(r"predicted mem peak \(MiB\): ([0-9.]+)", sim).group(1))
print(f"{sys.argv[4]}\t{ms}\t{pms}\t{peak}\t{ppeak}\t{cfg}")
PY
done
python3 - "$RESULTS" <<'PY' | tee "$OUT_DIR/table.txt"
import sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
print(f"{'#':>2} {'meas ms':>9} {'pred ms':>9} {'err':>7} {'meas MiB':>9} {'pred MiB':>9} {'err':>7}  configuration")
for i, ms, pms, peak, ppeak, cfg in rows:
    ms, pms, peak, ppeak = map(float, (ms, pms, peak, ppeak))
    print(f"{i:>2} {ms:>9.1f} {pms:>9.1f} {100 * (pms / ms - 1):>+6.1f}% {peak:>9.1f} {ppeak:>9.1f} {100 * (ppeak / peak - 1):>+6.1f}%  {cfg}")
PY
