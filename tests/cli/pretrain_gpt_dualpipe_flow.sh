#!/usr/bin/env bash
# pretrain_gpt_dualpipe_flow.sh KILN WORKDIR SOURCE_DIR MPIRUN: `kiln pretrain-gpt --pipeline-schedule
# dualpipe` on the CPU (a tiny 4-layer GPT-2-shaped model, tied embeddings, on tinyshakespeare):
# PP2 under mpirun -np 2 gives the single-process losses, gradient norms and evaluation losses (within
# 1e-5 relative), says so in its banner, draws its measured timeline (--profile-schedule); its
# checkpoint (one copy of each stage, 1F1B's layout) is continued by one process on the same curve;
# an odd number of micro-batches per step is refused naming the flags and the number.
set -euo pipefail
K=$1
W=$2
SRC=$3
MPIRUN=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA

RUN=(--num-layers 4 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --make-vocab-size-divisible-by 4
     "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7
     --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
     --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 0.5 --log-interval 1 --eval-interval 3
     --eval-iters 1)

"$K" pretrain-gpt "${RUN[@]}" --save "$W/single" > "$W/single.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
  --pipeline-schedule dualpipe --save "$W/dual" --save-interval 3 --profile-schedule "$W/dual.png" \
  --profile-schedule-step 2 > "$W/dual.txt"
grep -q "x 2 pipeline stages (DualPipe, both directions, two copies of each stage, weight gradients deferred)" \
  "$W/dual.txt"
test "$(grep -c '^done: ' "$W/dual.txt")" -eq 1  # rank 0 alone speaks
if grep -q "the two copies of a stage differ" "$W/dual.txt"; then echo "the copies drifted apart"; exit 1; fi
grep -q "^--profile-schedule: wrote $W/dual.png (iteration 2: " "$W/dual.txt"
python3 -c "import sys; d=open(sys.argv[1],'rb').read(8); sys.exit(0 if d==b'\x89PNG\r\n\x1a\n' else 1)" "$W/dual.png"

# One process continues the DualPipe checkpoint of iteration 3.
rm -rf "$W/dual/iter_0000006"
echo 3 > "$W/dual/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" --load "$W/dual" --save "$W/alone" > "$W/alone.txt"
grep -q "^loaded checkpoint .*iter_0000003 (iteration 3, 24 samples consumed)$" "$W/alone.txt"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def curve(run, first=1):
    out = {}
    for line in open(f"{w}/{run}/log.jsonl"):
        j = json.loads(line)
        if "lm_loss" in j and j["iteration"] >= first:
            out[j["iteration"]] = (j["lm_loss"], j["grad_norm"])
        if "validation_loss" in j and j["iteration"] >= first:
            out[("val", j["iteration"])] = (j["validation_loss"], j["validation_loss"])
    return out
single = curve("single")
assert len([k for k in single if isinstance(k, int)]) == 6, single
worst = 0.0
for run, first in [("dual", 1), ("alone", 4)]:
    c = curve(run, first)
    want = {k: v for k, v in single.items() if (k if isinstance(k, int) else k[1]) >= first}
    assert set(c) == set(want), (run, sorted(map(str, c)), sorted(map(str, want)))
    for k, (loss, norm) in c.items():
        for a, b in ((loss, want[k][0]), (norm, want[k][1])):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {a} vs one process {b} (relative {rel:.2e})"
print(f"DualPipe runs match one process: worst relative difference {worst:.2e}")
PY

# 3 micro-batches per step (global batch 6 of micro-batches of 2): half cannot enter at each end.
if "$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
    --pipeline-schedule dualpipe --global-batch-size 6 > "$W/bad.txt" 2>&1; then
  echo "DualPipe with 3 micro-batches per step was accepted"; exit 1
fi
grep -q "pipeline-schedule dualpipe needs an even number of micro-batches per step (half enter at each end of the pipeline): --global-batch-size / (--micro-batch-size x data-parallel size) is 3" "$W/bad.txt"
echo "pretrain-gpt DualPipe flow: OK"
