#!/usr/bin/env python3
"""PyTorch peer of issue 19's MoE speed row: the MoE layer stack (8 layers, hidden 2048, 8 experts top-2)
trained as a PyTorch user would, timed as bench/gpt_torch_peer.py times the dense shapes.

  python3 bench/moe_torch_peer.py [--dispatch loop,grouped] [--steps 20] [--warmup 5] [--rounds 1]
                                  [--shape moe-8x2-d2048|tiny] [--device cuda]

The shape ("moe-8x2-d2048", the same flags as tools/gpu-session.sh's moepeers stage gives `kiln
pretrain-gpt` and Megatron-core): 8 layers, hidden 2048, 16 heads in 4 query groups (head dim 128),
RoPE, RMSNorm, no biases, untied output, vocabulary 32000, T 2048, micro-batch 4 (8192 tokens a
step); every layer's MLP is 8 SwiGLU experts of width 4096 with a softmax top-2 router (the top-2
probabilities as the combine weights, as Megatron's default without --moe-router-pre-softmax) and
Switch-style load-balancing loss (coefficient 1e-2). bf16 autocast over fp32 parameters, fused
AdamW, SDPA (flash/cuDNN) with GQA, TF32 on.

Dispatch variants:
  loop     the experts in a Python loop: each expert gathers its tokens (index_select), runs its
           three GEMMs and adds the weighted result back (index_add_); what the issue's anchor
           (15.3% MFU, 41.8k tokens/s on 2026-12-01) measured.
  grouped  tokens sorted by expert and the experts' GEMMs as torch._grouped_mm (one CUTLASS kernel
           per product, PyTorch 2.8+ on sm90), PyTorch at its best; skipped where it is missing.
FLOPs: Megatron's formula with a MoE layer's MLP counted as its top-k experts (src/kiln/models/
gpt_config.cpp flops_per_token, the same as `kiln pretrain-gpt` logs), so the MFU columns compare.
Prints one JSON line per (dispatch, round).
"""
import argparse
import json
import math
import statistics
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

# The dense peer's attention, norm, RoPE, training step and its timing (bench/ is the script's own directory).
from gpt_torch_peer import RMSNorm, apply_rope, attention, rope_tables, time_steps, training_step

SHAPES = {
    "moe-8x2-d2048": dict(L=8, h=2048, nh=16, ng=4, s=2048, b=4, V=32000, E=8, k=2, F=4096),
    "tiny": dict(L=2, h=64, nh=4, ng=2, s=32, b=2, V=256, E=4, k=2, F=96),  # CPU smoke test
}
AUX_COEFF = 1e-2


def flops_per_token(c):
    d = c["h"] // c["nh"]
    q, kv = c["nh"] * d, c["ng"] * d
    attention = c["h"] * (q + 2 * kv) + q * c["s"] + q * c["h"]
    moe_mlp = c["h"] * c["F"] * c["k"] * 3
    return 6 * (c["L"] * (attention + moe_mlp) + c["h"] * c["V"])


def has_grouped_mm():
    return hasattr(torch, "_grouped_mm")


class MoE(nn.Module):
    """Softmax top-k router and E SwiGLU experts, the expert weights stacked [E, ...] so both
    dispatch variants use the same parameters."""

    def __init__(self, c, dispatch):
        super().__init__()
        self.c, self.dispatch = c, dispatch
        h, f, e = c["h"], c["F"], c["E"]
        self.router = nn.Linear(h, e, bias=False)
        # [out, in] per expert as nn.Linear keeps it; torch._grouped_mm takes the transposed views
        # (column-major [E, in, out]), the layout bench/grouped_gemm_torch_peer.py found it runs as is.
        self.w1 = nn.Parameter(torch.empty(e, 2 * f, h))  # gate and up
        self.w2 = nn.Parameter(torch.empty(e, h, f))

    def forward(self, x):
        c = self.c
        n, h = x.shape
        logits = self.router(x).float()
        probs = logits.softmax(-1)
        top_p, top_e = probs.topk(c["k"], dim=-1)  # [n, k]
        # Switch-style load balancing: E * sum_e (fraction routed to e) * (mean prob of e).
        load = torch.zeros(c["E"], device=x.device).scatter_add_(
            0, top_e.reshape(-1), torch.ones(n * c["k"], device=x.device)) / (n * c["k"])
        aux = c["E"] * (load * probs.mean(0)).sum() * AUX_COEFF
        flat_e = top_e.reshape(-1)
        flat_tok = torch.arange(n, device=x.device).repeat_interleave(c["k"])
        flat_w = top_p.reshape(-1).to(x.dtype)
        out = torch.zeros_like(x)
        if self.dispatch == "loop":
            for e in range(c["E"]):
                sel = (flat_e == e).nonzero(as_tuple=True)[0]
                if sel.numel() == 0:
                    continue
                tok = flat_tok[sel]
                u = x.index_select(0, tok) @ self.w1[e].to(x.dtype).t()
                gate, up = u.chunk(2, dim=-1)
                y = (F.silu(gate) * up) @ self.w2[e].to(x.dtype).t()
                out.index_add_(0, tok, y * flat_w[sel, None])
        else:  # grouped: one sort, then torch._grouped_mm over the experts' row blocks
            order = flat_e.argsort(stable=True)
            tok = flat_tok[order]
            counts = torch.bincount(flat_e, minlength=c["E"])
            offs = counts.cumsum(0).to(torch.int32)
            xs = x.index_select(0, tok)
            u = torch._grouped_mm(xs, self.w1.to(x.dtype).transpose(-2, -1), offs=offs)
            gate, up = u.chunk(2, dim=-1)
            y = torch._grouped_mm((F.silu(gate) * up).contiguous(), self.w2.to(x.dtype).transpose(-2, -1), offs=offs)
            out.index_add_(0, tok, y * flat_w[order, None])
        return out, aux


