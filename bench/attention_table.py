#!/usr/bin/env python3
"""Joins bench_attention's rows (one per Kiln implementation) with attention_torch_peer.py's (SDPA):
one line per shape and pass, TFLOP/s of each, and each Kiln implementation over SDPA (a dropout row
over SDPA with the same dropout).
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
        cells = []
        for impl, v in sorted(by.items()):
            # each row against SDPA with the same dropout ("-dropout0.1" rows against SDPA's)
            peer = "torch_sdpa" + ("-dropout0.1" if impl.endswith("-dropout0.1") else "")
            sdpa = by.get(peer)
            if isinstance(v, float):
                ratio = f" ({v / sdpa:.2f}x)" if isinstance(sdpa, float) and not impl.startswith("torch_sdpa") else ""
                cells.append(f"{impl} {v:.0f}{ratio}")
            else:
                cells.append(f"{impl}: {v}")
        print(f"{shape:<26} {causal:<6} {pas:<8} " + " | ".join(cells))


if __name__ == "__main__":
    main()
