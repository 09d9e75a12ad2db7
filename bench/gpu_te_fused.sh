#!/usr/bin/env bash
# Runs bench_te_fused (te/'s fused kernels) and its PyTorch peer (eager and torch.compile), then
# prints one row per op: Kiln's time, PyTorch's, and torch/kiln (> 1 means Kiln is faster), with
# Kiln's fraction of the H200's 4.8 TB/s for the memory-bound kernels.
# Usage: bash bench/gpu_te_fused.sh build   (outputs in $OUT_DIR, default <build>/bench-results)
set -uo pipefail
BUILD=${1:-build}
HERE=$(cd "$(dirname "$0")" && pwd)
OUT_DIR=${OUT_DIR:-$BUILD/bench-results}
mkdir -p "$OUT_DIR"
"$BUILD/bench/bench_te_fused" | tee "$OUT_DIR/te_fused_kiln.jsonl" || echo "bench_te_fused failed (rc=$?)" >&2
python3 "$HERE/te_fused_torch_peer.py" | tee "$OUT_DIR/te_fused_torch.jsonl" || echo "te_fused_torch_peer.py failed" >&2
python3 - "$OUT_DIR/te_fused_kiln.jsonl" "$OUT_DIR/te_fused_torch.jsonl" <<'PY' | tee "$OUT_DIR/te_fused_table.txt"
import json, sys
rows = {}
for path in sys.argv[1:]:
    for line in open(path):
        if line.startswith("{"):
            r = json.loads(line)
            if "ms" in r:
                rows.setdefault(r["op"], {})[r["impl"]] = r
print(f"{'op':<40} {'kiln ms':>9} {'bw%':>5} {'eager ms':>9} {'compile ms':>10} {'eager/kiln':>10} {'compile/kiln':>12}")
for op, by in rows.items():
    k = by.get("kiln")
    if not k:
        continue
    e, c = by.get("torch_eager"), by.get("torch_compile")
    bw = f"{100 * k['fraction_of_peak_bw']:.0f}" if "fraction_of_peak_bw" in k else "-"
    fmt = lambda r: f"{r['ms']:.3f}" if r else "-"
    ratio = lambda r: f"{r['ms'] / k['ms']:.2f}" if r else "-"
    print(f"{op:<40} {k['ms']:>9.3f} {bw:>5} {fmt(e):>9} {fmt(c):>10} {ratio(e):>10} {ratio(c):>12}")
PY
