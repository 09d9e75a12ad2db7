#!/usr/bin/env bash
# mla_mtp_flow.sh KILN WORKDIR SOURCE_DIR: a tiny model with multi-head latent attention and one
# multi-token prediction depth trains on tinyshakespeare on the CPU (the byte-level GPT-2 tokenizer
# of write_byte_tokenizer.py, as pretrain_gpt_flow.sh): the validation loss falls to a stated bound, the MTP
# depth's loss is logged on stdout and in log.jsonl, generation from the checkpoint runs through
# MLA's compressed KV cache, resuming with another --mtp-num-layers is refused naming the flag, and a
# run stopped and resumed prints the same loss lines (lm and mtp_1) as a straight one.
set -euo pipefail
K=$1
W=$2
SRC=$3
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA

MODEL=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --make-vocab-size-divisible-by 1
       --position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
       --multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16 --qk-head-dim 12 --qk-pos-emb-head-dim 4
       --v-head-dim 8 --mtp-num-layers 1 --mtp-loss-scaling-factor 0.3
       "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7)
"$K" pretrain-gpt "${MODEL[@]}" --micro-batch-size 16 --global-batch-size 16 --train-iters 80 \
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 5 --weight-decay 0.1 --adam-beta2 0.95 \
  --attention-dropout 0 --hidden-dropout 0 --eval-interval 80 --eval-iters 2 --log-interval 20 \
  --save "$W/run" | tee "$W/run.txt"
# Bytes of English start at ln 257 = 5.55 nats; measured with these flags and seed: validation 2.99, mtp_1 3.03.
grep -q "^ iteration       80/      80 | .* | lm loss: [^ ]* | mtp_1 loss: [^ ]* | grad norm: .*" "$W/run.txt"
final=$(grep "validation loss at iteration 80" "$W/run.txt" | sed 's/.*lm loss value: \([^ ]*\) .*/\1/')
mtp=$(grep "^ iteration       80/" "$W/run.txt" | sed 's/.*mtp_1 loss: \([^ ]*\) .*/\1/')
python3 -c "import sys; l, m = float('$final'), float('$mtp'); print('validation loss', l, 'mtp_1 loss', m); \
sys.exit(0 if l < 3.1 and m < 3.6 else 1)"
python3 - "$W/run/log.jsonl" <<'PY'
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if '"lm_loss"' in l]
assert lines and all("mtp_1_loss" in l for l in lines), "log.jsonl lacks mtp_1_loss"
assert lines[-1]["mtp_1_loss"] < lines[0]["mtp_1_loss"], "the MTP loss did not fall"
PY
"$K" generate --load "$W/run" --prompt "ROMEO:" --max-new-tokens 8 --greedy --device cpu > "$W/generate.txt"
grep -q "(cpu, iteration 80)$" "$W/generate.txt"
# A checkpoint with one MTP depth is not one with two.
if "$K" pretrain-gpt "${MODEL[@]}" --mtp-num-layers 2 --micro-batch-size 16 --train-iters 81 --lr 3e-3 \
     --load "$W/run" > "$W/mismatch.txt" 2>&1; then
  echo "a checkpoint of another --mtp-num-layers was accepted"; exit 1
fi
grep -q -- "--mtp-num-layers: 1 in the checkpoint, 2 in this run" "$W/mismatch.txt"
# Resume: 12 iterations straight vs stopped at 6 and resumed, with dropout on, print the same lm
# loss lines (the MTP modules' weights, optimizer state and dropout streams are in the checkpoint).
RUN=("${MODEL[@]}" --micro-batch-size 4 --global-batch-size 8 --train-iters 12 --lr 1e-3 --eval-interval 100
     --eval-iters 0 --log-interval 3)
"$K" pretrain-gpt "${RUN[@]}" --save "$W/straight" > "$W/straight.txt"
"$K" pretrain-gpt "${RUN[@]}" --save "$W/resumed" --load "$W/resumed" --exit-interval 6 > "$W/first.txt"
"$K" pretrain-gpt "${RUN[@]}" --save "$W/resumed" --load "$W/resumed" > "$W/second.txt"
losses() { sed -n 's/^ iteration *\([0-9]*\)\/.*| lm loss: \([^ ]*\) | mtp_1 loss: \([^ ]*\) | grad norm: \([^ ]*\) .*/\1 \2 \3 \4/p' "$@"; }
losses "$W/straight.txt" > "$W/straight.losses"
losses "$W/first.txt" "$W/second.txt" > "$W/resumed.losses"
test "$(wc -l < "$W/straight.losses")" -eq 4
diff "$W/straight.losses" "$W/resumed.losses"
echo "mla_mtp_flow: ok"
