#!/usr/bin/env bash
# gpt_io_flow.sh KILN WORKDIR: import-hf -> generate -> export-hf on small Hugging Face directories
# that tests/parity/make_hf_fixture.py writes with Debian's torch (GPT-2 and Llama layouts), on the
# CPU: the exported tensors are the imported ones bit for bit, generation is seeded, and a prompt
# longer than the context is refused; then small models of each exportable style (GPT-2, Llama,
# bf16 GPT-2, Mixtral-style MoE, DeepSeek-V3-style MLA + MoE) are trained, exported, and their
# exported tensors run through HF's math (hf_forward_check.py) to Kiln's logits. Exit 77 (skipped)
# without python3 + torch.
set -euo pipefail
K=$1
W=$2
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PY=${KILN_TEST_PYTHON:-/usr/bin/python3}  # the H200 machine: its venv python (tools/gpu-session.sh hfcheck)
if ! [ -x "$PY" ] || ! "$PY" -c 'import torch' >/dev/null 2>&1; then
  echo "gpt_io_flow: python3 with torch is not available: skipped"
  exit 77
fi
rm -rf "$W"
mkdir -p "$W"
for arch in gpt2 llama; do
  "$PY" "$ROOT/tests/parity/make_hf_fixture.py" "$W/hf_$arch" "$arch"
  "$K" import-hf --hf "$W/hf_$arch" --save "$W/ckpt_$arch" | tee "$W/import_$arch.txt"
  grep -q "^import-hf: .* -> .*iter_0000000$" "$W/import_$arch.txt"

  # Greedy and seeded sampling are reproducible; the speed line comes last (left out of the comparison).
  "$K" generate --load "$W/ckpt_$arch" --prompt "the thin" --max-new-tokens 12 --greedy --device cpu \
    --ignore-eos > "$W/greedy_$arch.txt"
  grep -q "^\[generate\] [0-9]* prompt tokens in .* ms. 12 new tokens, .* tokens/s after the first (cpu, iteration 0)$" \
    "$W/greedy_$arch.txt"
  for run in a b; do
    "$K" generate --load "$W/ckpt_$arch" --prompt "the thin" --max-new-tokens 12 --temperature 0.9 --top-k 40 \
      --top-p 0.9 --seed 7 --device cpu --ignore-eos | sed '$d' > "$W/sampled_${arch}_$run.txt"
  done
  cmp "$W/sampled_${arch}_a.txt" "$W/sampled_${arch}_b.txt"

  # The context is 64 positions: a 200-byte prompt of single-byte tokens does not fit.
  long=$(printf 'x%.0s' $(seq 1 200))
  if "$K" generate --load "$W/ckpt_$arch" --prompt "$long" --device cpu > "$W/long_$arch.txt" 2>&1; then
    echo "a prompt longer than the context was accepted"
    exit 1
  fi
  grep -q "the prompt is 200 tokens, but the model's context is 64 positions" "$W/long_$arch.txt"

  "$K" export-hf --load "$W/ckpt_$arch" --out "$W/export_$arch"
  "$PY" - "$W/hf_$arch" "$W/export_$arch" <<'PYEOF'
import json, struct, sys

