#!/usr/bin/env python3
"""The FP8 GEMM comparison of one GPU session: bench_fp8_gemm's and torch_peers.py fp8_gemm's JSON
lines in, the issue's two ratios out (Kiln fp8 vs torch._scaled_mm like for like, and Kiln fp8 vs
Kiln bf16). Run: python3 bench/fp8_table.py kiln.jsonl torch.jsonl"""
import json
import sys


def rows(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.startswith("{")]


def main(kiln_path, torch_path):
    k, t = rows(kiln_path), rows(torch_path)
    kiln_bf16 = next(r for r in k if r.get("op") == "bf16_gemm")
    torch_bf16 = next((r for r in t if r.get("op") == "torch_bf16_matmul"), None)
    print(f"{'op':34} {'fast':>5} {'TFLOP/s':>9} {'vs torch':>9} {'vs Kiln bf16':>13}")
    for r in k:
        if r.get("op") != "fp8_gemm" or "tflops" not in r:
            if "error" in r:
                print(f"fp8_gemm {r['scaling']}: not run: {r['error']}")
            continue
        peer = next((p for p in t if p.get("op") == "torch_scaled_mm" and p.get("scaling") == r["scaling"]
                     and p.get("fast_accum") == r["fast_accum"]), None)
        vs_torch = f"{r['tflops'] / peer['tflops']:.3f}" if peer else "-"
        print(f"{'kiln fp8 ' + r['scaling']:34} {str(r['fast_accum']):>5} {r['tflops']:9.1f} {vs_torch:>9} "
              f"{r['tflops'] / kiln_bf16['tflops']:13.2f}")
    for p in t:
        if p.get("op") == "torch_scaled_mm":
            print(f"{'torch._scaled_mm ' + p['scaling']:34} {str(p['fast_accum']):>5} {p['tflops']:9.1f}")
    print(f"{'kiln bf16 gemm':34} {'':>5} {kiln_bf16['tflops']:9.1f}")
    if torch_bf16:
        print(f"{'torch bf16 matmul':34} {'':>5} {torch_bf16['tflops']:9.1f}")
    for r in k:
        if r.get("op") in ("fp8_cast", "fp8_cast_transpose"):
            print(f"{r['op']} {r['dtype']} {r['scaling']:>10}: {r['gbps']:.0f} GB/s (effective, one read + writes)")


if __name__ == "__main__":
    main(*sys.argv[1:3])