class Block(nn.Module):
    def __init__(self, c, dispatch):
        super().__init__()
        self.c = c
        h, d = c["h"], c["h"] // c["nh"]
        self.ln1, self.ln2 = RMSNorm(h), RMSNorm(h)
        self.qkv = nn.Linear(h, (c["nh"] + 2 * c["ng"]) * d, bias=False)
        self.proj = nn.Linear(c["nh"] * d, h, bias=False)
        self.moe = MoE(c, dispatch)

    def forward(self, x, cos, sin):
        c = self.c
        b, s, h = x.shape
        d = h // c["nh"]
        q, k, v = self.qkv(self.ln1(x)).split([c["nh"] * d, c["ng"] * d, c["ng"] * d], dim=-1)
        q = apply_rope(q.view(b, s, c["nh"], d).transpose(1, 2), cos, sin)
        k = apply_rope(k.view(b, s, c["ng"], d).transpose(1, 2), cos, sin)
        v = v.view(b, s, c["ng"], d).transpose(1, 2)
        y = attention(q, k, v, c["nh"] // c["ng"]).transpose(1, 2).reshape(b, s, c["nh"] * d)
        x = x + self.proj(y)
        m, aux = self.moe(self.ln2(x).reshape(b * s, h))
        return x + m.view(b, s, h), aux


class MoeGPT(nn.Module):
    def __init__(self, c, dispatch):
        super().__init__()
        self.c = c
        self.wte = nn.Embedding(c["V"], c["h"])
        self.blocks = nn.ModuleList(Block(c, dispatch) for _ in range(c["L"]))
        self.ln_f = RMSNorm(c["h"])
        self.head = nn.Linear(c["h"], c["V"], bias=False)
        for n, p in self.named_parameters():
            if p.dim() >= 2:
                std = 0.02 / math.sqrt(2 * c["L"]) if n.endswith(("proj.weight", "w2")) else 0.02
                nn.init.normal_(p, 0.0, std)

    def forward(self, idx, targets):
        s = idx.shape[1]
        x = self.wte(idx)
        cos, sin = rope_tables(self.c["h"] // self.c["nh"], s, 10000.0, idx.device)
        aux_total = 0.0
        for blk in self.blocks:
            x, aux = blk(x, cos, sin)
            aux_total = aux_total + aux
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1)) + aux_total


def run(shape, dispatch, args, device):
    c = SHAPES[shape]
    if dispatch == "grouped" and (not has_grouped_mm() or device.type != "cuda"):
        return {"bench": "moe_step", "peer": "pytorch", "dispatch": dispatch,
                "skipped": "torch._grouped_mm needs PyTorch 2.8+ on a CUDA sm90 device"}
    torch.manual_seed(0)
    model = MoeGPT(c, dispatch).to(device)
    step, fused = training_step(model, model, c, device)
    loss, times, peak, name, peak_flops = time_steps(step, args, device)
    t = statistics.median(times)
    tokens = c["b"] * c["s"]
    tflops = flops_per_token(c) * tokens / t / 1e12
    return {
        "bench": "moe_step", "peer": "pytorch", "torch": torch.__version__, "device": name, "shape": shape,
        "dispatch": dispatch, "fused_adamw": fused, "step_s_median": t, "step_s_min": min(times),
        "step_s_max": max(times), "tokens_per_s": tokens / t, "tflops": tflops,
        "mfu": (tflops * 1e12 / peak_flops) if peak_flops else None,
        "peak_memory_gib": peak / 2**30 if peak is not None else None, "loss": float(loss),
        "flops_formula": "megatron num_floating_point_operations, MoE MLP as its top-k experts",
    }


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shape", default="moe-8x2-d2048", choices=sorted(SHAPES))
    p.add_argument("--dispatch", default="loop,grouped")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    for d in args.dispatch.split(","):
        if d not in ("loop", "grouped"):
            sys.exit(f"moe_torch_peer.py: unknown dispatch '{d}' (loop, grouped)")
    for r in range(args.rounds):
        for d in args.dispatch.split(","):
            out = run(args.shape, d, args, device)
            out["round"] = r
            print(json.dumps(out), flush=True)
            if device.type == "cuda":
                torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
