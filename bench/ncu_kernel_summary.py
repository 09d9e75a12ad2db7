#!/usr/bin/env python3
"""Sums the kernel times of an `ncu --metrics gpu__time_duration.sum --csv` log by kernel name:
where a training step's GPU time goes (no Nsight Systems on the H200 machine; ncu serialises the
kernels, so this is GPU time per kernel, not the overlapped wall time).
  python3 bench/ncu_kernel_summary.py ncu.csv [--steps N] [--top 40]"""
import csv
import sys
from collections import defaultdict


def main():
    path = sys.argv[1]
    steps = int(sys.argv[sys.argv.index("--steps") + 1]) if "--steps" in sys.argv else 1
    top = int(sys.argv[sys.argv.index("--top") + 1]) if "--top" in sys.argv else 40
    with open(path, newline="") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu prints its own notes before the CSV
    total = defaultdict(float)
    count = defaultdict(int)
    for row in csv.DictReader(lines):
        if row.get("Metric Name") != "gpu__time_duration.sum":
            continue
        name = row["Kernel Name"][:90]
        ns = float(row["Metric Value"].replace(",", ""))
        unit = row.get("Metric Unit", "ns")
        ns *= {"ns": 1, "nsecond": 1, "us": 1e3, "usecond": 1e3, "ms": 1e6, "msecond": 1e6}.get(unit, 1)
        total[name] += ns
        count[name] += 1
    grand = sum(total.values())
    print(f"{len(total)} kernels, {sum(count.values())} launches, {grand / 1e6 / steps:.2f} ms GPU time per step")
    for name, ns in sorted(total.items(), key=lambda kv: -kv[1])[:top]:
        print(f"{ns / 1e6 / steps:9.3f} ms {100 * ns / grand:5.1f}% {count[name] / steps:7.1f}x  {name}")


if __name__ == "__main__":
    main()
