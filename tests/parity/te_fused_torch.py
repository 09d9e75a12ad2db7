#!/usr/bin/env python3
"""PyTorch reference for tests/te/torch_parity_test.cpp (te/'s fused kernels).

Usage: te_fused_torch.py DIR. Reads DIR/inputs.json ({name: {"shape": [...], "values": [...]}}),
computes each op the way PyTorch / Hugging Face do (float64, forward and backward), and writes
DIR/outputs.json ({name: [values]}). Hugging Face's Llama-3 RoPE frequencies are computed as
transformers computes them (float32 torch ops). Exit status 0 on success.
"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

DIR = sys.argv[1]
with open(os.path.join(DIR, "inputs.json")) as f:
    IN = json.load(f)
OUT = {}


def t(name, grad=False, dtype=torch.float64):
    x = torch.tensor(IN[name]["values"], dtype=dtype).reshape(IN[name]["shape"])
    return x.requires_grad_(grad) if grad else x


def put(name, x):
    OUT[name] = x.detach().to(torch.float64).reshape(-1).tolist()


# add + RMSNorm / LayerNorm: loss = sum(y * gy) + sum(s * gs), s = x + r.
for kind in ("rms", "layer"):
    x, r, w, b = t("norm_x", True), t("norm_r", True), t("norm_w", True), t("norm_b", True)
    s = x + r
    if kind == "rms":
        y = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    else:
        y = F.layer_norm(s, (s.shape[-1],), w, b, 1e-5)
    ((y * t("norm_gy")).sum() + (s * t("norm_gs")).sum()).backward()
    put(kind + "_y", y)
    put(kind + "_s", s)
    put(kind + "_dx", x.grad)
    put(kind + "_dr", r.grad)
    put(kind + "_dw", w.grad)
    if kind == "layer":
        put(kind + "_db", b.grad)


# Hugging Face's _compute_llama3_parameters (transformers.modeling_rope_utils), float32 as there.
def hf_llama3_inv_freq(dim, base, factor, low_freq_factor=1.0, high_freq_factor=4.0, old_context_len=8192):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.int64).float() / dim))
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


put("hf_inv_freq", hf_llama3_inv_freq(128, 500000.0, 8.0))


# Hugging Face Llama's apply_rotary_pos_emb (rotate_half), with cos/sin the table's rows.
def rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


x = t("rope_x", True)  # [B, T, H, D]
offset = int(IN["rope_offset"]["values"][0])
T = x.shape[1]
cos = t("rope_cos")[offset:offset + T]
sin = t("rope_sin")[offset:offset + T]
cos = torch.cat((cos, cos), dim=-1)[None, :, None, :]
sin = torch.cat((sin, sin), dim=-1)[None, :, None, :]
y = x * cos + rotate_half(x) * sin
(y * t("rope_g")).sum().backward()
put("rope_y", y)
put("rope_dx", x.grad)

# SwiGLU on Megatron's fc1 layout.
x = t("glu_x", True)
g, u = torch.chunk(x, 2, dim=-1)
y = F.silu(g) * u
(y * t("glu_g")).sum().backward()
put("glu_y", y)
put("glu_dx", x.grad)

# Linear cross-entropy: Megatron's sum(CE * mask) / sum(mask), ignore_index -100 as masked.
h, w = t("ce_h", True), t("ce_w", True)
labels = t("ce_labels", dtype=torch.int64)
mask = t("ce_mask") * (labels != -100).to(torch.float64)
ce = F.cross_entropy(F.linear(h, w), labels, reduction="none", ignore_index=-100)
loss = (ce * mask).sum() / mask.sum()
loss.backward()
put("ce_loss", loss)
put("ce_dh", h.grad)
put("ce_dw", w.grad)

# Linear + bias + GELU (tanh).
x, w, b = t("gelu_x", True), t("gelu_w", True), t("gelu_b", True)
y = F.gelu(F.linear(x, w, b), approximate="tanh")
(y * t("gelu_g")).sum().backward()
put("gelu_y", y)
put("gelu_dx", x.grad)
put("gelu_dw", w.grad)
put("gelu_db", b.grad)

# GPT-2's MLP: fc2(gelu_tanh(fc1(x))).
x, w1, b1 = t("mlp_x", True), t("mlp_w1", True), t("mlp_b1", True)
w2, b2 = t("mlp_w2", True), t("mlp_b2", True)
y = F.linear(F.gelu(F.linear(x, w1, b1), approximate="tanh"), w2, b2)
(y * t("mlp_g")).sum().backward()
put("mlp_y", y)
for name, v in (("x", x), ("w1", w1), ("b1", b1), ("w2", w2), ("b2", b2)):
    put("mlp_d" + name, v.grad)

with open(os.path.join(DIR, "outputs.json"), "w") as f:
    json.dump(OUT, f)
