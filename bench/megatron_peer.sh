#!/usr/bin/env bash
# Megatron-core peer of `kiln pretrain-gpt`'s GPT-2 124M speed table (issue 17), on the H200 machine:
# Megatron-LM's own pretrain_gpt.py from the snapshot that tools/fetch-peers.sh exported into
# .peers/Megatron-LM, run as one process on one GPU with the machine's PyTorch, the local transformer
# implementation (TransformerEngine is not installed there) and none of apex's or TE's fused kernels,
# on Megatron's --mock-data (random-length documents of counting tokens: speed only, as Kiln's run).
#
#   bash bench/megatron_peer.sh [OUT_DIR]      -> one JSON line on stdout (also OUT_DIR/megatron_peer.json)
#   bash bench/megatron_peer.sh --print-args   -> pretrain_gpt.py's arguments, one per line (for checks)
#
# Same shapes and optimiser as tools/gpu-session.sh's gpt2_steps: 12 layers, hidden 768, 12 heads,
# T 1024, micro-batch 16 = global batch (no accumulation), vocabulary 50257 padded to 50304, bf16 with
# fp32 master weights, AdamW lr 6e-4 -> 6e-5 cosine with 10 warm-up iterations, weight decay 0.1,
# beta2 0.95, clip 1.0, no dropout, tied embeddings, learned positions, LayerNorm, GELU, biases.
# What Megatron's local implementation brings: unfused attention (baddbmm, softmax, bmm: no flash
# attention without TE), torch.nn.LayerNorm (no apex), jit-fused bias+GELU and bias+dropout+add
# (torch.compile/jit, no CUDA extension), its DDP gradient buffer and its Adam (torch's fused AdamW
# when apex is missing). Timing: Megatron's "elapsed time per iteration (ms)" over each log window of
# 10 iterations; reported: the median of the windows after the first two (which hold the start-up and
# the jit compilations), ms_per_step and tokens_per_s = 16 * 1024 / that.
# Environment: PYTHON (default /opt/torch/.venv/bin/python3 where it exists, else python3),
# MEGATRON_ITERS (60), MEGATRON_DIR (.peers/Megatron-LM), MEGATRON_TIMEOUT (300 s).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
ITERS=${MEGATRON_ITERS:-60}
SHAPE=${MEGATRON_SHAPE:-gpt2-124m}
case "$SHAPE" in
  gpt2-124m)
    MB=16
    SEQ=1024
    MODEL=(
      --num-layers 12 --hidden-size 768 --ffn-hidden-size 3072 --num-attention-heads 12
      --position-embedding-type learned_absolute --normalization LayerNorm
      --vocab-size 50257
    )
    ;;
  moe-8x2-d2048)
    # Issue 19's MoE layer stack, as bench/moe_torch_peer.py and tools/gpu-session.sh's moepeers stage
    # build it: 8 layers, hidden 2048, 16 heads in 4 query groups, RoPE, RMSNorm, SwiGLU, no biases,
    # untied output, vocabulary 32000, T 2048, micro-batch 4; every MLP 8 experts of width 4096, top-2
    # softmax routing with the aux loss. Without TransformerEngine (and without the grouped_gemm
    # package) Megatron-core runs its SequentialMLP (a loop over the experts) and the alltoall
    # dispatcher (one rank: permutation only).
    MB=4
    SEQ=2048
    MODEL=(
      --num-layers 8 --hidden-size 2048 --num-attention-heads 16 --group-query-attention --num-query-groups 4
      --ffn-hidden-size 4096 --position-embedding-type rope --no-rope-fusion --normalization RMSNorm --swiglu
      --disable-bias-linear --untie-embeddings-and-output-weights
      --num-experts 8 --moe-router-topk 2 --moe-ffn-hidden-size 4096 --moe-aux-loss-coeff 1e-2
      --moe-router-load-balancing-type aux_loss --moe-token-dispatcher-type alltoall
      --vocab-size 32000
    )
    ;;
  *) echo "megatron_peer: unknown MEGATRON_SHAPE '$SHAPE' (gpt2-124m, moe-8x2-d2048)" >&2; exit 1 ;;
esac
# shellcheck disable=SC2054  # "--split 98,2,0" is one argument
ARGS=(
  "${MODEL[@]}"
  --seq-length "$SEQ" --max-position-embeddings "$SEQ" --init-method-std 0.02
  --attention-dropout 0.0 --hidden-dropout 0.0
  --micro-batch-size "$MB" --global-batch-size "$MB" --train-iters "$ITERS"
  --lr 6e-4 --min-lr 6e-5 --lr-decay-style cosine --lr-warmup-iters 10
  --weight-decay 0.1 --adam-beta1 0.9 --adam-beta2 0.95 --clip-grad 1.0 --bf16
  --transformer-impl local
  --no-gradient-accumulation-fusion --no-masked-softmax-fusion --no-persist-layer-norm
  --mock-data --tokenizer-type NullTokenizer --make-vocab-size-divisible-by 128
  --split 98,2,0 --eval-iters 0 --eval-interval 100000 --num-workers 2
  --log-interval 10 --log-throughput --seed 1234
  --distributed-backend nccl
)
if [ "${1:-}" = "--print-args" ]; then printf '%s\n' "${ARGS[@]}"; exit 0; fi

