#!/usr/bin/env python3
"""PyTorch peers of the Kiln GPU benchmarks: the same shapes and JSON keys (bench, op, dtype, shape,
ms, ...), timed with torch.cuda events after warm-up (medians), so gpu_foundation.sh can print
Kiln/PyTorch ratios. Precision matches Kiln's defaults: f32 matmul/conv in true FP32 unless
KILN_ALLOW_TF32=1 (then TF32 in both). Run: python3 bench/torch_peers.py [bench ...]"""
import json
import os
import sys
import time

import torch

from torch_timing import time_ms

DEV = "cuda"
TF32 = os.environ.get("KILN_ALLOW_TF32", "0") not in ("", "0")
torch.backends.cuda.matmul.allow_tf32 = TF32
torch.backends.cudnn.allow_tf32 = TF32
torch.backends.cudnn.benchmark = True




def emit(**kw):
    print(json.dumps(kw), flush=True)


def dtname(t):
    return {torch.float32: "float32", torch.bfloat16: "bfloat16"}[t]


def op_overhead(rounds=7):
    """Host cost of a tiny add, as bench_op_overhead measures it: 20,000 back-to-back launches
    (us_per_op_host), and bursts of 256 with an untimed sync between them so the launch queue never
    fills (us_per_op_host_burst); medians over `rounds`."""
    n, burst, bursts = 20000, 256, 64
    for grad in (False, True):
        a = torch.ones(16, device=DEV, requires_grad=grad)
        b = torch.ones(16, device=DEV)
        for _ in range(1000):
            torch.add(a, b)
        torch.cuda.synchronize()
        host, total, short = [], [], []
        for _ in range(rounds):
            t0 = time.perf_counter()
            for _ in range(n):
                torch.add(a, b)
            t1 = time.perf_counter()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            host.append((t1 - t0) / n * 1e6)
            total.append((t2 - t0) / n * 1e6)
            us = 0.0
            for _ in range(bursts):
                s0 = time.perf_counter()
                for _ in range(burst):
                    torch.add(a, b)
                us += time.perf_counter() - s0
                torch.cuda.synchronize()
            short.append(us / (burst * bursts) * 1e6)
        med = lambda v: sorted(v)[len(v) // 2]
        emit(bench="op_overhead", op="add_autograd" if grad else "add", dtype="float32", shape="16",
             us_per_op_host=med(host), us_per_op=med(total), us_per_op_host_burst=med(short))


def bandwidth():
    n = (256 << 20) // 4
    b1 = n * 4
    a = torch.rand(n, device=DEV)
    b = torch.rand(n, device=DEV)
    out = torch.empty(n, device=DEV)
    copy_ms = time_ms(lambda: out.copy_(a))
    copy_gbps = 2 * b1 / copy_ms / 1e6
    emit(bench="bandwidth", op="copy", dtype="float32", shape=str(n), ms=copy_ms, gbps=copy_gbps, pct_copy=100.0)
    s = torch.empty((), device=DEV)
    cases = [("add", 3 * b1, lambda: torch.add(a, b, out=out)),
             ("mul", 3 * b1, lambda: torch.mul(a, b, out=out)),
             ("relu", 2 * b1, lambda: torch.clamp_min(a, 0, out=out)),
             ("sum", b1, lambda: torch.sum(a, out=s))]
    for name, nbytes, fn in cases:
        ms = time_ms(fn)
        g = nbytes / ms / 1e6
        emit(bench="bandwidth", op=name, dtype="float32", shape=str(n), ms=ms, gbps=g, pct_copy=100 * g / copy_gbps)
    ah, bh = a.bfloat16(), b.bfloat16()
    oh = torch.empty(n, device=DEV, dtype=torch.bfloat16)
    ms = time_ms(lambda: torch.add(ah, bh, out=oh))
    g = 1.5 * b1 / ms / 1e6
    emit(bench="bandwidth", op="add", dtype="bfloat16", shape=str(n), ms=ms, gbps=g, pct_copy=100 * g / copy_gbps)
    bias = torch.rand(1024, device=DEV)
    a2, o2 = a.view(-1, 1024), out.view(-1, 1024)
    ms = time_ms(lambda: torch.add(a2, bias, out=o2))
    g = 2 * b1 / ms / 1e6
    emit(bench="bandwidth", op="add_bias", dtype="float32", shape=str(n), ms=ms, gbps=g, pct_copy=100 * g / copy_gbps)


def matmul():
    for t in (torch.bfloat16, torch.float32):
        for n in (4096, 8192):
            a = torch.randn(n, n, device=DEV, dtype=t)
            b = torch.randn(n, n, device=DEV, dtype=t)
            c = torch.empty(n, n, device=DEV, dtype=t)
            ms = time_ms(lambda: torch.matmul(a, b, out=c))
            emit(bench="matmul", op="matmul", dtype=dtname(t), shape=f"{n}x{n}x{n}", ms=ms,
                 tflops=2.0 * n ** 3 / ms / 1e9)


def conv():
    shapes = [(3, 64, 32, 1), (64, 64, 32, 1), (64, 128, 32, 2), (128, 128, 16, 1),
              (128, 256, 16, 2), (256, 256, 8, 1), (256, 512, 8, 2), (512, 512, 4, 1)]
    n = 128
    for t in (torch.float32, torch.bfloat16):
        for cin, cout, hw, stride in shapes:
            x = torch.randn(n, cin, hw, hw, device=DEV, dtype=t, requires_grad=True)
            w = torch.randn(cout, cin, 3, 3, device=DEV, dtype=t, requires_grad=True)
            with torch.no_grad():  # the op alone, as Kiln's ops::conv2d: no autograd record
                fwd = time_ms(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=1))
            y = torch.nn.functional.conv2d(x, w, stride=stride, padding=1)
            gy = torch.randn_like(y)

            def bwd():
                torch.ops.aten.convolution_backward(gy, x, w, None, [stride, stride], [1, 1], [1, 1], False,
                                                    [0, 0], 1, [True, True, False])
            bms = time_ms(bwd)
            oh = (hw + 2 - 3) // stride + 1
            flops = 2.0 * n * cout * oh * oh * cin * 9
            shape = f"{n}x{cin}x{hw}->{cout}/s{stride}"
            emit(bench="conv", op="conv2d_fwd", dtype=dtname(t), shape=shape, ms=fwd, tflops=flops / fwd / 1e9)
            emit(bench="conv", op="conv2d_bwd", dtype=dtname(t), shape=shape, ms=bms, tflops=2 * flops / bms / 1e9)
            emit(bench="conv", op="conv2d_fwd_bwd", dtype=dtname(t), shape=shape, ms=fwd + bms)


