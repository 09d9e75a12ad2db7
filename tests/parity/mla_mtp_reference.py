#!/usr/bin/env python3
"""The PyTorch reference for tests/models/mla_mtp_parity_test.cpp: a decoder with multi-head latent
attention (DeepSeek-V2 section 2.1, decoupled RoPE) and DeepSeek-V3's multi-token prediction modules
(section 2.2), written in plain torch from the papers' equations, fed the weights Kiln wrote
(Megatron-core names).

MLA, per token t and head i (the paper's notation; c^Q, c^KV the latents, R the RoPE parts):
  c^Q_t = q_norm(W^DQ h_t)            q^C_t,i = (W^UQ c^Q_t)_i          q^R_t,i = RoPE((W^QR c^Q_t)_i)
  c^KV_t = kv_norm(W^DKV h_t)          k^C_t,i = (W^UK c^KV_t)_i         k^R_t = RoPE(W^KR h_t)   (shared by the heads)
  v^C_t,i = (W^UV c^KV_t)_i
  o_t,i = sum_j softmax_j((q^C_t,i . k^C_j,i + q^R_t,i . k^R_j) / sqrt(d_h + d^R_h)) v^C_j,i   (j <= t)
  u_t = W^O [o_t,1; ...; o_t,nh]
The scores are the sum of the two dot products (no concatenated head, no padding). Megatron's fused
weights are split into the paper's: linear_q_up_proj rows per head = (W^UQ | W^QR), linear_kv_down_proj
rows = (W^DKV | W^KR), linear_kv_up_proj rows per head = (W^UK | W^UV). Without query compression
(q_lora_rank 0) linear_q_proj maps h_t to (q^C | q^R) directly.

MTP, depth k = 1 .. D, position i (h^0 the main model's final-normed output):
  h'^k_i = M_k [RMSNorm(Emb(t_{i+k})); RMSNorm(h^{k-1}_i)]     (Megatron's order: embedding first)
  h^k = final_norm_k(TRM_k(h'^k));  L_k = mean over counted i of CE(OutHead(h^k_i), t_{i+k+1})
  total loss = L_main + factor / D * sum_k L_k
Tokens past the end are 0 and their positions do not count (the loss mask shifted with the labels).

usage: mla_mtp_reference.py DIR   (config.json, model.safetensors, inputs.safetensors as
gpt_reference.py; writes outputs.safetensors: logits, loss (L_main), mtp_loss.<k> for k = 1 .. D,
total_loss, grad.<parameter> of total_loss)"""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import read_safetensors, rms_norm, rotate_half, write_safetensors  # noqa: E402


