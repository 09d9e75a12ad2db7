#!/usr/bin/env bash
# pretrain_gpt_tp_flow.sh KILN WORKDIR SOURCE_DIR MPIRUN: `kiln pretrain-gpt` with tensor parallelism
# on the CPU (a tiny Llama-shaped GPT on tinyshakespeare): --tensor-model-parallel-size 2
# --sequence-parallel under mpirun -np 2, and TP2 x DP2 with the distributed optimizer under -np 4,
# give the single-process losses, gradient norms and evaluation losses (within 1e-5 relative);
# so does TP2 + SP with --tp-comm-overlap (the collectives in chunks under the GEMMs);
# the TP checkpoint is continued by one process on the same curve; a world that the tensor-parallel
# size does not divide (-np 3) is refused naming the flag and the numbers.
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
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --save "$W/tp2" --save-interval 3 > "$W/tp2.txt"
grep -q "x 2 tensor-parallel ranks, sequence parallel" "$W/tp2.txt"
test "$(grep -c '^done: ' "$W/tp2.txt")" -eq 1  # rank 0 alone speaks
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --use-distributed-optimizer --save "$W/tp2dp2" > "$W/tp2dp2.txt"
grep -q "x 2 tensor-parallel ranks, sequence parallel x 2 data-parallel ranks, distributed optimizer" "$W/tp2dp2.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --tp-comm-overlap --save "$W/tp2overlap" > "$W/tp2overlap.txt"
grep -q "x 2 tensor-parallel ranks, sequence parallel, all-gathers / reduce-scatters under the GEMMs" "$W/tp2overlap.txt"

# One process continues the TP checkpoint of iteration 3.
rm -rf "$W/tp2/iter_0000006"
echo 3 > "$W/tp2/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" --load "$W/tp2" --save "$W/alone" > "$W/alone.txt"
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
for run, first in [("tp2dp2", 1), ("tp2overlap", 1), ("alone", 4)]:
    c = curve(run, first)
    want = {k: v for k, v in single.items() if (k if isinstance(k, int) else k[1]) >= first}
    assert set(c) == set(want), (run, sorted(map(str, c)), sorted(map(str, want)))
    for k, (loss, norm) in c.items():
        for a, b in ((loss, want[k][0]), (norm, want[k][1])):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {a} vs one process {b} (relative {rel:.2e})"
c = curve("tp2")
for k in [k for k in single if isinstance(k, int)]:
    for a, b in zip(c[k], single[k]):
        rel = abs(a - b) / abs(b)
        worst = max(worst, rel)
        assert rel < 1e-5, f"tp2 at {k}: {a} vs one process {b} (relative {rel:.2e})"
print(f"tensor-parallel runs match one process: worst relative difference {worst:.2e}")
PY

# --tensor-model-parallel-size 2 does not divide a world of 3.
if "$MPIRUN" --oversubscribe -np 3 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 > "$W/bad.txt" 2>&1; then
  echo "a tensor-parallel size of 2 in a world of 3 was accepted"; exit 1
fi
grep -q "tensor-model-parallel-size: 2 does not divide the world of 3 ranks (mpirun -np 3)" "$W/bad.txt"
echo "pretrain-gpt tensor-parallel flow: OK"
