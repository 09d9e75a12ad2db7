#!/usr/bin/env python3
"""Side-by-side table of bench_conv runs: Kiln (cuDNN graph API), Kiln with KILN_CUDNN_LEGACY=1
and PyTorch (bench/torch_peers.py conv). Usage: conv_table.py graph.jsonl legacy.jsonl torch.jsonl
Ratios are time over PyTorch's time: below 1 means faster than PyTorch."""
import json
import sys


def load(path):
    rows = {}
    for line in open(path):
        line = line.strip()
        if line.startswith("{"):
            r = json.loads(line)
            rows[(r["op"], r["dtype"], r["shape"])] = r["ms"]
    return rows


graph, legacy, torch = (load(p) for p in sys.argv[1:4])
print(f"{'op':<16} {'dtype':<9} {'shape':<22} {'graph ms':>9} {'legacy ms':>9} {'torch ms':>9} {'graph/torch':>11}")
totals = {}
for key, g in graph.items():
    l, t = legacy.get(key), torch.get(key)
    ratio = f"{g / t:11.2f}" if t else f"{'-':>11}"
    ls = f"{l:9.3f}" if l else f"{'-':>9}"
    ts = f"{t:9.3f}" if t else f"{'-':>9}"
    print(f"{key[0]:<16} {key[1]:<9} {key[2]:<22} {g:9.3f} {ls} {ts} {ratio}")
    if key[0] == "conv2d_fwd_bwd" and t:
        tot = totals.setdefault(key[1], [0.0, 0.0])
        tot[0] += g
        tot[1] += t
for dtype, (g, t) in totals.items():
    print(f"sum of fwd+bwd over the shapes, {dtype}: kiln {g:.3f} ms, torch {t:.3f} ms, ratio {g / t:.2f}")
