#!/usr/bin/env bash
# pretrain_gpt_pp_flow.sh KILN WORKDIR SOURCE_DIR MPIRUN: `kiln pretrain-gpt` with pipeline parallelism
# on the CPU (a tiny 4-layer GPT-2-shaped model, tied embeddings, on tinyshakespeare):
# --pipeline-model-parallel-size 2 under mpirun -np 2 (1F1B, interleaved with one layer per model
# chunk, zero-bubble ZB-H1, and zero-bubble with --transformer-impl transformer_engine against its
# own one-process run), PP2 x DP2 with the distributed optimizer, TP2 x PP2 with sequence parallelism and
# CP2 x PP2 under -np 4,
# give the single-process losses,
# gradient norms and evaluation losses (within 1e-5 relative); so do PP2 x DP2 with
# --overlap-grad-reduce and --recompute-granularity full, and a MoE model (--num-experts, aux and z
# losses, layer 0 dense) under PP2 with --rewind and an injected NaN (KILN_FAULT) against the same
# one-process run (the same rewind, the same MoE statistics logged); the PP checkpoint is continued by one
# process on the same curve; MTP (two depths) under PP2 gives the one-process losses and depth losses,
# and is refused under DualPipe; --profile-schedule writes the measured timeline's PNG; a world that the
# stages do not divide (-np 3) and an interleaved schedule with fewer micro-batches than a multiple of
# the stages are refused naming the flags and the numbers.
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
  --save "$W/pp2" --save-interval 3 --profile-schedule "$W/schedule.png" --profile-schedule-step 2 > "$W/pp2.txt"
grep -q "x 2 pipeline stages (1F1B)" "$W/pp2.txt"
test "$(grep -c '^done: ' "$W/pp2.txt")" -eq 1  # rank 0 alone speaks
grep -q "^--profile-schedule: wrote $W/schedule.png (iteration 2: " "$W/pp2.txt"
python3 -c "import sys; d=open(sys.argv[1],'rb').read(8); sys.exit(0 if d==b'\x89PNG\r\n\x1a\n' else 1)" "$W/schedule.png"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
  --num-layers-per-virtual-pipeline-stage 1 --save "$W/pp2v2" > "$W/pp2v2.txt"
grep -q "x 2 pipeline stages (interleaved 1F1B, 2 model chunks per rank)" "$W/pp2v2.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
  --pipeline-schedule zero-bubble --save "$W/pp2zb" > "$W/pp2zb.txt"
grep -q "x 2 pipeline stages (zero-bubble ZB-H1, weight gradients deferred)" "$W/pp2zb.txt"
# Zero bubble with the fused TransformerEngine MLP (te::linear_gelu_linear defers its weight gradients
# too) against one process on the same implementation.
"$K" pretrain-gpt "${RUN[@]}" --transformer-impl transformer_engine --save "$W/single_te" > "$W/single_te.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --transformer-impl transformer_engine \
  --pipeline-model-parallel-size 2 --pipeline-schedule zero-bubble --save "$W/pp2zb_te" > "$W/pp2zb_te.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
  --use-distributed-optimizer --save "$W/pp2dp2" > "$W/pp2dp2.txt"
grep -q "x 2 pipeline stages (1F1B) x 2 data-parallel ranks, distributed optimizer" "$W/pp2dp2.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --tensor-model-parallel-size 2 --sequence-parallel \
  --pipeline-model-parallel-size 2 --save "$W/tp2pp2" > "$W/tp2pp2.txt"
grep -q "x 2 tensor-parallel ranks, sequence parallel x 2 pipeline stages (1F1B):" "$W/tp2pp2.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --context-parallel-size 2 \
  --pipeline-model-parallel-size 2 --save "$W/cp2pp2" > "$W/cp2pp2.txt"
grep -q "x 2 context-parallel ranks x 2 pipeline stages (1F1B):" "$W/cp2pp2.txt"
"$MPIRUN" --oversubscribe -np 4 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
  --overlap-grad-reduce --ddp-bucket-size 4000 --recompute-granularity full --save "$W/pp2dp2_overlap" \
  > "$W/pp2dp2_overlap.txt"
grep -q "x 2 pipeline stages (1F1B) x 2 data-parallel ranks, gradient reduction overlapped with backward" \
  "$W/pp2dp2_overlap.txt"
# MoE under PP2, with --rewind rolling an injected NaN back, against the same one-process run.
MOE=(--disable-bias-linear --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 16 --moe-layer-freq "[0,1,1,1]"
     --moe-aux-loss-coeff 1e-2 --moe-z-loss-coeff 1e-3 --rewind --rewind-snapshot-interval 2)
KILN_FAULT=nan_loss@4 "$K" pretrain-gpt "${RUN[@]}" "${MOE[@]}" --save "$W/single_moe" > "$W/single_moe.txt"
KILN_FAULT=nan_loss@4 "$MPIRUN" --oversubscribe -np 2 -x KILN_FAULT "$K" pretrain-gpt "${RUN[@]}" "${MOE[@]}" \
  --pipeline-model-parallel-size 2 --save "$W/pp2_moe" > "$W/pp2_moe.txt"
for run in single_moe pp2_moe; do
  grep -q "rewind at iteration 4: nonfinite_loss" "$W/$run.txt"
  grep -q "moe layer 3: tokens per expert" "$W/$run.txt"
