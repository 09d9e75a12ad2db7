#!/usr/bin/env python3
"""PyTorch peer of bench_grouped_gemm (bench/grouped_gemm.cpp): the same shapes, loads and passes
(forward y = x W_e^T, data gradient dx = dy W_e, weight gradient dW_e = dy_e^T x_e) through
torch._grouped_mm (PyTorch's grouped GEMM, CUTLASS on sm90, bf16), a loop of torch.mm per expert
with host counts (a loop-dispatch MoE), and one dense torch.mm of the same FLOPs per pass.
torch_loop includes the torch.cat/stack of the experts' outputs, as a loop-dispatch MoE pays it.
CUDA events, 5 warm-up runs, median of 20; exit status 1 when a check fails. Skips with a JSON line and exit status 0 when
torch._grouped_mm or a CUDA device is missing.

JSON lines: {"bench": "grouped_gemm_torch_check", "config", "pass", "max_abs_diff", "max_abs_ref", "ok"}
then {"bench": "grouped_gemm_torch", "config", "experts", "topk", "rows", "k", "o", "pass", "impl", "ms",
"tflops", "vs_dense", "layout"} (impl: torch_grouped_mm, torch_loop, torch_dense; layout: the operand
layouts torch._grouped_mm was given, "as_is" or the copy it needed, made outside the timing).
Usage: python3 bench/grouped_gemm_torch_peer.py [config-substring]
"""
import json
import math
import sys

TOKENS = 8192
FAILED_CHECKS = []  # (config, pass) whose torch._grouped_mm product disagreed with the loop's
DEVICE = "cuda"  # a module global so that a check of this script's logic can point it elsewhere
# name, experts, topk, k, o (x [rows, k], w [E, o, k]); as bench/grouped_gemm.cpp
CONFIGS = [
    ("mixtral_e8_top2_fc1", 8, 2, 4096, 2 * 14336),
    ("mixtral_e8_top2_fc2", 8, 2, 14336, 4096),
    ("deepseek_e64_top6_fc1", 64, 6, 2048, 2 * 1408),
    ("deepseek_e64_top6_fc2", 64, 6, 1408, 2048),
    ("qwen3_e128_top8_fc1", 128, 8, 2048, 2 * 768),
    ("qwen3_e128_top8_fc2", 128, 8, 768, 2048),
]


def emit(d):
    print(json.dumps(d), flush=True)


def uneven_offsets(rows, experts):
    """bench/grouped_gemm.cpp's loads: each within +-30% of the mean, the last takes the rounding."""
    off = [0]
    for e in range(experts):
        share = 1.0 + 0.3 * math.sin(1.7 * e + 0.4)
        off.append(off[-1] + int(share * rows / experts))  # C++'s static_cast truncates, as int() does
    off[-1] = rows
    return off


def time_ms(torch, fn):
    """bench/torch_timing.py's timer (every PyTorch peer times alike), with this bench's warm-up and count."""
    from torch_timing import time_ms as timed  # imports torch: only once main() found a usable one
    return timed(fn, warmup=5, reps=20)


def first_working(torch, candidates):
    """The first (layout, fn) whose call runs; torch._grouped_mm accepts some operand layouts only."""
    errors = []
    for layout, make in candidates:
        try:
            fn = make()
            out = fn()
            torch.cuda.synchronize()
            return layout, fn, out
        except (RuntimeError, ValueError) as e:  # a refused layout: try the next
            errors.append(f"{layout}: {str(e).splitlines()[0]}")
    raise RuntimeError("torch._grouped_mm refused every layout: " + " | ".join(errors))


