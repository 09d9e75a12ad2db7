#!/usr/bin/env bash
# Issue 17's and 20's larger shapes on one GPU, Kiln against the PyTorch peer in the same call: GPT
# 1.3B (T2048, B4), the Llama-3.2-1B shape (T2048, B4, GQA 32/8, SwiGLU, RMSNorm, RoPE 500k, vocab
# 128256) and four layers of the Llama-3-8B shape (T4096, B1), each in bf16 and, for Kiln, with FP8
# (hybrid format, delayed scaling), then bench/gpt_shapes_table.py joins Kiln's log lines (tokens/s,
# MFU by Megatron's FLOP formula, peak memory) and the peer's JSON lines. Random tokens
# (bench/synthetic_gpt_data.py); the shapes are bench/gpt_torch_peer.py's SHAPES.
#   bash bench/gpt_shapes.sh <build dir> <out dir>   (KILN_SHAPES, PEER_VARIANTS, SHAPE_ITERS, SHAPE_TIMEOUT)
# SHAPE_MODES picks Kiln's precisions (default "bf16 fp8"; fp8 is delayed scaling, fp8-tensorwise and
# fp8-blockwise the other recipes; bf16-nofusion: bf16 with --no-gradient-accumulation-fusion); SHAPE_PREFIX, a command Kiln's runs go under
# (a profiler: tools/gpu-session.sh shapeprof); PEER_VARIANTS=none leaves the peer and the table out.
set -uo pipefail
B=${1:?build dir}
OUT=${2:?out dir}
K=$B/apps/kiln/kiln
P=$(command -v python3)
[ -x /opt/torch/.venv/bin/python3 ] && P=/opt/torch/.venv/bin/python3
mkdir -p "$OUT/shapes" /tmp/syn_gpt_shapes
DATA=/tmp/syn_gpt_shapes/syn
[ -f $DATA.idx ] || $P bench/synthetic_gpt_data.py $DATA > /dev/null  # ids < 50257, valid in every vocabulary here
COMMON=(--train-iters "${SHAPE_ITERS:-30}" --lr 3e-4 --min-lr 3e-5 --lr-decay-style cosine --lr-warmup-iters 5
  --weight-decay 0.1 --adam-beta2 0.95 --clip-grad 1.0 --bf16 --attention-dropout 0 --hidden-dropout 0
  --data-path $DATA --split 98,2,0 --eval-iters 0 --log-interval 10 --no-progress --transformer-impl transformer_engine
  --device cuda)
LLAMA=(--position-embedding-type rope --rotary-base 500000 --normalization RMSNorm --swiglu --disable-bias-linear
  --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8)
declare -A SHAPE=(
  [gpt-1.3b]="--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --ffn-hidden-size 8192 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --vocab-size 50257 --make-vocab-size-divisible-by 128"
  [llama-3.2-1b]="--num-layers 16 --hidden-size 2048 --num-attention-heads 32 --ffn-hidden-size 8192 --seq-length 2048 --max-position-embeddings 2048 --micro-batch-size 4 --global-batch-size 4 --vocab-size 128256 --make-vocab-size-divisible-by 128 ${LLAMA[*]}"
  [llama-3-8b-4layers]="--num-layers 4 --hidden-size 4096 --num-attention-heads 32 --ffn-hidden-size 14336 --seq-length 4096 --max-position-embeddings 4096 --micro-batch-size 1 --global-batch-size 1 --vocab-size 128256 --make-vocab-size-divisible-by 128 ${LLAMA[*]}"
)
SHAPES=${KILN_SHAPES:-gpt-1.3b,llama-3.2-1b,llama-3-8b-4layers}
for s in ${SHAPES//,/ }; do
  for mode in ${SHAPE_MODES:-bf16 fp8}; do
    extra=()
    [ $mode = fp8 ] && extra=(--fp8-format hybrid --fp8-recipe delayed --fp8-amax-history-len 16)
    [ $mode = fp8-tensorwise ] && extra=(--fp8-format hybrid --fp8-recipe tensorwise)
    [ $mode = fp8-blockwise ] && extra=(--fp8-format hybrid --fp8-recipe blockwise)
    [ $mode = bf16-nofusion ] && extra=(--no-gradient-accumulation-fusion)
    # shellcheck disable=SC2086
    timeout "${SHAPE_TIMEOUT:-90}" ${SHAPE_PREFIX:-} $K pretrain-gpt ${SHAPE[$s]} "${COMMON[@]}" "${extra[@]}" > "$OUT/shapes/kiln_${s}_${mode}.txt" 2>&1
    echo "kiln $s $mode rc=$?"
    grep -E "iteration|rror" "$OUT/shapes/kiln_${s}_${mode}.txt" | tail -1 | cut -c1-330
  done
done
[ "${PEER_VARIANTS:-}" = none ] && exit 0
timeout "${PEER_TIMEOUT:-240}" $P bench/gpt_torch_peer.py --shapes "$SHAPES" --variants "${PEER_VARIANTS:-eager}" \
  > "$OUT/shapes/torch_peer.jsonl" 2> "$OUT/shapes/torch_peer.err"
echo "gpt_torch_peer rc=$?"
cut -c1-300 "$OUT/shapes/torch_peer.jsonl"
$P bench/gpt_shapes_table.py "$OUT/shapes" | tee "$OUT/gpt_shapes_table.txt"
