#!/usr/bin/env bash
# Runs the Kiln GPU benchmarks from a build directory and their PyTorch peers, then prints a table
# of Kiln vs PyTorch (time ratio: > 1 means Kiln is slower). Usage: bash bench/gpu_foundation.sh build
# Outputs stay in $OUT_DIR (default: <build>/bench-results): kiln.jsonl, torch.jsonl, table.txt.
set -uo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
mkdir -p "$OUT_DIR"
: > "$OUT_DIR/kiln.jsonl"
: > "$OUT_DIR/torch.jsonl"
for b in op_overhead bandwidth matmul conv adamw; do
  exe="$BUILD/bench/bench_$b"
  if [ -x "$exe" ]; then
    echo "== kiln $b" >&2
    "$exe" | tee -a "$OUT_DIR/kiln.jsonl" || echo "bench_$b failed (rc=$?)" >&2
  else
    echo "missing $exe" >&2
  fi
  if python3 -c "import torch; assert torch.cuda.is_available()" 2>/dev/null; then
    echo "== torch $b" >&2
    python3 "$HERE/torch_peers.py" "$b" | tee -a "$OUT_DIR/torch.jsonl" || echo "torch $b failed" >&2
  fi
done
python3 - "$OUT_DIR/kiln.jsonl" "$OUT_DIR/torch.jsonl" <<'PY' | tee "$OUT_DIR/table.txt"
import json, sys
def load(p):
    rows = {}
    for line in open(p):
        line = line.strip()
        if not line.startswith("{"):
            continue
        r = json.loads(line)
        rows[(r.get("bench"), r.get("op"), r.get("dtype"), r.get("shape"))] = r
    return rows
k, t = load(sys.argv[1]), load(sys.argv[2])
print(f"{'bench':<12} {'op':<16} {'dtype':<9} {'shape':<22} {'kiln':>10} {'torch':>10} {'kiln/torch':>10}  extra")
for key, r in k.items():
    metric = "us_per_op" if "us_per_op" in r else "ms"
    kv = r.get(metric)
    tv = t.get(key, {}).get(metric)
    ratio = f"{kv / tv:10.2f}" if kv and tv else f"{'-':>10}"
    extra = ""
    for e in ("gbps", "tflops", "pct_copy", "us_per_op_host", "us_per_op_host_burst", "kiln_vs_direct"):
        if e in r:
            extra += f" {e}={r[e]:.1f}" if isinstance(r[e], float) else f" {e}={r[e]}"
    tvs = f"{tv:10.3f}" if tv else f"{'-':>10}"
    print(f"{key[0]:<12} {key[1]:<16} {str(key[2]):<9} {str(key[3]):<22} {kv:10.3f} {tvs} {ratio} {extra}")
PY
