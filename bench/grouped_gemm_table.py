#!/usr/bin/env python3
"""Table of bench_grouped_gemm's and bench/grouped_gemm_torch_peer.py's JSON lines: per config and pass,
the dense GEMM's TFLOP/s and each grouped implementation's time over the dense GEMM's (vs_dense;
issue 19's bound is 1.10), Kiln's and PyTorch's side by side, then the failed checks.
Usage: python3 bench/grouped_gemm_table.py grouped_gemm.jsonl [grouped_gemm_torch.jsonl]
"""
import json
import sys

IMPLS = ["auto", "grouped", "grouped_host_counts", "loop", "loop_host_counts", "chunked", "tc",
         "torch_grouped_mm", "torch_loop"]


def main(paths):
    rows, dense, failed = {}, {}, []
    for path in paths:
        with open(path) as f:
            for line in f:
                if not line.startswith("{"):
                    continue
                d = json.loads(line)
                if d.get("bench", "").endswith("_check") and not d.get("ok"):
                    failed.append(d)
                if d.get("bench") not in ("grouped_gemm", "grouped_gemm_torch"):
                    continue
                key = (d["config"], d["pass"])
                if d["impl"] in ("dense", "torch_dense"):
                    dense[(key, d["impl"])] = d["tflops"]
                else:
                    rows.setdefault(key, {})[d["impl"]] = d["vs_dense"]
    cols = [i for i in IMPLS if any(i in r for r in rows.values())]
    head = f"{'config':24} {'pass':8} {'dense TF/s':>10} {'torch dense':>11} " + " ".join(f"{c:>19}" for c in cols)
    print("time over one dense GEMM of the same FLOPs (1.00 = as fast; issue 19 asks <= 1.10)")
    print(head)
    for key in sorted(rows):
        kd = dense.get((key, "dense"))
        td = dense.get((key, "torch_dense"))
        kd = "-" if kd is None else f"{kd:.0f}"
        td = "-" if td is None else f"{td:.0f}"
        cells = " ".join(f"{rows[key][c]:19.2f}" if c in rows[key] else f"{'-':>19}" for c in cols)
        print(f"{key[0]:24} {key[1]:8} {kd:>10} {td:>11} {cells}")
    for d in failed:
        print("FAILED CHECK", json.dumps(d))
    return 1 if failed else 0


if __name__ == "__main__":
    if len(sys.argv) < 2:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1:]))
