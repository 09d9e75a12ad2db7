#!/usr/bin/env python3
"""Joins bench/gpt_shapes.sh's results: Kiln's pretrain-gpt logs (kiln_<shape>_<bf16|fp8>.txt, the last
log line: the window's ms per iteration, tokens/s, TFLOP/s and MFU by Megatron's FLOP formula, peak
memory) and bench/gpt_torch_peer.py's JSON lines (torch_peer.jsonl), one row per shape and
implementation, with Kiln's speed as a ratio to the peer's fastest variant of the same shape.
  python3 bench/gpt_shapes_table.py <folder>"""
import json
import os
import re
import sys

LINE = re.compile(
    r"elapsed time per iteration \(ms\): ([\d.]+).*tokens/s: (\d+).*TFLOP/s/GPU\): ([\d.]+).*MFU: ([\d.]+)%"
    r".*mem alloc/reserved/peak \(MiB\): \d+/\d+/(\d+)")


def kiln_rows(folder):
    rows = []
    for name in sorted(os.listdir(folder)):
        m = re.match(r"kiln_(.+)_(bf16|fp8)\.txt$", name)
        if not m:
            continue
        last = None
        with open(os.path.join(folder, name), errors="replace") as f:
            for line in f:
                hit = LINE.search(line)
                if hit:
                    last = hit
        row = {"shape": m.group(1), "impl": f"kiln {m.group(2)}"}
        if last:
            row.update(ms=float(last.group(1)), tokens_per_s=float(last.group(2)), tflops=float(last.group(3)),
                       mfu=float(last.group(4)) / 100, peak_gib=float(last.group(5)) / 1024)
        rows.append(row)
    return rows


def peer_rows(folder):
    rows = []
    path = os.path.join(folder, "torch_peer.jsonl")
    if not os.path.exists(path):
        return rows
    with open(path) as f:
        for line in f:
            try:
                r = json.loads(line)
            except json.JSONDecodeError:
                continue
            if "tokens_per_s" not in r:
                continue
            rows.append({"shape": r["shape"], "impl": f"torch {r.get('variant', '?')}", "ms": r["step_s_median"] * 1e3 if r.get("step_s_median") else None,
                         "tokens_per_s": r["tokens_per_s"], "tflops": r.get("tflops"), "mfu": r.get("mfu"),
                         "peak_gib": r.get("peak_memory_gib")})
    return rows


def main():
    folder = sys.argv[1] if len(sys.argv) > 1 else "."
    rows = kiln_rows(folder) + peer_rows(folder)
    best_peer = {}
    for r in rows:
        if r["impl"].startswith("torch") and r.get("tokens_per_s"):
            best_peer[r["shape"]] = max(best_peer.get(r["shape"], 0), r["tokens_per_s"])
    fmt = lambda v, spec: format(v, spec) if isinstance(v, (int, float)) else "-"
    print("| shape | implementation | ms / step | tokens/s | TFLOP/s | MFU | peak GiB | vs fastest torch |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: (r["shape"], r["impl"])):
        ratio = r.get("tokens_per_s") / best_peer[r["shape"]] if r.get("tokens_per_s") and best_peer.get(r["shape"]) else None
        print(f"| {r['shape']} | {r['impl']} | {fmt(r.get('ms'), '.1f')} | {fmt(r.get('tokens_per_s'), ',.0f')} | "
              f"{fmt(r.get('tflops'), '.1f')} | {fmt(r.get('mfu') * 100 if r.get('mfu') is not None else None, '.1f')}% | "
              f"{fmt(r.get('peak_gib'), '.1f')} | {fmt(ratio, '.2f')} |")


if __name__ == "__main__":
    main()
