#!/usr/bin/env bash
# pretrain_fp8_moe_flow.sh KILN WORKDIR SOURCE_DIR: FP8 MoE training through `kiln pretrain-gpt` on the
# CPU (the emulated-FP8 reference kernels), on tinyshakespeare with the byte-level tokenizer: a model
# with 4 experts, top-2 routing (token counts per expert that are not multiples of 16: the expert rows
# are padded inside te::fp8_grouped_linear) and --fp8-format hybrid (delayed scaling; blockwise too)
# learns and ends within 3% of the same run without FP8; plain and FP8 MoE checkpoints load into each
# other; an MLA + MTP model trains with FP8 as well;
# the refusals that remain name their flag (tensor parallelism; an expert FFN size that is not a
# multiple of 16).
set -euo pipefail
K=$1
W=$2
SRC=$3
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA

MODEL=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --make-vocab-size-divisible-by 16
       "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7
       --attention-dropout 0 --hidden-dropout 0 --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine
       --weight-decay 0.1 --adam-beta2 0.95 --disable-bias-linear --num-experts 4 --moe-router-topk 2)
TRAIN=(--lr-warmup-iters 5 --micro-batch-size 8 --global-batch-size 8 --train-iters 40 --eval-interval 100 --eval-iters 0
       --log-interval 10)
final_loss() { sed -n 's/^ iteration *40\/.*| lm loss: \([^ ]*\) .*/\1/p' "$1"; }
"$K" pretrain-gpt "${MODEL[@]}" "${TRAIN[@]}" > "$W/plain.txt"
plain=$(final_loss "$W/plain.txt")
for recipe in delayed blockwise; do
  "$K" pretrain-gpt "${MODEL[@]}" "${TRAIN[@]}" --fp8-format hybrid --fp8-recipe "$recipe" > "$W/$recipe.txt"
  got=$(final_loss "$W/$recipe.txt")
  python3 -c "import sys; p, g = float('$plain'), float('$got'); print('moe $recipe: fp8', g, 'plain', p); \
sys.exit(0 if g < 4.5 and abs(g - p) <= 0.03 * p else 1)"
done

# A plain MoE checkpoint into an FP8 delayed run (fresh per-expert scaling state), and back.
SHORT=(--lr-warmup-iters 1 --lr-decay-iters 10 --micro-batch-size 4 --global-batch-size 4 --eval-interval 100 --eval-iters 0 --log-interval 2)
"$K" pretrain-gpt "${MODEL[@]}" "${SHORT[@]}" --train-iters 2 --save "$W/x" > "$W/x1.txt"
"$K" pretrain-gpt "${MODEL[@]}" "${SHORT[@]}" --train-iters 4 --load "$W/x" --save "$W/x" \
  --fp8-format hybrid --fp8-recipe delayed > "$W/x2.txt"
grep -q "^ iteration *4/" "$W/x2.txt"
"$K" pretrain-gpt "${MODEL[@]}" "${SHORT[@]}" --train-iters 6 --load "$W/x" --save "$W/x" > "$W/x3.txt"
grep -q "^ iteration *6/" "$W/x3.txt"

# MLA (kv LoRA rank 24: that projection stays bf16) + MTP, FP8 tensorwise: a few steps run and learn.
MLA=(--num-layers 2 --hidden-size 48 --num-attention-heads 4 --seq-length 32 --make-vocab-size-divisible-by 16
     "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7 --attention-dropout 0
     --hidden-dropout 0 --lr 3e-3 --position-embedding-type rope --disable-bias-linear --multi-latent-attention
     --q-lora-rank 32 --kv-lora-rank 24 --qk-head-dim 16 --qk-pos-emb-head-dim 8 --v-head-dim 16 --mtp-num-layers 1
     --micro-batch-size 4 --global-batch-size 4 --train-iters 10 --eval-interval 100 --eval-iters 0 --log-interval 5)
"$K" pretrain-gpt "${MLA[@]}" --fp8-format hybrid --fp8-recipe tensorwise > "$W/mla.txt"
python3 - "$W/mla.txt" <<'PY'
import re, sys
losses = [float(m.group(1)) for m in re.finditer(r"\| lm loss: ([0-9.Ee+-]+)", open(sys.argv[1]).read())]
print("mla+mtp fp8 losses", losses)
sys.exit(0 if len(losses) == 2 and losses[1] < losses[0] else 1)
PY
grep -q "mtp_1 loss" "$W/mla.txt"

# What stays refused names its flag.
if "$K" pretrain-gpt "${MODEL[@]}" "${TRAIN[@]}" --train-iters 1 --fp8-format hybrid --moe-ffn-hidden-size 40 \
     > "$W/ffn.txt" 2>&1; then
  echo "an expert FFN size of 40 was accepted with FP8"; exit 1
fi
grep -q -- "--moe-ffn-hidden-size to be a multiple of 16" "$W/ffn.txt"
echo "pretrain_fp8_moe_flow: ok"
