#!/usr/bin/env bash
# llm.c peer of `kiln pretrain-gpt`'s GPT-2 124M speed table (issue 17), on the H200 machine: builds
# karpathy/llm.c's train_gpt2cu from the snapshot that tools/fetch-peers.sh exported into .peers/llm.c
# (its own Makefile: bf16, sm_90, without cuDNN, MPI or NCCL), writes random GPT-2 token ids in llm.c's
# .bin format, and trains GPT-2 124M from random initialisation (llm.c's `-e d12` descriptor).
#
#   bash bench/llmc_peer.sh [OUT_DIR]     -> one JSON line on stdout (also OUT_DIR/llmc_peer.json)
#   bash bench/llmc_peer.sh --build-only  -> only the build (as checked on a machine without a GPU)
#
# Same work as tools/gpu-session.sh's gpt2_steps: B 16, T 1024, no gradient accumulation, vocabulary
# 50257 padded to 50304 (llm.c pads to 128 as Kiln does), bf16 with fp32 master weights (-w 1),
# AdamW lr 6e-4 with 10 warm-up steps and cosine decay to 6e-5 (-q 0.1), weight decay 0.1; llm.c
# hard-codes beta1 0.9, beta2 0.95, eps 1e-8 and clip 1.0. No recomputation (-r 0: Kiln, PyTorch and
# Megatron recompute nothing either); llm.c's default GELU fusion for sm_90 (cuBLASLt epilogues).
# No sampling (-s 0), no checkpoints (-n 0), one validation batch at the first and last step only
# (-v past the last step, -m 1), outside the timed region.
# Without cuDNN llm.c runs its own attention kernels (it materialises the T x T scores); llm.c's cuDNN
# flash-attention path needs the cudnn-frontend headers, which the machine does not have.
# Timing: llm.c's own per-step CUDA-event time (forward, backward, clip, update); reported: the median
# of steps 11-60 (the first 10 hold cuBLAS's start and the allocator), tokens_per_s = 16 * 1024 / that.
# Environment: LLMC_DIR (.peers/llm.c), LLMC_STEPS (60), LLMC_TIMEOUT (180 s), NVCC (nvcc on PATH or
# /usr/local/cuda/bin/nvcc), PYTHON (for the data and the JSON; python3).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ROOT=$PWD
LLMC=${LLMC_DIR:-.peers/llm.c}
STEPS=${LLMC_STEPS:-60}
B=16
T=1024
BUILD_ONLY=0
[ "${1:-}" = "--build-only" ] && { BUILD_ONLY=1; shift; }
OUT_DIR=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT_DIR"
LOG="$OUT_DIR/llmc_peer.log"
: > "$LOG"
PY=${PYTHON:-python3}
fail() {
  echo "llmc_peer: $1" >&2
  echo "--- last 40 lines of $LOG ---" >&2; tail -40 "$LOG" >&2
  printf '{"peer": "llm.c", "error": "%s"}\n' "$1" | tee "$OUT_DIR/llmc_peer.json"
  exit 1
}
[ -f "$LLMC/train_gpt2.cu" ] || fail "no $LLMC/train_gpt2.cu (run tools/fetch-peers.sh here and carry .peers)"
COMMIT=$(cat "$LLMC/COMMIT" 2>/dev/null || echo unknown)

NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
[ -x "$NVCC" ] || fail "no nvcc (set NVCC)"
CUDA_HOME=${CUDA_HOME:-$(cd "$(dirname "$NVCC")/.." && pwd)}
# llm.c's Makefile links -lnvidia-ml for its optional GPU-utilisation log; its sources use NVML only
# when nvcc finds nvml.h (llmc/mfu.h: __has_include). Link NVML only then, from the toolkit's stub or
# the driver's library, so a toolkit without NVML's development files still builds.
LDFLAGS_LLMC="-lcublas -lcublasLt"
if ls "$CUDA_HOME"/include/nvml.h "$CUDA_HOME"/targets/*/include/nvml.h > /dev/null 2>&1; then
  nvml=$(ls "$CUDA_HOME"/lib64/stubs/libnvidia-ml.so "$CUDA_HOME"/targets/*/lib/stubs/libnvidia-ml.so \
    /usr/local/nvidia/lib64/libnvidia-ml.so.1 /usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1 2> /dev/null | head -1)
  [ -n "$nvml" ] || fail "nvml.h is in $CUDA_HOME but no libnvidia-ml to link"
  LDFLAGS_LLMC="$LDFLAGS_LLMC -Xlinker $nvml"
fi
# CUDA 13 removed the cudaMemAdvise overload llm.c calls; bench/llmc_cuda13_compat.h (Kiln's,
# force-included) restores it, so llm.c's sources build unchanged.
MAKE_VARS=(NO_MULTI_GPU=1 NO_USE_MPI=1 USE_CUDNN=0 GPU_COMPUTE_CAPABILITY=90 PRECISION=BF16
  "NVCC=$NVCC" "NVCC_LDFLAGS=$LDFLAGS_LLMC" "NVCC_INCLUDES=-include $ROOT/bench/llmc_cuda13_compat.h")
start=$(date +%s)
rm -f "$LLMC/train_gpt2cu"  # always built here: a binary carried from elsewhere may not run on this machine
if command -v make > /dev/null; then
  (cd "$LLMC" && timeout "${LLMC_BUILD_TIMEOUT:-300}" make train_gpt2cu "${MAKE_VARS[@]}") >> "$LOG" 2>&1
