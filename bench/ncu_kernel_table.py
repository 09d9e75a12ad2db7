#!/usr/bin/env python3
"""Sums an `ncu --csv --metrics gpu__time_duration.sum` log per kernel name: where a program's GPU time
goes, kernel by kernel (ncu serialises kernels, so the sum is the GPU's busy time without overlap).

  python3 bench/ncu_kernel_table.py ncu.csv [--steps N] [--top K]

--steps divides the sums by the number of training steps profiled, to give time per step."""
import argparse
import collections
import csv
import re
import sys

UNIT_TO_US = {"nsecond": 1e-3, "ns": 1e-3, "usecond": 1.0, "us": 1.0, "msecond": 1e3, "ms": 1e3, "second": 1e6}


def short_name(name):
    # templates and argument lists make names unreadable; keep the function's name and its first template word
    name = re.sub(r"\(.*\)$", "", name)
    return name[:110]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("csv")
    ap.add_argument("--steps", type=float, default=1.0)
    ap.add_argument("--top", type=int, default=45)
    a = ap.parse_args()
    rows = []
    with open(a.csv, newline="", errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]  # ncu's own messages are not quoted
    for r in csv.DictReader(lines):
        if r.get("Metric Name") != "gpu__time_duration.sum":
            continue
        try:
            v = float(r["Metric Value"].replace(",", ""))
        except ValueError:
            continue
        rows.append((short_name(r["Kernel Name"]), v * UNIT_TO_US.get(r["Metric Unit"], 1.0)))
    if not rows:
        sys.exit("no gpu__time_duration.sum rows in %s" % a.csv)
    total = sum(v for _, v in rows)
    by = collections.defaultdict(lambda: [0, 0.0])
    for n, v in rows:
        by[n][0] += 1
        by[n][1] += v
    print("kernels: %d launches, %.3f ms GPU time in all, %.3f ms per step (%g steps)" %
          (len(rows), total / 1e3, total / 1e3 / a.steps, a.steps))
    print("%9s %7s %8s %6s  %s" % ("ms/step", "calls", "us/call", "share", "kernel"))
    for n, (c, v) in sorted(by.items(), key=lambda kv: -kv[1][1])[: a.top]:
        print("%9.3f %7.1f %8.1f %5.1f%%  %s" % (v / 1e3 / a.steps, c / a.steps, v / c, 100 * v / total, n))


if __name__ == "__main__":
    main()
