#!/usr/bin/env python3
"""Joins one call's runs of issue 19's MoE speed row (tools/gpu-session.sh moepeers) into a table:
Kiln's `pretrain-gpt` on the MoE layer stack (8 layers, hidden 2048, 8 experts top-2), PyTorch
(bench/moe_torch_peer.py: loop dispatch and torch._grouped_mm) and Megatron-core (bench/megatron_peer.sh
with MEGATRON_SHAPE=moe-8x2-d2048), as ms a step, tokens/s, MFU, and Kiln's speed over each peer's.

  python3 bench/moe_peers_table.py --kiln moe_kiln.txt [--torch moe_torch_peer.jsonl]
                                   [--megatron megatron_peer.json] [--json OUT]

Kiln and Megatron: the median of their log windows of 10 iterations after the first two; PyTorch:
the median of its CUDA-event step times. MFU on the bf16 dense peak (989 TFLOP/s for the H100 and
H200) with the FLOPs of Megatron's formula, a MoE MLP counted as its top-2 experts (Kiln's log and
moe_torch_peer.py use it). A peer whose file is missing or holds an error gets a row saying so.
"""
import argparse
import json
import os
import re
import statistics

TOKENS_PER_STEP = 4 * 2048
PEAK = 989e12


def flops_per_token():
    h, nh, ng, s, F, k, L, V = 2048, 16, 4, 2048, 4096, 2, 8, 32000
    d = h // nh
    q, kv = nh * d, ng * d
    return 6 * (L * (h * (q + 2 * kv) + q * s + q * h + h * F * k * 3) + h * V)


def log_row(name, path):
    if not path or not os.path.exists(path):
        return {"name": name, "error": f"no log {path}"}
    text = open(path, errors="replace").read()
    windows = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
    if len(windows) < 3:
        err = next((ln.strip() for ln in text.splitlines() if "rror" in ln), "")
        return {"name": name, "error": f"{len(windows)} log windows in {os.path.basename(path)} {err}"[:200]}
    return {"name": name, "ms": statistics.median(windows[2:]),
            "how": f"median of {len(windows) - 2} windows of 10 after the first two"}


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--kiln", required=True)
    p.add_argument("--torch")
    p.add_argument("--megatron")
    p.add_argument("--json")
    a = p.parse_args()
    rows = [log_row("Kiln `pretrain-gpt --transformer-impl transformer_engine --moe-grouped-gemm`", a.kiln)]
    if a.torch and os.path.exists(a.torch):
        for line in open(a.torch):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            name = f"PyTorch {r.get('torch', '')} eager, {r.get('dispatch')} dispatch"
            rows.append({"name": name, "error": r["skipped"]} if "skipped" in r else
                        {"name": name, "ms": r["step_s_median"] * 1e3, "how": "median of its CUDA-event steps",
                         "peak_gib": r.get("peak_memory_gib")})
    else:
        rows.append({"name": "PyTorch", "error": f"no file {a.torch}"})
    if a.megatron and os.path.exists(a.megatron):
        r = json.loads(open(a.megatron).read().splitlines()[-1])
        name = f"Megatron-core {r.get('commit', '')[:10]} local (SequentialMLP)"
        rows.append({"name": name, "error": r["error"]} if "error" in r else
                    {"name": name, "ms": r["ms_per_step"], "how": r.get("timed_windows", "")})
    else:
        rows.append({"name": "Megatron-core", "error": f"no file {a.megatron}"})
    fpt = flops_per_token()
    kiln_ms = rows[0].get("ms")
    print("| implementation | ms / step | tokens/s | MFU | Kiln vs it | how |")
    print("|---|---:|---:|---:|---:|---|")
    for r in rows:
        if "ms" not in r:
            print(f"| {r['name']} | - | - | - | - | did not run: {r['error']} |")
            continue
        tps = TOKENS_PER_STEP / (r["ms"] / 1e3)
        r["tokens_per_s"], r["mfu"] = tps, fpt * tps / PEAK
        ratio = f"{r['ms'] / kiln_ms:.2f}x" if kiln_ms else "-"
        print(f"| {r['name']} | {r['ms']:.1f} | {tps:,.0f} | {100 * r['mfu']:.1f}% | {ratio} | {r['how']} |")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"flops_per_token": fpt, "tokens_per_step": TOKENS_PER_STEP, "rows": rows}, f)


if __name__ == "__main__":
    main()
