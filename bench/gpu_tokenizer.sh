#!/usr/bin/env bash
# On the H200 machine (python3 with numpy, tokenizers, tiktoken; 16 cores): Kiln's tokenizers
# against Hugging Face tokenizers and tiktoken (identical ids on ~12 MB of varied text, MB/s per
# thread), and preprocess-data from 1 to 16 workers. See bench/tokenizer_peers.py.
#
#   bash bench/gpu_tokenizer.sh [BUILD_DIR]      (default build-tok; built here, CPU only, if missing)
# Needs data/tokenizers/ (from `kiln data tokenizers`) carried along. Results: $OUT/results.{md,json}.
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR=${1:-build-tok}
OUT=${OUT:-out/tokenizer}
mkdir -p "$OUT"
if [ ! -x "$BUILD_DIR/apps/kiln/kiln" ] || [ ! -x "$BUILD_DIR/bench/bench_tokenizer" ]; then
  BUILD_DIR="$BUILD_DIR" JOBS="$(nproc)" bash tools/build.sh -DKILN_CUDA=OFF -DKILN_BUILD_TESTS=OFF > "$OUT/build.log" 2>&1 \
    || { tail -50 "$OUT/build.log"; exit 1; }
fi
for f in data/tokenizers/llama3/tokenizer.json data/tokenizers/gpt2/vocab.json data/tokenizers/gpt2/merges.txt; do
  [ -f "$f" ] || { echo "gpu_tokenizer.sh: $f missing: carry data/tokenizers (run 'kiln data tokenizers' first)"; exit 1; }
done
lscpu | grep -E "Model name|^CPU\(s\)" > "$OUT/cpu.txt" || true
status=0
python3 bench/tokenizer_peers.py --kiln-build "$BUILD_DIR" --tokenizers data/tokenizers --out "$OUT" || status=$?
# Only the results come back: the corpus and the datasets are reproducible and large.
rm -f "$OUT"/*.bin "$OUT"/*.idx "$OUT"/*.jsonl "$OUT"/broken.txt
exit $status
