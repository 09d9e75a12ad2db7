#!/usr/bin/env python3
"""PyTorch peer for `kiln pretrain-gpt`'s speed table (issue 17): the same shapes, trained the way a
PyTorch user chasing speed trains them, timed the way Kiln's bench times itself.

  python3 bench/gpt_torch_peer.py [--shapes gpt2-124m,llama-3.2-1b,...] [--variants eager,compile]
                                  [--steps 20] [--warmup 5] [--rounds 1] [--device cuda]
                                  [--dropout P]

The peer at its best: bf16 autocast over fp32 parameters, fused AdamW, F.scaled_dot_product_attention
(flash/cuDNN backends, GQA through enable_gqa where torch has it), TF32 on for the fp32 leftovers,
torch.compile (mode max-autotune-no-cudagraphs; "default" with --compile-mode) as the second variant.
Timing: CUDA events around each full step (forward, backward, clip, optimizer step, zero_grad) after
the warm-up steps, the median over --steps. FLOPs: Megatron-LM's num_floating_point_operations
(megatron/training/training.py, dense transformer, BSHD, causal): per token
  6 * (L * (h*(q + 2*kv) + q*h + h*F*(3 if swiglu else 2)) + h*V) + 6 * q * s * L
with q = heads*kv_channels, kv = groups*kv_channels, so MFU here and Kiln's use one formula.
--dropout P (default 0) sets Megatron's --attention-dropout and --hidden-dropout: SDPA's dropout_p
on the attention probabilities (its fused kernels' own generator), and F.dropout after the
embeddings and on each residual branch (attention projection, MLP), where Megatron's layers apply it.
Prints one JSON line per (shape, variant, round); on a machine without CUDA it runs on the CPU (a
smoke test of the script: Debian's torch 1.13 lacks SDPA and compile, so it falls back and says so).
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

# (layers, hidden, ffn, heads, groups, seq, micro-batch, vocab, style)
SHAPES = {
    "gpt2-124m": dict(L=12, h=768, F=3072, nh=12, ng=12, s=1024, b=16, V=50304, llama=False),
    "gpt-1.3b": dict(L=24, h=2048, F=8192, nh=16, ng=16, s=2048, b=4, V=50304, llama=False),
    "llama-3.2-1b": dict(L=16, h=2048, F=8192, nh=32, ng=8, s=2048, b=4, V=128256, llama=True),
    "llama-3-8b-4layers": dict(L=4, h=4096, F=14336, nh=32, ng=8, s=4096, b=1, V=128256, llama=True),
    "tiny": dict(L=2, h=64, F=256, nh=4, ng=2, s=64, b=2, V=512, llama=True),  # CPU smoke test
}
PEAK_BF16 = {"H200": 989e12, "H100": 989e12, "A100": 312e12}


def flops_per_token(c):
    d = c["h"] // c["nh"]
    q, kv = c["nh"] * d, c["ng"] * d
    per_layer = c["h"] * (q + 2 * kv) + q * c["h"] + c["h"] * c["F"] * (3 if c["llama"] else 2)
    return 6 * (c["L"] * per_layer + c["h"] * c["V"]) + 6 * q * c["s"] * c["L"]


def has_sdpa():
    return hasattr(F, "scaled_dot_product_attention")


def attention(q, k, v, groups_ratio, dropout=0.0):
    # q [b, nh, s, d], k/v [b, ng, s, d]
    if has_sdpa():
        try:
            return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True,
                                                  enable_gqa=groups_ratio > 1)
        except TypeError:  # torch without enable_gqa
            pass
    if groups_ratio > 1:
        k = k.repeat_interleave(groups_ratio, dim=1)
        v = v.repeat_interleave(groups_ratio, dim=1)
    if has_sdpa():
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout, is_causal=True)
    s = q.shape[-2]
    scores = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    mask = torch.ones(s, s, dtype=torch.bool, device=q.device).triu(1)
    return F.dropout(scores.masked_fill(mask, float("-inf")).softmax(-1), dropout) @ v


class RMSNorm(nn.Module):
    def __init__(self, h, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(h))
        self.eps = eps

    def forward(self, x):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


def rope_tables(d, s, base, device):
    inv = 1.0 / (base ** (torch.arange(0, d, 2, device=device).float() / d))
    ang = torch.outer(torch.arange(s, device=device).float(), inv)
    return ang.cos(), ang.sin()


def apply_rope(x, cos, sin):  # rotate-half, x [b, H, s, d]
    d2 = x.shape[-1] // 2
    x1, x2 = x[..., :d2], x[..., d2:]
    c, s = cos.to(x.dtype), sin.to(x.dtype)
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


class Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        h, d = c["h"], c["h"] // c["nh"]
        bias = not c["llama"]
        Norm = (lambda n: RMSNorm(n)) if c["llama"] else (lambda n: nn.LayerNorm(n))
        self.ln1, self.ln2 = Norm(h), Norm(h)
        self.qkv = nn.Linear(h, (c["nh"] + 2 * c["ng"]) * d, bias=bias)
        self.proj = nn.Linear(c["nh"] * d, h, bias=bias)
        self.fc1 = nn.Linear(h, c["F"] * (2 if c["llama"] else 1), bias=bias)
        self.fc2 = nn.Linear(c["F"], h, bias=bias)

    def forward(self, x, cos, sin):
        c = self.c
        b, s, h = x.shape
        d = h // c["nh"]
        qkv = self.qkv(self.ln1(x))
        q, k, v = qkv.split([c["nh"] * d, c["ng"] * d, c["ng"] * d], dim=-1)
        q = q.view(b, s, c["nh"], d).transpose(1, 2)
        k = k.view(b, s, c["ng"], d).transpose(1, 2)
        v = v.view(b, s, c["ng"], d).transpose(1, 2)
        if c["llama"]:
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        p = c.get("dropout", 0.0)
        y = attention(q, k, v, c["nh"] // c["ng"], p).transpose(1, 2).reshape(b, s, c["nh"] * d)
        x = x + F.dropout(self.proj(y), p)
        u = self.fc1(self.ln2(x))
        if c["llama"]:
            gate, up = u.chunk(2, dim=-1)
            u = F.silu(gate) * up
        else:
            u = F.gelu(u, approximate="tanh")
        return x + F.dropout(self.fc2(u), c.get("dropout", 0.0))


class GPT(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["V"], c["h"])
        self.wpe = None if c["llama"] else nn.Embedding(c["s"], c["h"])
        self.blocks = nn.ModuleList(Block(c) for _ in range(c["L"]))
        self.ln_f = RMSNorm(c["h"]) if c["llama"] else nn.LayerNorm(c["h"])
        self.head = nn.Linear(c["h"], c["V"], bias=False)
        if not c["llama"]:
            self.head.weight = self.wte.weight  # tied, as GPT-2
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * c["L"]) if n.endswith(("proj.weight", "fc2.weight")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        s = idx.shape[1]
        x = self.wte(idx)
        if self.wpe is not None:
            x = x + self.wpe(torch.arange(s, device=idx.device))
        x = F.dropout(x, self.c.get("dropout", 0.0))
        cos, sin = rope_tables(self.c["h"] // self.c["nh"], s, 500000.0, idx.device) if self.c["llama"] else (None, None)
        for blk in self.blocks:
            x = blk(x, cos, sin)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))


def time_steps(step, args, device):
    """--warmup steps, then --steps timed ones (CUDA events around each on a GPU, the wall clock on
    the CPU): (last loss, seconds per step, peak memory, device name, its bf16 peak FLOP/s)."""
    for _ in range(args.warmup):
        loss = step()
    times = []
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        for _ in range(args.steps):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            loss = step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        name = torch.cuda.get_device_name()
        return loss, times, torch.cuda.max_memory_allocated(), name, next(
            (v for k, v in PEAK_BF16.items() if k in name), None)
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = step()
        times.append(time.perf_counter() - t0)
    return loss, times, None, "cpu", None


def training_step(model, step_model, c, device):
    """One training step as the peer's users run it: bf16 autocast around step_model (the model, or
    its torch.compile), clip 1.0, fused AdamW over model's parameters (unfused where this torch has
    none), on fixed random tokens of the shape c. Returns (step, whether AdamW is fused)."""
    fused = device.type == "cuda"
    try:
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1, fused=fused)
    except TypeError:  # torch without fused AdamW
        fused = False
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.1)
    gen = torch.Generator(device="cpu").manual_seed(1)
    idx = torch.randint(0, c["V"], (c["b"], c["s"]), generator=gen).to(device)
    tgt = torch.randint(0, c["V"], (c["b"], c["s"]), generator=gen).to(device)

    def step():
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16):
            loss = step_model(idx, tgt)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    return step, fused


def run(shape, variant, args, device):
    c = dict(SHAPES[shape], dropout=args.dropout)
    torch.manual_seed(0)
    model = GPT(c).to(device)
    note = []
    step_model = model
    if variant == "compile":
        if not hasattr(torch, "compile"):
            return {"shape": shape, "variant": variant, "skipped": "this torch has no torch.compile"}
        step_model = torch.compile(model, mode=args.compile_mode)
    step, fused = training_step(model, step_model, c, device)
    loss, times, peak, name, peak_flops = time_steps(step, args, device)
    if not has_sdpa():
        note.append("no scaled_dot_product_attention in this torch: explicit masked softmax")
    if not fused:
        note.append("AdamW not fused")
    t = statistics.median(times)
    tokens = c["b"] * c["s"]
    tflops = flops_per_token(c) * tokens / t / 1e12
    return {
        "bench": "gpt_step", "peer": "pytorch", "torch": torch.__version__, "device": name, "shape": shape,
        "variant": variant + ("" if variant == "eager" else f":{args.compile_mode}"), "batch": c["b"],
        "seq": c["s"], "dropout": args.dropout, "step_s_median": t, "step_s_min": min(times), "step_s_max": max(times),
        "tokens_per_s": tokens / t, "tflops": tflops,
        "mfu": (tflops * 1e12 / peak_flops) if peak_flops else None,
        "peak_memory_gib": peak / 2**30 if peak is not None else None,
        "loss": float(loss), "flops_formula": "megatron num_floating_point_operations (dense, causal)",
        "notes": note,
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default="gpt2-124m,gpt-1.3b,llama-3.2-1b,llama-3-8b-4layers")
    p.add_argument("--variants", default="eager,compile")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--compile-mode", default="max-autotune-no-cudagraphs")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dropout", type=float, default=0.0,
                   help="attention and hidden dropout (Megatron's --attention-dropout / --hidden-dropout)")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    for shape in args.shapes.split(","):
        if shape not in SHAPES:
            sys.exit(f"gpt_torch_peer.py: unknown shape '{shape}' (known: {', '.join(SHAPES)})")
    for r in range(args.rounds):
        for shape in args.shapes.split(","):
            for variant in args.variants.split(","):
                out = run(shape, variant, args, device)
                out["round"] = r
                print(json.dumps(out), flush=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
