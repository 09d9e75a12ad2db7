#!/usr/bin/env python3
"""PyTorch peer of bench_attention: torch.nn.functional.scaled_dot_product_attention (whichever
backend PyTorch picks: FlashAttention-2 or cuDNN on an H200) on the same shapes, bfloat16, the
same JSON keys. Tensors are made in Kiln's [B, T, H, D] layout and handed to SDPA as [B, H, T, D]
views, as a model does. Grouped-query shapes use enable_gqa=True where this torch has it, else
k/v repeated per group (reported in "gqa"). FLOPs as bench_attention: forward 4*B*Hq*T*S*D,
halved when causal; fwd+bwd 3.5x. Medians of CUDA-event timings after warm-up.
Run: python3 bench/attention_torch_peer.py [--quick]"""
import json
import sys

import torch
import torch.nn.functional as F

from torch_timing import time_ms




def sdpa_has_gqa():
    """Whether this torch's SDPA takes enable_gqa (2.5+). torch 2.11's SDPA is a builtin without an
    inspectable signature, so ask it: a call on tiny tensors."""
    try:
        q = torch.zeros(1, 2, 4, 8, device="cuda", dtype=torch.bfloat16)
        kv = torch.zeros(1, 1, 4, 8, device="cuda", dtype=torch.bfloat16)
        F.scaled_dot_product_attention(q, kv, kv, enable_gqa=True)
        return True
    except TypeError:
        return False


def main():
    quick = "--quick" in sys.argv[1:]
    cases = [(8, 2048, 16, 16, 64, True), (2, 8192, 16, 16, 128, True), (8, 2048, 16, 4, 64, True),
             (2, 8192, 16, 4, 128, True), (8, 2048, 16, 16, 64, False), (2, 8192, 16, 16, 128, False)]
    if quick:
        cases = [(1, 256, 4, 2, 64, True)]
    has_gqa = sdpa_has_gqa()
    dt = torch.bfloat16
    for B, T, Hq, Hkv, D, causal in cases:
        g = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(B, T, Hq, D, device="cuda", dtype=dt, generator=g)
        k = torch.randn(B, T, Hkv, D, device="cuda", dtype=dt, generator=g)
        v = torch.randn(B, T, Hkv, D, device="cuda", dtype=dt, generator=g)
        dout = torch.randn(B, T, Hq, D, device="cuda", dtype=dt, generator=g)

        for dropout in (0.0, 0.1):  # 0.1: Megatron's default --attention-dropout (bench_attention's dropout rows)

            def sdpa(q, k, v):
                qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
                if Hkv != Hq:
                    if has_gqa:
                        return F.scaled_dot_product_attention(qt, kt, vt, dropout_p=dropout, is_causal=causal,
                                                              enable_gqa=True).transpose(1, 2)
                    kt = kt.repeat_interleave(Hq // Hkv, dim=1)
                    vt = vt.repeat_interleave(Hq // Hkv, dim=1)
                return F.scaled_dot_product_attention(qt, kt, vt, dropout_p=dropout, is_causal=causal).transpose(1, 2)

            with torch.no_grad():
                fwd_ms = time_ms(lambda: sdpa(q, k, v))
            qg, kg, vg = (x.detach().requires_grad_(True) for x in (q, k, v))
            fwd_bwd_ms = time_ms(lambda: sdpa(qg, kg, vg).backward(dout))
            fwd_flops = 4.0 * B * Hq * T * T * D * (0.5 if causal else 1.0)
            common = dict(bench="attention", impl="torch_sdpa" + ("-dropout0.1" if dropout else ""),
                          torch=torch.__version__, dtype="bfloat16", shape=f"B{B} T{T} Hq{Hq} Hkv{Hkv} D{D}",
                          causal=causal,
                          gqa=("enable_gqa" if has_gqa else "repeat_interleave") if Hkv != Hq else "none")
            print(json.dumps(dict(common, **{"pass": "fwd", "ms": fwd_ms, "tflops": fwd_flops / fwd_ms / 1e9})),
                  flush=True)
            bwd = 2.5 * fwd_flops / (fwd_bwd_ms - fwd_ms) / 1e9 if fwd_bwd_ms > fwd_ms else 0.0
            print(json.dumps(dict(common, **{"pass": "fwd_bwd", "ms": fwd_bwd_ms,
                                             "tflops": 3.5 * fwd_flops / fwd_bwd_ms / 1e9, "bwd_tflops": bwd})),
                  flush=True)


if __name__ == "__main__":
    main()
