#!/usr/bin/env python3
"""Medians and spread of repeated benchmark rounds (JSON lines from bench_cifar10_train_step and
bench/cifar10_torch_peer.py): one row per implementation, mode and case, with the Kiln/peer ratio
of medians for each peer row.

    python3 bench/peer_rounds.py FILE.jsonl [...]
"""
import json
import statistics
import sys
from collections import defaultdict


def main():
    rows = defaultdict(list)
    for path in sys.argv[1:]:
        for line in open(path, encoding="utf-8"):
            line = line.strip()
            if not line.startswith("{"):
                continue
            r = json.loads(line)
            if r.get("bench") != "cifar10_train_step":
                continue
            impl = r["impl"]
            mode = ("cuda_graph" if r.get("cuda_graph") else "eager") if impl == "kiln" else r.get("mode", "eager")
            case = f"{r['model']} b{r['batch']} {r['precision']}"
            rows[(case, impl, mode)].append(r["images_per_second"])
    cases = sorted({c for c, _, _ in rows})
    print(f"{'case':<24} {'impl':<14} {'mode':<13} {'rounds':>6} {'median img/s':>13} {'min':>10} {'max':>10}  best Kiln / this")
    for case in cases:
        kiln_best = max((statistics.median(v) for (c, i, _), v in rows.items() if c == case and i == "kiln"), default=0)
        for (c, impl, mode), v in sorted(rows.items()):
            if c != case:
                continue
            med = statistics.median(v)
            ratio = f"{kiln_best / med:.2f}x" if impl != "kiln" and med else ""
            print(f"{case:<24} {impl:<14} {mode:<13} {len(v):>6} {med:>13.1f} {min(v):>10.1f} {max(v):>10.1f}  {ratio}")


if __name__ == "__main__":
    main()
