#!/usr/bin/env bash
# pretrain_gpt_ep_flow.sh KILN WORKDIR SOURCE_DIR MPIRUN: `kiln pretrain-gpt` with a MoE GPT (4 experts,
# top-2, aux loss and expert bias, capacity dropping) on the CPU: data parallelism under mpirun -np 2,
# --expert-model-parallel-size 2 with the alltoall dispatcher (and the distributed optimizer) and with
# the allgather one under -np 2, EP2 x DP2 under -np 4, and with --tensor-model-parallel-size 2 TP2 x EP2
# under -np 2 and TP2 x EP2 x DP2 under -np 4, give the one-process log.jsonl (losses,
# gradient norms, evaluation losses, per-expert loads and drops, aux losses; losses within 1e-5
# relative); with --sequence-parallel too (each tensor-parallel rank routes its own slice of the
# sequence; the capacity is then each rank's, as in Megatron, so these runs and their one-process
# references drop nothing): TP2 x EP2 + SP under -np 2 (expert bias) and TP2 x EP2 x DP2 + SP under
# -np 4 (aux and z losses, allgather, distributed optimizer); the EP, TP2 x EP2 and TP2 x EP2 + SP
# checkpoints are continued by one process on the same curve and a one-process checkpoint under EP2;
# TP2 + SP with expert tensor parallelism 2 under -np 2 matches too; experts that EP does not divide,
# a world EP does not divide, EP or ETP in one process and an expert width ETP does not divide are
# refused naming the flags and the numbers.
set -euo pipefail
K=$1
W=$2
SRC=$3
MPIRUN=$4
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA

RUN=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --position-embedding-type rope --normalization RMSNorm
     --swiglu --ffn-hidden-size 64 --disable-bias-linear --seq-length 32
     --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3
     --moe-expert-capacity-factor 1.0 --moe-grouped-gemm --moe-permute-fusion
     "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7
     --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --train-iters 6
     --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 2 --clip-grad 0.5 --log-interval 1 --eval-interval 3
     --eval-iters 1)
BIAS=(--moe-router-score-function sigmoid --moe-router-enable-expert-bias --moe-router-bias-update-rate 1e-2)
NOCAP=()  # RUN without --moe-expert-capacity-factor (the sequence-parallel runs)
skip=0
for a in "${RUN[@]}"; do
  if [ "$skip" = 1 ]; then skip=0; continue; fi
  if [ "$a" = "--moe-expert-capacity-factor" ]; then skip=1; continue; fi
  NOCAP+=("$a")
done

"$K" pretrain-gpt "${RUN[@]}" --save "$W/single" --save-interval 3 > "$W/single.txt"
"$K" pretrain-gpt "${RUN[@]}" "${BIAS[@]}" --save "$W/single_bias" > "$W/single_bias.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --save "$W/dp2" > "$W/dp2.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --expert-model-parallel-size 2 \
  --save "$W/ep2" --save-interval 3 > "$W/ep2.txt"
test "$(grep -c '^done: ' "$W/ep2.txt")" -eq 1  # rank 0 alone speaks
grep -q "x 2 data-parallel ranks, experts over 2 expert-parallel ranks:" "$W/ep2.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" "${BIAS[@]}" --expert-model-parallel-size 2 \
  --moe-token-dispatcher-type allgather --use-distributed-optimizer --save "$W/ep2_allgather_bias" \
  > "$W/ep2_allgather_bias.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" "${BIAS[@]}" --expert-model-parallel-size 2 \
  --use-distributed-optimizer --overlap-grad-reduce --ddp-bucket-size 2000 --save "$W/ep2dp2_bias" \
  > "$W/ep2dp2_bias.txt"
# Tensor parallelism beside the experts (whole experts, --expert-tensor-parallel-size 1): TP2 x EP2 on
# 2 ranks (the expert-parallel group is the tensor-parallel pair) and TP2 x EP2 x DP2 on 4.
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" "${BIAS[@]}" --tensor-model-parallel-size 2 \
  --expert-model-parallel-size 2 --save "$W/tp2ep2_bias" --save-interval 3 > "$W/tp2ep2_bias.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 \
  --expert-model-parallel-size 2 --use-distributed-optimizer --save "$W/tp2ep2dp2" > "$W/tp2ep2dp2.txt"