else  # the line llm.c's Makefile runs with the variables above
  # shellcheck disable=SC2086
  (cd "$LLMC" && timeout "${LLMC_BUILD_TIMEOUT:-300}" "$NVCC" --threads=0 -t=0 --use_fast_math -std=c++17 -O3 \
    --generate-code 'arch=compute_90,code=[compute_90,sm_90]' -DENABLE_BF16 train_gpt2.cu $LDFLAGS_LLMC \
    -include "$ROOT/bench/llmc_cuda13_compat.h" -o train_gpt2cu) >> "$LOG" 2>&1
fi
[ -x "$LLMC/train_gpt2cu" ] || fail "building train_gpt2cu failed"
echo "llmc_peer: train_gpt2cu built in $(( $(date +%s) - start )) s" >&2
[ $BUILD_ONLY = 1 ] && exit 0

# Random GPT-2 token ids in llm.c's data format (dev/data/data_common.py): a header of 256 int32
# (magic 20240520, version 1, token count), then uint16 tokens. 2^21 training tokens cover the
# 60 steps of 16 x 1024 in one epoch; the validation file holds a few batches.
DATA=${LLMC_DATA:-/tmp/llmc_syn}
mkdir -p "$DATA"
"$PY" - "$DATA" <<'PY' >> "$LOG" 2>&1 || fail "writing the token files failed"
import array, os, random, struct, sys
rng = random.Random(1)
for name, n in (("train", 1 << 21), ("val", 1 << 16)):
    path = os.path.join(sys.argv[1], f"syn_{name}.bin")
    if os.path.exists(path) and os.path.getsize(path) == 1024 + 2 * n:
        continue
    header = struct.pack("<3i", 20240520, 1, n) + bytes(4 * 253)
    tokens = array.array("H", (rng.randrange(50257) for _ in range(n)))
    with open(path + ".tmp", "wb") as f:
        f.write(header)
        f.write(tokens.tobytes())  # little-endian on x86-64, as llm.c reads it
    os.replace(path + ".tmp", path)
    print(f"wrote {n} random GPT-2 ids to {path}")
PY

ARGS=(-i "$DATA/syn_train.bin" -j "$DATA/syn_val.bin" -e d12 -b "$B" -t "$T" -d $((B * T)) -x "$STEPS"
  -k cosine -l 6e-4 -u 10 -q 0.1 -c 0.1 -v 1000000 -m 1 -s 0 -h 0 -n 0 -r 0 -w 1 -f 1 -z 0)
echo "llmc_peer: ./train_gpt2cu ${ARGS[*]}" >> "$LOG"
start=$(date +%s)
# line-buffered, so that a run stopped by its time limit still leaves the steps it printed
LINEBUF=(); command -v stdbuf > /dev/null && LINEBUF=(stdbuf -oL)
(cd "$LLMC" && timeout "${LLMC_TIMEOUT:-180}" "${LINEBUF[@]}" ./train_gpt2cu "${ARGS[@]}") >> "$LOG" 2>&1
rc=$?
echo "llmc_peer: train_gpt2cu rc=$rc after $(( $(date +%s) - start )) s (log $LOG)" >&2
# The steps it printed count even if it failed afterwards: the JSON says exit_code.
"$PY" - "$LOG" "$COMMIT" "$B" "$T" "$rc" <<'PY' > "$OUT_DIR/llmc_peer.json" \
  || fail "train_gpt2cu exited with $rc and printed too few steps"
import json, re, statistics, sys
log, commit, b, t, rc = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
steps = {}
mfu = {}
# "step   12/60 | loss 10.98 (+0.00z)| norm 1.02 (+0.00z)| lr 6.00e-04 | 45.12 ms | 40.1% bf16 MFU | ..."
# (llm.c's MFU is negative on a GPU missing from its table of promised FLOPs, as the H200 is)
for m in re.finditer(r"^step\s+(\d+)/\d+ \|.*?\| ([0-9.]+) ms \|(?: (-?[0-9.]+)% bf16 MFU)?", open(log, errors="replace").read(), re.M):
    steps[int(m.group(1))] = float(m.group(2))
    if m.group(3) is not None and float(m.group(3)) > 0:
        mfu[int(m.group(1))] = float(m.group(3))
timed = [steps[s] for s in sorted(steps) if s > 10]
if len(timed) < 5:
    print(json.dumps({"peer": "llm.c", "commit": commit, "error": f"only {len(steps)} step lines in {log}"}))
    sys.exit(1)
ms = statistics.median(timed)
print(json.dumps({
    "peer": "llm.c", "commit": commit, "ms_per_step": ms, "tokens_per_s": b * t / (ms / 1e3),
    "ms_min": min(timed), "ms_max": max(timed), "steps_timed": f"median of steps 11-{max(steps)}",
    "llmc_mfu_percent": statistics.median(v for k, v in mfu.items() if k > 10) if any(k > 10 for k in mfu) else None,
    "build": "make train_gpt2cu: bf16, sm_90, USE_CUDNN=0 (llm.c's own attention), no MPI/NCCL",
    "micro_batch": b, "seq": t, "exit_code": rc,
}))
PY
cat "$OUT_DIR/llmc_peer.json"