done

# MTP (two depths, RoPE) under PP2: the depths and a copy of the embedding on the last stage give the
# one-process losses, norms and each depth's logged loss (checked below); DualPipe with MTP is refused
# naming the flag.
MTP=(--position-embedding-type rope --mtp-num-layers 2 --mtp-loss-scaling-factor 0.3)
"$K" pretrain-gpt "${RUN[@]}" "${MTP[@]}" --save "$W/single_mtp" > "$W/single_mtp.txt"
"$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 \
  --save "$W/pp2_mtp" > "$W/pp2_mtp.txt"
grep -q "mtp_2 loss" "$W/pp2_mtp.txt"
if "$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" "${MTP[@]}" --pipeline-model-parallel-size 2 \
    --pipeline-schedule dualpipe > "$W/bad_mtp.txt" 2>&1; then
  echo "MTP under DualPipe was accepted"; exit 1
fi
grep -q -- "--mtp-num-layers does not combine with --pipeline-schedule dualpipe" "$W/bad_mtp.txt"

# One process continues the PP checkpoint of iteration 3.
rm -rf "$W/pp2/iter_0000006"
echo 3 > "$W/pp2/latest_checkpointed_iteration.txt"
"$K" pretrain-gpt "${RUN[@]}" --load "$W/pp2" --save "$W/alone" > "$W/alone.txt"
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
for run, first in [("pp2v2", 1), ("pp2zb", 1), ("pp2dp2", 1), ("tp2pp2", 1), ("cp2pp2", 1), ("pp2dp2_overlap", 1), ("alone", 4)]:
    c = curve(run, first)
    want = {k: v for k, v in single.items() if (k if isinstance(k, int) else k[1]) >= first}
    assert set(c) == set(want), (run, sorted(map(str, c)), sorted(map(str, want)))
    for k, (loss, norm) in c.items():
        for a, b in ((loss, want[k][0]), (norm, want[k][1])):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {a} vs one process {b} (relative {rel:.2e})"
for run, ref in [("pp2", single), ("pp2zb_te", curve("single_te"))]:
    c = curve(run)
    assert set(c) == set(ref), (run, sorted(map(str, c)), sorted(map(str, ref)))
    for k in [k for k in ref if isinstance(k, int)]:
        for a, b in zip(c[k], ref[k]):
            rel = abs(a - b) / abs(b)
            worst = max(worst, rel)
            assert rel < 1e-5, f"{run} at {k}: {a} vs one process {b} (relative {rel:.2e})"
# MoE: the losses, norms and the logged MoE statistics (gathered over the stages) of one process;
# MTP: the losses, norms and each depth's logged loss.
def lines(run):
    return [json.loads(l) for l in open(f"{w}/{run}/log.jsonl") if "lm_loss" in l]
for run, ref, keys in [("pp2_moe", "single_moe", ("lm_loss", "grad_norm", "load_balancing_loss", "z_loss")),
                       ("pp2_mtp", "single_mtp", ("lm_loss", "grad_norm", "mtp_1_loss", "mtp_2_loss"))]:
  want, got = lines(ref), lines(run)
  assert [j["iteration"] for j in got] == [j["iteration"] for j in want] == [1, 2, 3, 4, 5, 6], want
  for a, b in zip(got, want):
    for key in keys:
      # MoE: iteration 4's batch is skipped: nothing trained; both log loss 0 and the rolled-back
      # step's norm (NaN: null).
      if b[key] is None:
        assert a[key] is None, (run, key, b["iteration"], a[key])
        continue
      rel = abs(a[key] - b[key]) / abs(b[key]) if b[key] != 0 else abs(a[key])
      worst = max(worst, rel)
      assert rel < 1e-5, f"{run} {key} at {b['iteration']}: {a[key]} vs one process {b[key]} (relative {rel:.2e})"
    if run == "pp2_moe":
      assert a["moe_layers"] == b["moe_layers"], (a["iteration"], a["moe_layers"], b["moe_layers"])
print(f"pipeline-parallel runs match one process: worst relative difference {worst:.2e}")
PY

# --pipeline-model-parallel-size 2 does not divide a world of 3.
if "$MPIRUN" --oversubscribe -np 3 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 > "$W/bad.txt" 2>&1; then
  echo "a pipeline size of 2 in a world of 3 was accepted"; exit 1
fi
grep -q "pipeline-model-parallel-size: 2 (x --tensor-model-parallel-size 1 x --context-parallel-size 1) does not divide the world of 3 ranks (mpirun -np 3)" "$W/bad.txt"
# Interleaving with 1 micro-batch per step on 2 stages (global batch 2 of micro-batches of 2).
if "$MPIRUN" --oversubscribe -np 2 "$K" pretrain-gpt "${RUN[@]}" --pipeline-model-parallel-size 2 \
    --num-layers-per-virtual-pipeline-stage 1 --global-batch-size 2 > "$W/bad2.txt" 2>&1; then
  echo "an interleaved schedule of 1 micro-batch on 2 stages was accepted"; exit 1
fi
grep -q "the interleaved pipeline schedule needs the micro-batches per step (1: --global-batch-size / (--micro-batch-size x data-parallel size)) to be a multiple of --pipeline-model-parallel-size (2)" "$W/bad2.txt"
echo "pretrain-gpt pipeline-parallel flow: OK"