def run(cfg, weights, inputs):
    params = {k: v.to(torch.float32).requires_grad_() for k, v in weights.items()}
    tokens, labels, loss_mask = inputs["tokens"], inputs["labels"], inputs["loss_mask"].float()
    L, H, nh = cfg["num_layers"], cfg["hidden_size"], cfg["num_attention_heads"]
    qr, kvr = cfg["q_lora_rank"], cfg["kv_lora_rank"]
    dh, dr, dv = cfg["qk_head_dim"], cfg["qk_pos_emb_head_dim"], cfg["v_head_dim"]
    layer_norm = cfg["normalization"] == "LayerNorm"
    eps = cfg["norm_epsilon"]
    B, T = tokens.shape

    def norm(x, prefix):
        n = x.shape[-1]
        if layer_norm:
            return F.layer_norm(x, (n,), params[prefix + ".weight"], params[prefix + ".bias"], eps)
        return rms_norm(x, params[prefix + ".weight"], eps)

    def linear(x, prefix):
        return F.linear(x, params[prefix + ".weight"], params.get(prefix + ".bias"))

    inv_freq = 1.0 / (cfg["rotary_base"] ** (torch.arange(0, dr, 2, dtype=torch.float64) / dr))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()  # [T, dr]

    def rope(x):  # x [B, T, ..., dr]
        shape = [1, T] + [1] * (x.dim() - 3) + [dr]
        return x * cos.view(shape) + rotate_half(x) * sin.view(shape)

    causal = torch.ones(T, T, dtype=torch.bool).tril()

    def mla(x, p):
        if qr > 0:
            c_q = norm(linear(x, p + "linear_q_down_proj"), p + "q_layernorm")
            w_up = params[p + "linear_q_up_proj.weight"].view(nh, dh + dr, qr)
            q_c = torch.einsum("btr,hdr->bthd", c_q, w_up[:, :dh])  # W^UQ
            q_r = rope(torch.einsum("btr,hdr->bthd", c_q, w_up[:, dh:]))  # W^QR
        else:
            w_q = params[p + "linear_q_proj.weight"].view(nh, dh + dr, H)
            q_c = torch.einsum("btc,hdc->bthd", x, w_q[:, :dh])
            q_r = rope(torch.einsum("btc,hdc->bthd", x, w_q[:, dh:]))
        w_down = params[p + "linear_kv_down_proj.weight"]  # [kvr + dr, H]
        c_kv = norm(F.linear(x, w_down[:kvr]), p + "kv_layernorm")  # W^DKV
        k_r = rope(F.linear(x, w_down[kvr:]))  # W^KR: [B, T, dr], one per token
        w_kv = params[p + "linear_kv_up_proj.weight"].view(nh, dh + dv, kvr)
        k_c = torch.einsum("btr,hdr->bthd", c_kv, w_kv[:, :dh])  # W^UK
        v_c = torch.einsum("btr,hdr->bthd", c_kv, w_kv[:, dh:])  # W^UV
        scores = (torch.einsum("bthd,bshd->bhts", q_c, k_c) + torch.einsum("bthd,bsd->bhts", q_r, k_r)) / math.sqrt(
            dh + dr)
        probs = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
        o = torch.einsum("bhts,bshd->bthd", probs, v_c).reshape(B, T, nh * dv)
        return linear(o, p + "linear_proj")

    def layer(h, p):
        h = h + mla(norm(h, p + "input_layernorm"), p + "self_attention.")
        up = linear(norm(h, p + "pre_mlp_layernorm"), p + "mlp.linear_fc1")
        if cfg["swiglu"]:
            f = up.shape[-1] // 2
            act = F.silu(up[..., :f]) * up[..., f:]
        else:
            act = F.gelu(up, approximate="tanh")
        return h + linear(act, p + "mlp.linear_fc2")

    word = params["embedding.word_embeddings.weight"]
    out_w = params.get("output_layer.weight", word)

    def ce(hidden, lab, mask):
        nll = F.cross_entropy(F.linear(hidden, out_w).reshape(B * T, -1), lab.reshape(-1), reduction="none")
        m = mask.reshape(-1)
        return (nll * m).sum() / m.sum()

    h = F.embedding(tokens, word)
    for i in range(L):
        h = layer(h, "decoder.layers.%d." % i)
    h = norm(h, "decoder.final_layernorm")
    logits = F.linear(h, out_w)
    main = ce(h, labels, loss_mask)

    def shift(x):  # t_{i+1}, zeros past the end
        return torch.cat((x[:, 1:], torch.zeros_like(x[:, :1])), dim=1)

    depth_losses = []
    prev, tok, lab, mask = h, tokens, labels, loss_mask
    for k in range(cfg["mtp_num_layers"]):
        p = "mtp.layers.%d." % k
        tok, lab, mask = shift(tok), shift(lab), shift(mask)
        joined = torch.cat((norm(F.embedding(tok, word), p + "enorm"), norm(prev, p + "hnorm")), dim=-1)
        prev = norm(layer(F.linear(joined, params[p + "eh_proj.weight"]), p + "transformer_layer."),
                    p + "final_layernorm")
        depth_losses.append(ce(prev, lab, mask))
    total = main
    if depth_losses:
        total = main + cfg["mtp_loss_scaling_factor"] / len(depth_losses) * sum(depth_losses)
    total.backward()

    out = {"logits": logits, "loss": main, "total_loss": total}
    for k, l in enumerate(depth_losses):
        out["mtp_loss.%d" % (k + 1)] = l
    for name, t in params.items():
        out["grad." + name] = t.grad
    return out


def main():
    d = sys.argv[1]
    cfg = json.load(open(os.path.join(d, "config.json")))
    weights = read_safetensors(os.path.join(d, "model.safetensors"))
    inputs = read_safetensors(os.path.join(d, "inputs.safetensors"))
    write_safetensors(os.path.join(d, "outputs.safetensors"), run(cfg, weights, inputs))


if __name__ == "__main__":
    main()
