#!/usr/bin/env python3
"""PyTorch peers of bench/te_fused.cpp: the same ops at the same bf16 shapes, eager and with
torch.compile (which fuses the elementwise chains as Kiln's kernels do), timed with CUDA events
after warm-up (median). Prints JSON lines with bench/te_fused's keys ("impl": "torch_eager" or
"torch_compile"). Usage: python3 bench/te_fused_torch_peer.py [--no-compile]
"""
import json
import math
import sys

import torch
import torch.nn.functional as F

from torch_timing import time_ms

PEAK_BYTES_PER_SECOND = 4.8e12




def emit(impl, op, shape, ms, bytes_moved=None, flops=None):
    row = {"bench": "te_fused", "impl": impl, "op": op, "dtype": "bfloat16", "shape": shape, "ms": ms}
    if bytes_moved is not None:
        gbps = bytes_moved / (ms * 1e-3) / 1e9
        row.update(gbps=gbps, fraction_of_peak_bw=gbps * 1e9 / PEAK_BYTES_PER_SECOND)
    if flops is not None:
        row["tflops"] = flops / (ms * 1e-3) / 1e12
    print(json.dumps(row), flush=True)


def add_rms_norm(x, r, w, eps=1e-5):
    s = x + r
    sf = s.float()
    return (sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + eps)).to(s.dtype) * w, s


def add_layer_norm(x, r, w, b, eps=1e-5):
    s = x + r
    return F.layer_norm(s, (s.shape[-1],), w, b, eps), s


def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(q, cos, sin):  # Hugging Face Llama's apply_rotary_pos_emb
    return q * cos + rotate_half(q) * sin


def swiglu(x):
    g, u = torch.chunk(x, 2, dim=-1)
    return F.silu(g) * u


def linear_cross_entropy(h, w, labels):  # what Megatron's local path does: full logits, f32 CE
    return F.cross_entropy(F.linear(h, w).float(), labels)


def linear_bias_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def gelu_mlp(x, w1, b1, w2, b2):
    return F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)


def main():
    compile_too = "--no-compile" not in sys.argv
    dev, bf = "cuda", torch.bfloat16
    n, h = 8192, 4096
    e = 2
    impls = [("torch_eager", lambda f: f)]
    if compile_too:
        impls.append(("torch_compile", torch.compile))
    for impl, wrap in impls:
        x, r = torch.randn(n, h, device=dev, dtype=bf), torch.randn(n, h, device=dev, dtype=bf)
        w, b = torch.randn(h, device=dev, dtype=bf), torch.randn(h, device=dev, dtype=bf)
        io = 4.0 * n * h * e
        for name, fn, args in (("add_rms_norm", add_rms_norm, (x, r, w)), ("add_layer_norm", add_layer_norm, (x, r, w, b))):
            f = wrap(fn)
            emit(impl, name + "_forward", "8192x4096", time_ms(lambda: f(*args)), io)
            xs = [a.detach().clone().requires_grad_(True) for a in args]
            gy, gs = torch.randn(n, h, device=dev, dtype=bf), torch.randn(n, h, device=dev, dtype=bf)

            def fwd_bwd():
                y, s = f(*xs)
                torch.autograd.backward((y, s), (gy, gs))

            emit(impl, name + "_forward_backward", "8192x4096", time_ms(fwd_bwd), 2 * io)

        q = torch.randn(2, 4096, 32, 128, device=dev, dtype=bf)
        inv = 1.0 / (500000.0 ** (torch.arange(0, 128, 2, device=dev).float() / 128))
        freqs = torch.outer(torch.arange(4096, device=dev).float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos()[None, :, None, :].to(bf), emb.sin()[None, :, None, :].to(bf)
        f = wrap(apply_rope)
        emit(impl, "apply_rope", "2x4096x32x128", time_ms(lambda: f(q, cos, sin)), 2.0 * q.numel() * e)

        ff = 14336
        xg = torch.randn(n, 2 * ff, device=dev, dtype=bf)
        f = wrap(swiglu)
        emit(impl, "swiglu_forward", "8192x28672", time_ms(lambda: f(xg)), 3.0 * n * ff * e)

        v = 128256
        hid = torch.randn(n, h, device=dev, dtype=bf, requires_grad=True)
        wv = (torch.randn(v, h, device=dev, dtype=bf) * 0.02).requires_grad_(True)
        labels = torch.zeros(n, device=dev, dtype=torch.long)
        f = wrap(linear_cross_entropy)

        def ce_fwd_bwd():
            f(hid, wv, labels).backward()

        try:
            emit(impl, "linear_cross_entropy_forward_backward", "8192x4096->128256", time_ms(ce_fwd_bwd, 2, 5),
                 flops=3 * 2.0 * n * v * h)
        except torch.cuda.OutOfMemoryError:
            print(json.dumps({"bench": "te_fused", "impl": impl, "op": "linear_cross_entropy_forward_backward",
                              "error": "out of memory"}), flush=True)
        del hid, wv
        torch.cuda.empty_cache()

        tokens, din, dout = 16384, 768, 3072
        xl = torch.randn(tokens, din, device=dev, dtype=bf)
        wl = torch.randn(dout, din, device=dev, dtype=bf) * 0.02
        bl = torch.randn(dout, device=dev, dtype=bf)
        f = wrap(linear_bias_gelu)
        emit(impl, "linear_bias_gelu_forward", "16384x768->3072", time_ms(lambda: f(xl, wl, bl)),
             flops=2.0 * tokens * din * dout)

        params = [xl.clone().requires_grad_(True), wl.clone().requires_grad_(True), bl.clone().requires_grad_(True),
                  (torch.randn(din, dout, device=dev, dtype=bf) * 0.02).requires_grad_(True),
                  torch.randn(din, device=dev, dtype=bf).requires_grad_(True)]
        g = torch.randn(tokens, din, device=dev, dtype=bf)
        mlp = wrap(gelu_mlp)

        def mlp_fwd_bwd():
            (mlp(*params) * g).sum().backward()

        emit(impl, "linear_gelu_linear_forward_backward", "16384x768->3072->768", time_ms(mlp_fwd_bwd),
             flops=6 * 2.0 * tokens * din * dout)


if __name__ == "__main__":
    main()
