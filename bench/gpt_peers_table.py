#!/usr/bin/env python3
"""Joins one call's GPT-2 124M speed runs (issue 17) into one table: Kiln's `pretrain-gpt`, the
PyTorch peer (eager and torch.compile), llm.c and Megatron-core, each as ms per step, tokens/s and
Kiln's speed relative to it (Kiln's tokens/s over the peer's: above 1, Kiln is faster), computed
from the files of that call only. Made by `bash tools/gpu-session.sh gptpeers`.

  python3 bench/gpt_peers_table.py --kiln gpt2_kiln_te.txt [--torch gpt_torch_peer.jsonl]
                                   [--llmc llmc_peer.json] [--megatron megatron_peer.json] [--json OUT]

Kiln and Megatron log "elapsed time per iteration (ms)" per window of --log-interval 10 iterations;
for both the median of the windows after the first two is taken (the first two hold start-up,
allocator growth, cuDNN plans, jit compiles). The PyTorch peer and llm.c time each step with CUDA
events (the median after their warm-up steps; see bench/gpt_torch_peer.py and bench/llmc_peer.sh).
A peer whose file is missing or holds an error gets a row saying so, not a number.
"""
import argparse
import json
import os
import re
import statistics
import sys

TOKENS_PER_STEP = 16 * 1024  # micro-batch 16 x T 1024, no accumulation, on every side


def kiln_row(path, impl):
    if not path or not os.path.exists(path):
        return {"name": f"Kiln `pretrain-gpt --transformer-impl {impl}`", "error": f"no log {path}"}
    text = open(path, errors="replace").read()
    windows = [float(m) for m in re.findall(r"elapsed time per iteration \(ms\): ([0-9.]+)", text)]
    name = f"Kiln `pretrain-gpt --transformer-impl {impl}`"
    if len(windows) < 3:
        err = next((ln.strip() for ln in text.splitlines() if "rror" in ln), "")
        return {"name": name, "error": f"{len(windows)} log windows in {os.path.basename(path)} {err}"[:200]}
    ms = statistics.median(windows[2:])
    return {"name": name, "ms": ms, "how": f"median of {len(windows) - 2} windows of 10 after the first two",
            "windows_ms": windows}


def json_lines(path):
    if not path or not os.path.exists(path):
        return []
    out = []
    for line in open(path, errors="replace"):
        line = line.strip()
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                pass
    return out


def torch_rows(path):
    rows = []
    for r in json_lines(path):
        if r.get("shape") != "gpt2-124m":
            continue
        name = f"PyTorch {r.get('torch', '')} {r.get('variant', '?')}".replace("  ", " ")
        if "skipped" in r or "step_s_median" not in r:
            rows.append({"name": name, "error": r.get("skipped", "no timing")})
        else:
            rows.append({"name": name, "ms": r["step_s_median"] * 1e3, "how": "median of 20 steps (CUDA events)"})
    if not rows:
        rows.append({"name": "PyTorch (eager, torch.compile)", "error": f"no gpt2-124m line in {path}"})
    return rows


def peer_row(path, name, how):
    lines = json_lines(path)
    if not lines:
        return {"name": name, "error": f"no result in {path}"}
    r = lines[-1]
    if "error" in r or "ms_per_step" not in r:
        return {"name": name, "error": r.get("error", "no ms_per_step")}
    commit = (r.get("commit") or "")[:10]
    return {"name": f"{name} ({commit})" if commit else name, "ms": r["ms_per_step"], "how": how}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--kiln", required=True, help="pretrain-gpt's log of the 124M steps")
    p.add_argument("--kiln-impl", default="transformer_engine", help="the --transformer-impl of that run")
    p.add_argument("--torch", help="bench/gpt_torch_peer.py's JSON lines")
    p.add_argument("--llmc", help="bench/llmc_peer.sh's JSON line")
    p.add_argument("--megatron", help="bench/megatron_peer.sh's JSON line")
    p.add_argument("--json", help="also write the rows here as JSON")
    a = p.parse_args()

    kiln = kiln_row(a.kiln, a.kiln_impl)
    rows = [kiln] + torch_rows(a.torch)
    rows.append(peer_row(a.llmc, "llm.c train_gpt2cu", "median of steps 11-60 (its CUDA events)"))
    rows.append(peer_row(a.megatron, "Megatron-core pretrain_gpt.py, local impl",
                         "median of windows of 10 after the first two"))
    for r in rows:
        if "ms" in r:
            r["tokens_per_s"] = TOKENS_PER_STEP / (r["ms"] / 1e3)
            if "ms" in kiln:
                r["kiln_speedup"] = r["ms"] / kiln["ms"]  # = Kiln's tokens/s over this row's

    print("GPT-2 124M, B16 T1024, bf16, one H200, one call (Kiln's speed over each: >1 = Kiln faster)\n")
    print("| implementation | ms / step | tokens/s | Kiln vs it | timing |")
    print("|---|---:|---:|---:|---|")
    for r in rows:
        if "ms" not in r:
            print(f"| {r['name']} | - | - | - | did not run: {r['error']} |")
            continue
        ratio = f"{r['kiln_speedup']:.2f}x" if "kiln_speedup" in r else "-"
        print(f"| {r['name']} | {r['ms']:.1f} | {r['tokens_per_s']:,.0f} | {ratio} | {r['how']} |")
    if a.json:
        tmp = a.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(rows, f, indent=1)
        os.replace(tmp, a.json)
    return 0 if "ms" in kiln else 1


if __name__ == "__main__":
    sys.exit(main())
