#!/usr/bin/env bash
# pretrain_gpt_cp_flow.sh KILN WORKDIR SOURCE_DIR MPIRUN: `kiln pretrain-gpt` with context parallelism
# on the CPU (a tiny Llama-shaped GPT on tinyshakespeare): --context-parallel-size 2 under mpirun -np 2
# with ring attention (p2p, the default) and with --cp-comm-type a2a gives the single-process
# log.jsonl (losses, gradient norms, evaluation losses within 1e-5 relative); one process continues
# the CP checkpoint on the same curve; refused before start: a world CP does not divide (-np 3), a
# --seq-length not divisible by 2 x CP, a2a with query groups CP does not divide, attention dropout
# with CP, CP in one process.
set -euo pipefail
K=$1
W=$2
SRC=$3
MPIRUN=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA

RUN=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --group-query-attention --num-query-groups 2
     --position-embedding-type rope --normalization RMSNorm --swiglu --ffn-hidden-size 64 --disable-bias-linear
     --untie-embeddings-and-output-weights --seq-length 32 --make-vocab-size-divisible-by 4
     "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7
     --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
     --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 0.5 --log-interval 1 --eval-interval 3
     --eval-iters 1)

"$K" pretrain-gpt "${RUN[@]}" --save "$W/single" > "$W/single.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 2 \
  --save "$W/cp2" --save-interval 3 > "$W/cp2.txt"
grep -q "x 2 context-parallel ranks" "$W/cp2.txt"
test "$(grep -c '^done: ' "$W/cp2.txt")" -eq 1  # rank 0 alone speaks
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 2 --cp-comm-type a2a \
  --save "$W/cp2a2a" > "$W/cp2a2a.txt"

# One process continues the CP checkpoint of iteration 3.
rm -rf "$W/cp2/iter_0000006"
echo 3 > "$W/cp2/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" --load "$W/cp2" --save "$W/alone" > "$W/alone.txt"
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
for run, first in [("cp2a2a", 1), ("alone", 4)]:
    c = curve(run, first)
    want = {k: v for k, v in single.items() if (k if isinstance(k, int) else k[1]) >= first}
    assert set(c) == set(want), (run, sorted(map(str, c)), sorted(map(str, want)))
    for k, (loss, norm) in c.items():
        for a, b in ((loss, want[k][0]), (norm, want[k][1])):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {a} vs one process {b} (relative {rel:.2e})"
c = curve("cp2")
for k in [k for k in single if isinstance(k, int)]:
    for a, b in zip(c[k], single[k]):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        assert rel < 1e-5, f"cp2 at {k}: {a} vs one process {b} (relative {rel:.2e})"
print(f"context-parallel runs match one process: worst relative difference {worst:.2e}")
PY

refused() {  # refused WHAT PATTERN COMMAND...: the command fails and its output names the problem
  local what=$1 pattern=$2
  shift 2
  if "$@" > "$W/bad.txt" 2>&1; then
    echo "$what was accepted"; exit 1
  fi
  grep -q -- "$pattern" "$W/bad.txt" || { echo "$what: unexpected message:"; cat "$W/bad.txt"; exit 1; }
}
refused "a context-parallel size of 2 in a world of 3" \
  "context-parallel-size: 2 x --tensor-model-parallel-size 1 does not divide the world of 3 ranks (mpirun -np 3)" \
  "$MPIRUN" --oversubscribe -np 3 "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 2
refused "a sequence of 36 over 2 x 4 chunks" \
  "--seq-length (36) must be divisible by 2 x --context-parallel-size (2 x 4 = 8)" \
  "$K" pretrain-gpt "${RUN[@]}" --seq-length 36 --context-parallel-size 4
refused "a2a with 2 query groups over 4 ranks" "2 query groups" \
  "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 4 --cp-comm-type a2a
refused "attention dropout with CP" "--attention-dropout (0.1) with --context-parallel-size 2" \
  "$K" pretrain-gpt "${RUN[@]}" --attention-dropout 0.1 --context-parallel-size 2
refused "CP in one process" "context-parallel-size: 2 needs a multiple of 2 ranks" \
  "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 2
echo "pretrain-gpt context-parallel flow: OK"