def read(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n:]
    return meta, {k: (v["dtype"], v["shape"], body[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in header.items()}

_, original = read(sys.argv[1] + "/model.safetensors")
meta, exported = read(sys.argv[2] + "/model.safetensors")
assert meta.get("format") == "pt", meta
assert original.keys() == exported.keys(), set(original) ^ set(exported)
for name in original:
    assert original[name] == exported[name], name + " differs"
a, b = json.load(open(sys.argv[1] + "/config.json")), json.load(open(sys.argv[2] + "/config.json"))
for key in ("architectures", "vocab_size", "hidden_size", "n_embd", "num_key_value_heads", "rope_scaling", "rope_theta",
            "tie_word_embeddings", "n_positions", "max_position_embeddings", "intermediate_size"):
    assert a.get(key) == b.get(key) or key not in a, (key, a.get(key), b.get(key))
print("export matches the original directory: %d tensors" % len(original))
PYEOF
done

# A pretrain-gpt checkpoint of each style (the fixture's byte-level tokenizer, a slice of
# tinyshakespeare when shared/ has it, else this script): generate reads it, and its export-hf
# directory gives Kiln's logits under HF's math.
TEXT=$ROOT/../shared/data/tinyshakespeare/input.txt
[ -f "$TEXT" ] || TEXT=$0
head -c 100000 "$TEXT" > "$W/text.txt"
TOK=(--tokenizer-type GPT2BPETokenizer --vocab-file "$W/hf_gpt2/vocab.json" --merge-file "$W/hf_gpt2/merges.txt")
"$K" preprocess-data --input "$W/text.txt" --output-prefix "$W/text" "${TOK[@]}" --append-eod
LLAMA=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
       --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2 --use-rope-scaling
       --rope-scaling-factor 32 --rotary-base 500000)
# Mixtral: Llama with MoE in every layer; DeepSeek-V3: MLA, a dense first layer, then sigmoid-routed
# MoE with expert bias, group-limited top-k and a shared expert.
MIXTRAL=(--position-embedding-type rope --normalization RMSNorm --swiglu --disable-bias-linear
         --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 2
         --num-experts 4 --moe-router-topk 2 --moe-ffn-hidden-size 32 --moe-grouped-gemm --moe-permute-fusion)
DEEPSEEK=(--position-embedding-type rope --normalization RMSNorm --norm-epsilon 1e-6 --swiglu --disable-bias-linear
          --untie-embeddings-and-output-weights --multi-latent-attention --q-lora-rank 24 --kv-lora-rank 16
          --qk-head-dim 12 --qk-pos-emb-head-dim 4 --v-head-dim 8 --num-experts 8 --moe-router-topk 4
          --moe-ffn-hidden-size 16 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
          --moe-router-num-groups 4 --moe-router-group-topk 2 --moe-shared-expert-intermediate-size 32
          --moe-layer-freq '[0,1]' --moe-router-topk-scaling-factor 2.5)
for style in gpt2 llama gpt2_bf16 mixtral deepseek; do
  extra=()
  [ $style = llama ] && extra=("${LLAMA[@]}")
  [ $style = mixtral ] && extra=("${MIXTRAL[@]}")
  [ $style = deepseek ] && extra=("${DEEPSEEK[@]}")
  [ $style = gpt2_bf16 ] && extra=(--bf16)  # exported as bfloat16 tensors
  "$K" pretrain-gpt --num-layers 2 --hidden-size 64 --num-attention-heads 4 --seq-length 64 "${extra[@]}" "${TOK[@]}" \
    --data-path "$W/text_text_document" --micro-batch-size 4 --train-iters 10 --lr 3e-3 --eval-iters 0 \
    --save "$W/trained_$style" --save-interval 10 --device cpu > "$W/pretrain_$style.txt"
  "$K" generate --load "$W/trained_$style" --prompt "ROMEO: the thing" --max-new-tokens 5 --device cpu \
    --dump-logits "$W/trained_$style.logits.safetensors" > "$W/generate_$style.txt"
  grep -q "(cpu, iteration 10)$" "$W/generate_$style.txt"
  "$K" export-hf --load "$W/trained_$style" --out "$W/trained_${style}_hf"
  "$PY" "$ROOT/tests/parity/hf_forward_check.py" "$W/trained_${style}_hf" "$W/trained_$style.logits.safetensors"
done
# An import-hf checkpoint holds no Adam state: a plain --load says to use --finetune, which trains it
# (the model flags are the fixture's, the tokenizer the checkpoint's own copy).
G=$W/ckpt_gpt2
FT=(--num-layers 2 --hidden-size 32 --ffn-hidden-size 128 --num-attention-heads 4 --kv-channels 8
    --max-position-embeddings 64 --seq-length 64 --tokenizer-type GPT2BPETokenizer --vocab-file "$G/tokenizer/vocab.json"
    --merge-file "$G/tokenizer/merges.txt" --data-path "$W/text_text_document" --micro-batch-size 4 --train-iters 6
    --lr 1e-3 --eval-iters 0 --log-interval 3 --device cpu --load "$G")
if "$K" pretrain-gpt "${FT[@]}" > "$W/no_finetune.txt" 2>&1; then
  echo "resuming Adam from an import-hf checkpoint should fail"; exit 1
fi
grep -q "pass --finetune" "$W/no_finetune.txt"
"$K" pretrain-gpt "${FT[@]}" --finetune --save "$W/finetuned" | tee "$W/finetune.txt"
grep -q "^--finetune: loaded the model of .*iter_0000000 (iteration 0)" "$W/finetune.txt"
test "$(cat "$W/finetuned/latest_checkpointed_iteration.txt")" = 6
echo "gpt_io_flow: passed"