def run(torch, name, experts, topk, k, o):
    rows = TOKENS * topk
    off = uneven_offsets(rows, experts)
    dev = DEVICE
    gen = torch.Generator(device=dev).manual_seed(1)
    x = torch.randn(rows, k, device=dev, dtype=torch.bfloat16, generator=gen)
    w = torch.randn(experts, o, k, device=dev, dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(rows, o, device=dev, dtype=torch.bfloat16, generator=gen)
    ends = torch.tensor(off[1:], device=dev, dtype=torch.int32)  # torch._grouped_mm's offs: group ends
    flops = 2.0 * rows * k * o
    spans = [(off[e], off[e + 1]) for e in range(experts)]

    def loop_forward():
        return torch.cat([x[lo:hi] @ w[e].t() for e, (lo, hi) in enumerate(spans)])

    def loop_dgrad():
        return torch.cat([dy[lo:hi] @ w[e] for e, (lo, hi) in enumerate(spans)])

    def loop_wgrad():
        return torch.stack([dy[lo:hi].t() @ x[lo:hi] for lo, hi in spans])

    # torch._grouped_mm, 2d x 3d (forward, dgrad: offs split mat_a's rows) and 2d x 2d (wgrad: offs
    # split the contracted dimension). Each candidate makes its operands when tried: the views as
    # they are first, then a contiguous copy in the other layout in case the kernel wants that.
    def grouped(a, b):
        return lambda: torch._grouped_mm(a, b, offs=ends)

    passes = [
        ("forward", loop_forward, lambda: x @ w[0].t(), [
            ("as_is", lambda: grouped(x, w.transpose(-2, -1))),
            ("w_t_copied", lambda: grouped(x, w.transpose(-2, -1).contiguous())),
        ]),
        ("dgrad", loop_dgrad, lambda: dy @ w[0], [
            ("as_is", lambda: grouped(dy, w)),
            ("w_copied_column_major", lambda: grouped(dy, w.transpose(-2, -1).contiguous().transpose(-2, -1))),
        ]),
        ("wgrad", loop_wgrad, lambda: dy.t() @ x, [
            ("as_is", lambda: grouped(dy.t(), x)),
            ("dy_t_copied", lambda: grouped(dy.t().contiguous(), x)),
        ]),
    ]
    for pass_name, loop_fn, dense_fn, candidates in passes:
        layout, grouped_fn, out = first_working(torch, candidates)
        ref = loop_fn().float()
        diff = (out.float() - ref).abs().max().item()
        ref_max = ref.abs().max().item()
        ok = math.isfinite(diff) and diff <= 2e-2 * ref_max
        FAILED_CHECKS.extend([] if ok else [(name, pass_name)])
        emit({"bench": "grouped_gemm_torch_check", "config": name, "pass": pass_name, "max_abs_diff": diff,
              "max_abs_ref": ref_max, "ok": ok})
        del out, ref
        dense_ms = time_ms(torch, dense_fn)
        for impl, fn, lay in (("torch_grouped_mm", grouped_fn, layout), ("torch_loop", loop_fn, "as_is"),
                              ("torch_dense", dense_fn, "as_is")):
            ms = dense_ms if impl == "torch_dense" else time_ms(torch, fn)
            emit({"bench": "grouped_gemm_torch", "config": name, "experts": experts, "topk": topk, "rows": rows,
                  "k": k, "o": o, "pass": pass_name, "impl": impl, "ms": ms, "tflops": flops / ms / 1e9,
                  "vs_dense": ms / dense_ms, "layout": lay})
        torch.cuda.empty_cache()


def main():
    try:
        import torch
    except ImportError:
        emit({"bench": "skipped", "reason": "no torch"})
        return 0
    if not hasattr(torch, "_grouped_mm"):
        emit({"bench": "skipped", "reason": f"torch {torch.__version__} has no torch._grouped_mm (PyTorch 2.8+)"})
        return 0
    if not torch.cuda.is_available():
        emit({"bench": "skipped", "reason": "no CUDA device"})
        return 0
    flt = sys.argv[1] if len(sys.argv) > 1 else ""
    chosen = [c for c in CONFIGS if flt in c[0]]
    if not chosen:
        print(f"grouped_gemm_torch_peer: no config matches '{flt}'", file=sys.stderr)
        return 2
    emit({"bench": "grouped_gemm_torch_env", "torch": torch.__version__, "device": torch.cuda.get_device_name()})
    for c in chosen:
        run(torch, *c)
    return 1 if FAILED_CHECKS else 0


if __name__ == "__main__":
    sys.exit(main())