def adamw():
    per, k = 1_000_000, 100
    params = [torch.nn.Parameter(torch.randn(per, device=DEV)) for _ in range(k)]
    for p in params:
        p.grad = torch.randn(per, device=DEV)
    opt = torch.optim.AdamW(params, lr=1e-3, weight_decay=0.01, fused=True)
    ms = time_ms(opt.step, 3, 20)
    emit(bench="adamw", op="adamw_fused", dtype="float32", shape="100x1000000", ms=ms,
         gbps=7.0 * 4 * per * k / ms / 1e6)


def fp8_gemm():
    """bench_fp8_gemm's peer: torch._scaled_mm at 8192^3, e4m3 x e4m3 -> bf16 with per-tensor scales
    (x [M, K] row-major times w [N, K]^T, the column-major operand _scaled_mm wants), with and
    without fast accumulation, and torch's bf16 matmul in the same orientation."""
    n = 8192
    x = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    w = torch.randn(n, n, device=DEV, dtype=torch.bfloat16)
    f8 = torch.float8_e4m3fn
    sx = (448.0 / x.abs().max().float()).reshape(())
    sw = (448.0 / w.abs().max().float()).reshape(())
    qx, qw = (x.float() * sx).to(f8), (w.float() * sw).to(f8)
    ix, iw = sx.reciprocal(), sw.reciprocal()
    out = torch.empty(n, n, device=DEV, dtype=torch.bfloat16)
    shape = f"{n}x{n}x{n}"
    for fast in (False, True):
        ms = time_ms(lambda: torch._scaled_mm(qx, qw.t(), scale_a=ix, scale_b=iw, out_dtype=torch.bfloat16,
                                              use_fast_accum=fast, out=out), 5, 20)
        emit(bench="fp8_gemm", op="torch_scaled_mm", dtype="e4m3xe4m3->bfloat16", scaling="per_tensor",
             fast_accum=fast, shape=shape, ms=ms, tflops=2.0 * n ** 3 / ms / 1e9, torch=torch.__version__)
    ms = time_ms(lambda: torch.matmul(x, w.t(), out=out), 5, 20)
    emit(bench="fp8_gemm", op="torch_bf16_matmul", dtype="bfloat16", shape=shape, ms=ms,
         tflops=2.0 * n ** 3 / ms / 1e9)


ALL = {"op_overhead": op_overhead, "bandwidth": bandwidth, "matmul": matmul, "conv": conv, "adamw": adamw, "fp8_gemm": fp8_gemm}

if __name__ == "__main__":
    names = sys.argv[1:] or list(ALL)
    for name in names:
        ALL[name]()