grep -q "x 2 tensor-parallel ranks, experts over 2 expert-parallel ranks:" "$W/tp2ep2_bias.txt"
grep -q "x 2 tensor-parallel ranks x 2 data-parallel ranks, experts over 2 expert-parallel ranks" "$W/tp2ep2dp2.txt"
# Sequence parallelism: TP2 x EP2 + SP on 2 ranks (expert bias), TP2 x EP2 x DP2 + SP on 4 (aux and z
# losses, allgather, distributed optimizer), against one process without capacity dropping.
"$K" pretrain-gpt "${NOCAP[@]}" --save "$W/single_nocap" > "$W/single_nocap.txt"
"$K" pretrain-gpt "${NOCAP[@]}" "${BIAS[@]}" --save "$W/single_nocap_bias" > "$W/single_nocap_bias.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${NOCAP[@]}" "${BIAS[@]}" --tensor-model-parallel-size 2 \
  --sequence-parallel --expert-model-parallel-size 2 --save "$W/tp2ep2sp_bias" --save-interval 3 \
  > "$W/tp2ep2sp_bias.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${NOCAP[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --expert-model-parallel-size 2 --moe-token-dispatcher-type allgather --use-distributed-optimizer \
  --save "$W/tp2ep2dp2sp" > "$W/tp2ep2dp2sp.txt"
grep -q "x 2 tensor-parallel ranks, sequence parallel, experts over 2 expert-parallel ranks:" "$W/tp2ep2sp_bias.txt"
# Expert tensor parallelism: TP2 + SP with each expert split over the pair (ETP2).
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${NOCAP[@]}" "${BIAS[@]}" --tensor-model-parallel-size 2 \
  --sequence-parallel --expert-tensor-parallel-size 2 --save "$W/tp2etp2sp_bias" > "$W/tp2etp2sp_bias.txt"
grep -q "experts over 1 expert-parallel x 2 expert-tensor-parallel ranks:" "$W/tp2etp2sp_bias.txt"
rm -rf "$W/tp2ep2sp_bias/iter_0000006"
echo 3 > "$W/tp2ep2sp_bias/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${NOCAP[@]}" "${BIAS[@]}" --load "$W/tp2ep2sp_bias" --save "$W/sp_alone" > "$W/sp_alone.txt"
grep -q "^loaded checkpoint .*iter_0000003 (iteration 3, 24 samples consumed)$" "$W/sp_alone.txt"
rm -rf "$W/tp2ep2_bias/iter_0000006"
echo 3 > "$W/tp2ep2_bias/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" "${BIAS[@]}" --load "$W/tp2ep2_bias" --save "$W/tp_alone" > "$W/tp_alone.txt"
grep -q "^loaded checkpoint .*iter_0000003 (iteration 3, 24 samples consumed)$" "$W/tp_alone.txt"

# One process continues the EP checkpoint of iteration 3; EP2 continues the one-process one.
rm -rf "$W/ep2/iter_0000006"
echo 3 > "$W/ep2/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" --load "$W/ep2" --save "$W/alone" > "$W/alone.txt"
grep -q "^loaded checkpoint .*iter_0000003 (iteration 3, 24 samples consumed)$" "$W/alone.txt"
cp -r "$W/single" "$W/single3"
rm -rf "$W/single3/iter_0000006" "$W/single3/log.jsonl"
echo 3 > "$W/single3/latest_checkpointed_iteration.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --expert-model-parallel-size 2 --load "$W/single3" \
  --save "$W/ep2_from_single" > "$W/ep2_from_single.txt"

python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def curve(run, first=1):
    out = {}
    for line in open(f"{w}/{run}/log.jsonl"):
        j = json.loads(line)
        if "lm_loss" in j and j["iteration"] >= first:
            out[j["iteration"]] = dict(loss=j["lm_loss"], norm=j["grad_norm"], aux=j["load_balancing_loss"],
                                       z=j["z_loss"], layers=j["moe_layers"])
        if "validation_loss" in j and j["iteration"] >= first:
            out[("val", j["iteration"])] = dict(loss=j["validation_loss"])
    return out
