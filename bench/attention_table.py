#!/usr/bin/env python3
"""Joins bench_attention's rows (one per Kiln implementation) with attention_torch_peer.py's (SDPA):
one line per shape and pass, TFLOP/s of each, and each Kiln implementation over SDPA.
  python3 bench/attention_table.py kiln.jsonl torch.jsonl"""
import json
import sys


def main():
    rows = {}
    for path in sys.argv[1:]:
        for line in open(path):
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            key = (r["shape"], "causal" if r.get("causal") else "full", r.get("pass", "-"))
            rows.setdefault(key, {})[r.get("impl", "?")] = r.get("tflops") if "tflops" in r else r.get("error", "?")[:60]
    for (shape, causal, pas), by in rows.items():
        sdpa = by.get("torch_sdpa")
        cells = []
        for impl, v in sorted(by.items()):
            if isinstance(v, float):
                ratio = f" ({v / sdpa:.2f}x)" if isinstance(sdpa, float) and impl != "torch_sdpa" else ""
                cells.append(f"{impl} {v:.0f}{ratio}")
            else:
                cells.append(f"{impl}: {v}")
        print(f"{shape:<26} {causal:<6} {pas:<8} " + " | ".join(cells))


if __name__ == "__main__":
    main()
