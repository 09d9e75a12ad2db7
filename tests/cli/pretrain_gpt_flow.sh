#!/usr/bin/env bash
# pretrain_gpt_flow.sh KILN WORKDIR SOURCE_DIR: the LLM walk on the CPU with a tiny GPT on
# tinyshakespeare: preprocess-data with a byte-level GPT-2 tokenizer (write_byte_tokenizer.py: 256 byte tokens
# and <|endoftext|>, no merges, so nothing is fetched), pretrain-gpt to a stated loss, then a run
# stopped half-way and resumed must print the very same loss lines as the straight run, and a
# checkpoint of another shape is refused naming the flag; the checkpoints carry checksums and the
# tokenizer; --rewind rolls an injected NaN back and ends where a run told to skip that batch ends;
# a process killed in a save resumes from the previous checkpoint bit-identically; --finetune starts a fresh run
# from a checkpoint's weights.
set -euo pipefail
K=$1
W=$2
SRC=$3
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA
test -f "$DATA.bin" && test -f "$DATA.idx"

MODEL=(--num-layers 2 --num-attention-heads 4 --seq-length 64 --make-vocab-size-divisible-by 1
       "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7)

# 1. It learns: bytes of English start at ln 257 = 5.55 nats; 150 steps of 32 x 64 bytes reach about 2.63
# (measured: validation loss 2.633 with these flags and seed).
"$K" pretrain-gpt "${MODEL[@]}" --hidden-size 64 --micro-batch-size 16 --global-batch-size 32 --train-iters 150 \
  --lr 3e-3 --min-lr 3e-4 --lr-decay-style cosine --lr-warmup-iters 10 --weight-decay 0.1 --adam-beta2 0.95 \
  --attention-dropout 0 --hidden-dropout 0 --eval-interval 75 --eval-iters 4 --log-interval 25 \
  --save "$W/learn" --tensorboard-dir "$W/learn/tb" | tee "$W/learn.txt"
grep -q "^memory estimate on cpu: parameters .* GiB free$" "$W/learn.txt"
grep -q "^ iteration      150/     150 | .* | MFU: n/a | .* | ETA 0m00s$" "$W/learn.txt"
final=$(grep "validation loss at iteration 150" "$W/learn.txt" | sed 's/.*lm loss value: \([^ ]*\) .*/\1/')
python3 -c "import sys; l = float('$final'); print('final validation loss', l); sys.exit(0 if l < 2.8 else 1)"
test "$(cat "$W/learn/latest_checkpointed_iteration.txt")" = 150
test -f "$W/learn/iter_0000150/model.safetensors"
test -f "$W/learn/loss_curve.png"
test -f "$W/learn/iter_0000150/manifest.json"
cmp "$W/tok/vocab.json" "$W/learn/tokenizer/vocab.json"
cmp "$W/tok/merges.txt" "$W/learn/tokenizer/merges.txt"
# generate reads the checkpoint's own copy: the recorded tokenizer paths may be gone.
mv "$W/tok" "$W/tok.away"
"$K" generate --load "$W/learn" --prompt "ROMEO:" --max-new-tokens 4 --greedy --device cpu > "$W/generate.txt"
mv "$W/tok.away" "$W/tok"
grep -q "(cpu, iteration 150)$" "$W/generate.txt"
ls "$W"/learn/tb/events.out.tfevents.* > /dev/null

# 2. Bit-identical resume: 20 iterations straight vs stopped at 10 (inside a log window) and resumed,
# with dropout on and gradient accumulation.
RUN=("${MODEL[@]}" --micro-batch-size 4 --global-batch-size 8 --train-iters 20 --lr 1e-3 --lr-decay-style cosine
     --lr-warmup-iters 4 --eval-interval 10 --eval-iters 1 --log-interval 3)
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/straight" | tee "$W/straight.txt"
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/resumed" --load "$W/resumed" --exit-interval 10 | tee "$W/first.txt"
grep -q "^exiting at iteration 10 (--exit-interval 10)$" "$W/first.txt"
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/resumed" --load "$W/resumed" | tee "$W/second.txt"
grep -q "^loaded checkpoint .*iter_0000010 (iteration 10, 80 samples consumed)$" "$W/second.txt"
losses() { sed -n 's/^ iteration *\([0-9]*\)\/.*learning rate: \([^ ]*\) | lm loss: \([^ ]*\) | grad norm: \([^ ]*\) .*/\1 \2 \3 \4/p' "$@"; }
losses "$W/straight.txt" > "$W/straight.losses"
losses "$W/first.txt" "$W/second.txt" > "$W/resumed.losses"
test "$(wc -l < "$W/straight.losses")" -eq 7
diff "$W/straight.losses" "$W/resumed.losses"
# The same run on te/'s fused kernels: the attention dropout (0.1, the default) runs inside
# te::attention with the mask the local attention's nn::Dropout draws, so the losses and gradient
# norms follow the local run's to rounding (the fused kernels sum in another order).
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --transformer-impl transformer_engine | tee "$W/te.txt"
losses "$W/te.txt" > "$W/te.losses"
python3 - "$W/straight.losses" "$W/te.losses" <<'PY'
import sys
local = [l.split() for l in open(sys.argv[1])]
te = [l.split() for l in open(sys.argv[2])]
assert len(local) == len(te) == 7, (len(local), len(te))
for a, b in zip(local, te):
    assert a[0] == b[0], (a, b)
    for x, y, what in ((a[2], b[2], "loss"), (a[3], b[3], "grad norm")):
        x, y = float(x), float(y)
        assert abs(x - y) <= 1e-3 * abs(x), f"iteration {a[0]}: {what} local {x} transformer_engine {y}"
print("transformer_engine with attention dropout follows the local run")
PY
grep -h "validation loss at iteration 20" "$W/straight.txt" > "$W/straight.eval"
grep -h "validation loss at iteration 20" "$W/second.txt" > "$W/resumed.eval"
diff "$W/straight.eval" "$W/resumed.eval"

# 3. A checkpoint of another shape names the flag.
if "$K" pretrain-gpt "${RUN[@]}" --hidden-size 32 --load "$W/straight" > "$W/shape.txt" 2>&1; then
  echo "loading a checkpoint of another shape should fail"; exit 1
fi
cat "$W/shape.txt"
grep -q "^  --hidden-size: 64 in the checkpoint, 32 in this run$" "$W/shape.txt"

# 4. --rewind: a NaN injected at iteration 5 is rolled back to the snapshot at 4 and its global batch
# skipped; a clean run given --skip-batches 5 prints the very same loss lines.
KILN_FAULT=nan_loss@5 "$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/rewound" --rewind \
  --rewind-snapshot-interval 2 --async-save --keep-last 1 --save-interval 5 | tee "$W/rewound.txt"
grep -q "^rewind at iteration 5: nonfinite_loss: .*rolled back to iteration 4 (memory snapshot)" "$W/rewound.txt"
grep -q "^Rewinds: 1 in this run; skipped global batches (iterations): 5 " "$W/rewound.txt"
grep -q '"skipped_batches": "5"' "$W/rewound/iter_0000020/checkpoint.json"
test "$(ls -d "$W"/rewound/iter_* | wc -l)" -eq 1
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --skip-batches 5 | tee "$W/skipped.txt"
losses "$W/rewound.txt" > "$W/rewound.losses"
losses "$W/skipped.txt" > "$W/skipped.losses"
test "$(wc -l < "$W/rewound.losses")" -eq 7
diff "$W/rewound.losses" "$W/skipped.losses"

# 5. A process killed half-way through writing its second checkpoint in the background
# (KILN_FAULT kill_in_save@2) leaves the first one intact; the resumed run removes the temporary
# folder and prints the straight run's loss lines.
if KILN_FAULT=kill_in_save@2 "$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/killed" --save-interval 5 \
  --async-save > "$W/killed1.txt" 2>&1; then
  echo "the run should have been killed in its second save"; exit 1
fi
grep -q "^fault injection: SIGKILL while writing .*iter_0000010.tmp" "$W/killed1.txt"
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --save "$W/killed" --load "$W/killed" --save-interval 5 | tee "$W/killed2.txt"
grep -q "^removed 1 stale temporar" "$W/killed2.txt"
grep -q "^loaded checkpoint .*iter_0000005 (iteration 5, 40 samples consumed)$" "$W/killed2.txt"
{ losses "$W/killed1.txt" | awk '$1 <= 5'; losses "$W/killed2.txt"; } > "$W/killed.losses"
diff "$W/straight.losses" "$W/killed.losses"

# 6. --finetune: the weights of a checkpoint, iteration 0, a fresh optimizer.
"$K" pretrain-gpt "${RUN[@]}" --hidden-size 64 --load "$W/straight" --finetune | tee "$W/finetune.txt"
grep -q "^--finetune: loaded the model of .*iter_0000020 (iteration 20)" "$W/finetune.txt"
grep -q "^ iteration       20/      20 |" "$W/finetune.txt"
echo "pretrain_gpt_flow: all checks passed"