worst = 0.0
def compare(run, reference, first=1):
    global worst
    c, want = curve(run, first), curve(reference, first)
    assert set(c) == set(want) and len(c) > 0, (run, sorted(map(str, c)), sorted(map(str, want)))
    for k, v in c.items():
        for name in ("loss", "norm", "aux", "z"):
            if name not in v: continue
            a, b = v[name], want[k][name]
            rel = abs(a - b) / max(abs(b), 1e-12)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {name} {a} vs one process {b} (relative {rel:.2e})"
        if "layers" in v:  # the loads and drops of the whole global batch, as one process counts them
            assert v["layers"] == want[k]["layers"], (run, k, v["layers"], want[k]["layers"])
dropped = sum(sum(l["dropped_per_expert"]) for v in curve("single").values() if "layers" in v for l in v["layers"])
assert dropped > 0, "the capacity factor dropped nothing: the test would not see dropping"
for run in ("dp2", "ep2"): compare(run, "single")
for run in ("ep2_allgather_bias", "ep2dp2_bias", "tp2ep2_bias"): compare(run, "single_bias")
compare("tp2ep2dp2", "single")
compare("tp_alone", "single_bias", 4)
compare("tp2ep2sp_bias", "single_nocap_bias")
compare("tp2etp2sp_bias", "single_nocap_bias")
compare("tp2ep2dp2sp", "single_nocap")
compare("sp_alone", "single_nocap_bias", 4)
compare("alone", "single", 4)
compare("ep2_from_single", "single", 4)
print(f"expert- and data-parallel MoE runs match one process: worst relative difference {worst:.2e}")
PY

# Refusals: experts EP does not divide; a world EP does not divide; EP in one process.
if "$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --num-experts 6 --expert-model-parallel-size 4 \
  > "$W/bad1.txt" 2>&1; then
  echo "6 experts over 4 expert-parallel ranks were accepted"; exit 1
fi
grep -q -- "--num-experts (6) must be divisible by --expert-model-parallel-size (4)" "$W/bad1.txt"
if "$MPIRUN" --oversubscribe -np 3 "$K" pretrain-gpt "${RUN[@]}" --expert-model-parallel-size 2 > "$W/bad2.txt" 2>&1; then
  echo "an expert-parallel size of 2 in a world of 3 was accepted"; exit 1
fi
grep -q "expert-model-parallel-size: 2 does not divide the world of 3 ranks (mpirun -np 3)" "$W/bad2.txt"
if "$K" pretrain-gpt "${RUN[@]}" --expert-model-parallel-size 2 > "$W/bad3.txt" 2>&1; then
  echo "--expert-model-parallel-size 2 in one process was accepted"; exit 1
fi
grep -q "expert-model-parallel-size: 2 needs 2 or a multiple of 2 ranks" "$W/bad3.txt"
if "$K" pretrain-gpt "${RUN[@]}" --expert-tensor-parallel-size 2 > "$W/bad4.txt" 2>&1; then
  echo "--expert-tensor-parallel-size 2 in one process was accepted"; exit 1
fi
grep -q "expert-tensor-parallel-size: 2 needs 2 or a multiple of 2 ranks" "$W/bad4.txt"
# An expert width (--moe-ffn-hidden-size 32) that expert tensor parallelism does not divide.
if "$MPIRUN" --oversubscribe -np 3 "$K" pretrain-gpt "${RUN[@]}" --expert-tensor-parallel-size 3 > "$W/bad5.txt" 2>&1; then
  echo "experts of width 32 split over 3 ranks were accepted"; exit 1
fi
grep -q "experts' hidden size (32, --moe-ffn-hidden-size or --ffn-hidden-size) must be divisible by --expert-tensor-parallel-size (3)" "$W/bad5.txt"
echo "pretrain-gpt expert-parallel flow: OK"
