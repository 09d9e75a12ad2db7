#!/usr/bin/env python3
"""The PyTorch reference for tests/models/gpt_parity_test.cpp: a GPT-2 or Llama decoder written in
plain torch with Hugging Face's math (GPT2Model / LlamaModel: separate q, k, v projections, repeat_kv
for grouped-query attention, rotate_half RoPE with Llama 3 frequency scaling, HF's RMSNorm), fed
the weights Kiln wrote in Megatron-core's layout and names.

Megatron's fused linear_qkv (rows grouped per query group: its query heads, then its key head,
then its value head) is split into HF's q_proj / k_proj / v_proj here with torch ops on the loaded
leaf, so the gradients come back in Megatron's layout and compare name by name.

usage: gpt_reference.py DIR
  reads  DIR/config.json (shapes; "device" cpu or cuda and "dtype" float32 or bfloat16: the weights
         are cast to it, as Kiln's model.to(dtype) casts them), DIR/model.safetensors (Kiln's state_dict), DIR/inputs.safetensors
         (tokens and labels int64 [B, T], loss_mask f32 [B, T])
  writes DIR/outputs.safetensors: logits [B, T, Vpad], loss [], grad.<parameter name> for each
         parameter (float32; for a bf16 run also f32.<name>: the same from the model in float32 on
         the CPU), DIR/outputs.json (names and shapes)

The safetensors files are read and written by hand (the safetensors package is not installed):
8-byte little-endian header length, JSON header, then the raw little-endian data."""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

DTYPES = {"F32": (torch.float32, 4), "F64": (torch.float64, 8), "I64": (torch.int64, 8)}


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n].decode("utf-8"))
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"]) if info["shape"] else 1
        assert end - begin == count * size, "size mismatch for " + name
        t = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype) if count else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, t in tensors.items():
        t = t.detach().to(torch.float32).contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(tmp, path)


def llama3_inv_freq(head_dim, base, scaling, factor):
    """Hugging Face's _compute_default_rope_parameters + _compute_llama3_parameters, in float64."""
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if not scaling:
        return inv_freq
    low_freq_factor, high_freq_factor, old_context_len = 1.0, 4.0, 8192.0
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    inv_freq_llama = torch.where(wavelen > low_freq_wavelen, inv_freq / factor, inv_freq)
    smooth_factor = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
    smoothed_inv_freq = (1 - smooth_factor) * inv_freq_llama / factor + smooth_factor * inv_freq_llama
    is_medium_freq = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium_freq, smoothed_inv_freq, inv_freq_llama)


def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]
    x2 = x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def repeat_kv(x, n_rep):
    b, h, s, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None, :, :].expand(b, h, n_rep, s, d).reshape(b, h * n_rep, s, d)


def rms_norm(x, weight, eps):
    """Hugging Face's LlamaRMSNorm: the statistics in float32, the product in the input's dtype."""
    h = x.to(torch.float32)
    variance = h.pow(2).mean(-1, keepdim=True)
    return weight * (h * torch.rsqrt(variance + eps)).to(x.dtype)