OUT_DIR=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT_DIR"
MEG=${MEGATRON_DIR:-.peers/Megatron-LM}
PY=${PYTHON:-}
[ -n "$PY" ] || { [ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3 || PY=$(command -v python3); }
PY=$(command -v "$PY") || { echo "megatron_peer: no python ($PYTHON)" >&2; exit 1; }
LOG="$OUT_DIR/megatron_peer.log"
: > "$LOG"
fail() {  # one JSON line saying why, and the end of Megatron's output for the next fix
  echo "megatron_peer: $1" >&2
  [ -f "$LOG" ] && { echo "--- last 60 lines of $LOG ---" >&2; tail -60 "$LOG" >&2; }
  printf '{"peer": "megatron-core", "impl": "local", "error": "%s"}\n' "$1" | tee "$OUT_DIR/megatron_peer.json"
  exit 1
}
[ -f "$MEG/pretrain_gpt.py" ] || fail "no $MEG/pretrain_gpt.py (run tools/fetch-peers.sh here and carry .peers)"
MEG=$(cd "$MEG" && pwd)
COMMIT=$(cat "$MEG/COMMIT" 2>/dev/null || echo unknown)

# Megatron compiles its dataset index helpers (megatron/core/datasets/helpers.cpp, pybind11) with
# `make` on its first start, naming the module with `python3-config --extension-suffix`, which a
# virtual environment may lack. Build it here with this interpreter's suffix so the import finds it.
DS="$MEG/megatron/core/datasets"
EXT=$("$PY" -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')
if [ ! -f "$DS/helpers_cpp$EXT" ]; then
  INC=$("$PY" -m pybind11 --includes 2>/dev/null) || fail "pybind11 missing in $PY (needed for Megatron's dataset helpers)"
  # shellcheck disable=SC2086
  g++ -O3 -Wall -shared -std=c++17 -fPIC $INC "$DS/helpers.cpp" -o "$DS/helpers_cpp$EXT" >> "$LOG" 2>&1 \
    || fail "building megatron/core/datasets/helpers_cpp$EXT failed"
fi
# Megatron's own `make` then finds the module up to date (the venv's python3 first on PATH, and a
# python3-config that prints this interpreter's suffix where the system has none).
SHIM=$(mktemp -d)
trap 'rm -rf "$SHIM"' EXIT
[ -x "$(dirname "$PY")/python3-config" ] || command -v python3-config > /dev/null \
  || { printf '#!/bin/sh\necho %s\n' "$EXT" > "$SHIM/python3-config"; chmod +x "$SHIM/python3-config"; }
# and where the machine has no `make`, one that succeeds: the module it would build is there already
command -v make > /dev/null || { printf '#!/bin/sh\nexit 0\n' > "$SHIM/make"; chmod +x "$SHIM/make"; }
PATH="$(dirname "$PY"):$SHIM:$PATH"; export PATH

# One process, one GPU: the rendezvous variables torchrun would set.
PORT=$("$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
export RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$PORT
export CUDA_DEVICE_MAX_CONNECTIONS=1 PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$MEG${PYTHONPATH:+:$PYTHONPATH}"
start=$(date +%s)
(cd "$MEG" && timeout "${MEGATRON_TIMEOUT:-300}" "$PY" pretrain_gpt.py "${ARGS[@]}") >> "$LOG" 2>&1
rc=$?
echo "megatron_peer: pretrain_gpt.py rc=$rc after $(( $(date +%s) - start )) s (log $LOG)" >&2
# The windows it logged count even if it failed afterwards (at shutdown, say): the JSON says exit_code.
"$PY" - "$LOG" "$COMMIT" "$MB" "$SEQ" "$rc" "$SHAPE" <<'PY' > "$OUT_DIR/megatron_peer.json" \
  || fail "pretrain_gpt.py exited with $rc and logged too few iteration windows"
import json, re, statistics, sys
log, commit, mb, seq, rc, shape = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]), sys.argv[6]
text = open(log, errors="replace").read()
windows = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
tflops = [float(m) for m in re.findall(r"throughput per GPU \(TFLOP/s/GPU\): ([0-9.]+)", text)]
if len(windows) < 3:
    print(json.dumps({"peer": "megatron-core", "impl": "local", "commit": commit,
                      "error": f"only {len(windows)} log windows in {log}"}))
    sys.exit(1)
timed = windows[2:]  # the first two windows hold the start-up, the allocator's growth and the jit compiles
ms = statistics.median(timed)
print(json.dumps({
    "peer": "megatron-core", "commit": commit, "impl": "local", "shape": shape, "ms_per_step": ms,
    "tokens_per_s": mb * seq / (ms / 1e3), "tflops_per_gpu": statistics.median(tflops[2:]) if len(tflops) > 2 else None,
    "windows_ms": windows, "timed_windows": f"{len(timed)} windows of 10 iterations after the first two",
    "micro_batch": mb, "seq": seq, "exit_code": rc,
}))
PY
cat "$OUT_DIR/megatron_peer.json"