def run(cfg, weights, inputs, device, dtype):
    """Logits, loss and the parameters' gradients of the model at `dtype` on `device`, as f32 on the CPU."""
    params = {k: v.to(device, dtype).requires_grad_() for k, v in weights.items()}
    inputs = {k: v.to(device) for k, v in inputs.items()}
    tokens, labels, loss_mask = inputs["tokens"], inputs["labels"], inputs["loss_mask"]

    L, H = cfg["num_layers"], cfg["hidden_size"]
    nh, ng, hd = cfg["num_attention_heads"], cfg["num_query_groups"], cfg["head_dim"]
    per = nh // ng
    layer_norm = cfg["normalization"] == "LayerNorm"
    eps = cfg["norm_epsilon"]
    B, T = tokens.shape

    def norm(x, prefix):
        if layer_norm:
            return F.layer_norm(x, (H,), params[prefix + ".weight"], params[prefix + ".bias"], eps)
        return rms_norm(x, params[prefix + ".weight"], eps)

    def linear(x, prefix, weight=None):
        w = params[prefix + ".weight"] if weight is None else weight
        return F.linear(x, w, params.get(prefix + ".bias"))

    h = F.embedding(tokens, params["embedding.word_embeddings.weight"])
    if cfg["position_embedding_type"] == "learned_absolute":
        h = h + F.embedding(torch.arange(T, device=device), params["embedding.position_embeddings.weight"])

    if cfg["position_embedding_type"] == "rope":
        inv_freq = llama3_inv_freq(hd, cfg["rotary_base"], cfg["rope_llama3_scaling"], cfg["rope_scaling_factor"])
        freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
        emb = torch.cat((freqs, freqs), dim=-1)
        # f32 tables, cast to the activations' dtype where they are applied (as HF's apply_rotary_pos_emb)
        cos, sin = emb.cos().to(torch.float32).to(device), emb.sin().to(torch.float32).to(device)  # [T, D]
    causal = torch.full((T, T), float("-inf"), device=device).triu(1)

    for i in range(L):
        p = "decoder.layers.%d." % i
        residual = h
        x = norm(h, p + "input_layernorm")
        # Megatron's grouped qkv -> HF's q_proj, k_proj, v_proj (weights and biases).
        w = params[p + "self_attention.linear_qkv.weight"].view(ng, (per + 2) * hd, H)
        q_w = w[:, : per * hd].reshape(nh * hd, H)
        k_w = w[:, per * hd:(per + 1) * hd].reshape(ng * hd, H)
        v_w = w[:, (per + 1) * hd:].reshape(ng * hd, H)
        bias = params.get(p + "self_attention.linear_qkv.bias")
        if bias is not None:
            bv = bias.view(ng, (per + 2) * hd)
            q_b, k_b, v_b = bv[:, : per * hd].reshape(-1), bv[:, per * hd:(per + 1) * hd].reshape(-1), bv[:, (per + 1) * hd:].reshape(-1)
        else:
            q_b = k_b = v_b = None
        q = F.linear(x, q_w, q_b).view(B, T, nh, hd).transpose(1, 2)
        k = F.linear(x, k_w, k_b).view(B, T, ng, hd).transpose(1, 2)
        v = F.linear(x, v_w, v_b).view(B, T, ng, hd).transpose(1, 2)
        if cfg["position_embedding_type"] == "rope":
            cos_q, sin_q = cos.to(q.dtype), sin.to(q.dtype)
            q = q * cos_q + rotate_half(q) * sin_q
            k = k * cos_q + rotate_half(k) * sin_q
        k, v = repeat_kv(k, per), repeat_kv(v, per)
        scores = (torch.matmul(q, k.transpose(2, 3)) * (1.0 / math.sqrt(hd))).float() + causal
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        attn = torch.matmul(probs, v).transpose(1, 2).reshape(B, T, nh * hd)
        h = residual + linear(attn, p + "self_attention.linear_proj")

        residual = h
        x = norm(h, p + "pre_mlp_layernorm")
        up = linear(x, p + "mlp.linear_fc1")
        if cfg["swiglu"]:
            f = up.shape[-1] // 2
            act = F.silu(up[..., :f]) * up[..., f:]
        else:
            act = F.gelu(up, approximate="tanh")
        h = residual + linear(act, p + "mlp.linear_fc2")

    h = norm(h, "decoder.final_layernorm")
    out_w = params.get("output_layer.weight", params["embedding.word_embeddings.weight"])
    logits = F.linear(h, out_w)
    nll = F.cross_entropy(logits.float().reshape(B * T, -1), labels.reshape(-1), reduction="none")
    mask = loss_mask.reshape(-1).float()
    loss = (nll * mask).sum() / mask.sum()
    loss.backward()

    out = {"logits": logits.float().cpu(), "loss": loss.float().cpu()}
    for name, t in params.items():
        out["grad." + name] = t.grad.float().cpu()
    return out


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    device = torch.device(cfg.get("device", "cpu"))
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[cfg.get("dtype", "float32")]
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    inputs = read_safetensors(os.path.join(d, "inputs.safetensors"))
    out = run(cfg, weights, inputs, device, dtype)
    if dtype != torch.float32:
        # The same model in float32 on the CPU: what both sides' rounding is measured against.
        out.update({"f32." + k: v for k, v in run(cfg, weights, inputs, torch.device("cpu"), torch.float32).items()})
    write_safetensors(os.path.join(d, "outputs.safetensors"), out)
    json.dump({k: list(v.shape) for k, v in out.items()}, open(os.path.join(d, "outputs.json"), "w"))


if __name__ == "__main__":
    main()
