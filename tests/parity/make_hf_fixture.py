#!/usr/bin/env python3
"""A small Hugging Face model directory, written without transformers, for
tests/models/hf_checkpoint_test.cpp: config.json as transformers writes it for LlamaForCausalLM or
GPT2LMHeadModel, model.safetensors with HF's tensor names and layouts (GPT-2's Conv1D weights
[in, out], c_attn = q | k | v; Llama's separate q/k/v/o and gate/up/down projections), a byte-level
GPT-2 tokenizer (vocab.json + merges.txt), and the logits of a forward pass computed here from
those tensors with Hugging Face's math (GPT2Model / LlamaModel, re-implemented in plain torch), so
that Kiln's import is checked against an independent reading of the same layout.

Mixtral (MixtralForCausalLM: Llama's attention, block_sparse_moe with a softmax top-k router) and
DeepSeek-V3 (DeepseekV3ForCausalLM: MLA, a dense first layer, then sigmoid-routed MoE with the
correction bias, group-limited top-k and a shared expert) follow transformers' modeling_mixtral.py
and modeling_deepseek_v3.py the same way.

usage: make_hf_fixture.py DIR llama|gpt2|mixtral|deepseek_v3
  writes DIR/config.json, DIR/model.safetensors, DIR/vocab.json, DIR/merges.txt,
         DIR/reference.safetensors (tokens int64 [B, T], logits f32 [B, T, V])"""
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

NUMPY_DTYPE_NAMES = {torch.float32: "F32", torch.int64: "I64"}


def write_safetensors(path, tensors, metadata=None):
    header, blobs, offset = {}, [], 0
    if metadata:
        header["__metadata__"] = metadata
    for name, t in tensors.items():
        t = t.detach().contiguous()
        raw = t.numpy().tobytes()
        header[name] = {"dtype": NUMPY_DTYPE_NAMES[t.dtype], "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * ((8 - len(text) % 8) % 8)
    with open(path + ".tmp", "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for b in blobs:
            f.write(b)
    os.replace(path + ".tmp", path)


def bytes_to_unicode():
    """GPT-2's byte-level alphabet (openai/gpt-2 encoder.py)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, [chr(c) for c in cs]))


def write_tokenizer(d):
    alphabet = bytes_to_unicode()
    vocab = {alphabet[b]: i for i, b in enumerate(range(256))}
    merges = [("t", "h"), ("th", "e"), ("Ġ", "t")]
    for a, b in merges:
        vocab[a + b] = len(vocab)
    vocab["<|endoftext|>"] = len(vocab)
    json.dump(vocab, open(os.path.join(d, "vocab.json"), "w"), ensure_ascii=False)
    with open(os.path.join(d, "merges.txt"), "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n")
        for a, b in merges:
            f.write("%s %s\n" % (a, b))
    return len(vocab)


def rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def llama3_inv_freq(head_dim, base, rope_scaling):
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    if rope_scaling is None:
        return inv_freq
    factor = rope_scaling["factor"]
    low, high, old = rope_scaling["low_freq_factor"], rope_scaling["high_freq_factor"], rope_scaling["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old / low, inv_freq / factor, inv_freq)
    smooth = (old / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old / high) * ~(wavelen > old / low)
    return torch.where(medium, smoothed, scaled)


def attention(q, k, v):
    """q [B, nh, T, D], k and v [B, nh, T, D] (already repeated): causal softmax attention."""
    T = q.shape[2]
    scores = q @ k.transpose(2, 3) / math.sqrt(q.shape[-1])
    scores = scores + torch.full((T, T), float("-inf")).triu(1)
    return torch.softmax(scores, dim=-1) @ v


def llama_forward(cfg, w, tokens, mlp=None):
    B, T = tokens.shape
    H, nh, ng = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd, eps = cfg["head_dim"], cfg["rms_norm_eps"]

    def rms(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))

    def lin(x, name):
        return F.linear(x, w[name + ".weight"], w.get(name + ".bias"))

    inv_freq = llama3_inv_freq(hd, cfg["rope_theta"], cfg["rope_scaling"])
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    cos, sin = emb.cos().float(), emb.sin().float()
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        x = rms(h, w[p + "input_layernorm.weight"])
        q = lin(x, p + "self_attn.q_proj").view(B, T, nh, hd).transpose(1, 2)
        k = lin(x, p + "self_attn.k_proj").view(B, T, ng, hd).transpose(1, 2)
        v = lin(x, p + "self_attn.v_proj").view(B, T, ng, hd).transpose(1, 2)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        k, v = k.repeat_interleave(nh // ng, dim=1), v.repeat_interleave(nh // ng, dim=1)
        a = attention(q, k, v).transpose(1, 2).reshape(B, T, nh * hd)
        h = h + lin(a, p + "self_attn.o_proj")
        x = rms(h, w[p + "post_attention_layernorm.weight"])
        if mlp is None:
            h = h + lin(F.silu(lin(x, p + "mlp.gate_proj")) * lin(x, p + "mlp.up_proj"), p + "mlp.down_proj")
        else:
            h = h + mlp(i, p, x)
    h = rms(h, w["model.norm.weight"])
    return h @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def rms_norm(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def rope_tables(dim, base, T):
    inv_freq = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim))
    freqs = torch.outer(torch.arange(T, dtype=torch.float64), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().float(), emb.sin().float()


def swiglu_mlp(x, w, p, gate="gate_proj", up="up_proj", down="down_proj"):
    return F.linear(F.silu(F.linear(x, w[p + gate + ".weight"])) * F.linear(x, w[p + up + ".weight"]),
                    w[p + down + ".weight"])


def mixtral_moe(cfg, w, p, x):
    """MixtralSparseMoeBlock: softmax over all experts, top-k, renormalised over the k."""
    B, T, H = x.shape
    flat = x.reshape(-1, H)
    probs = torch.softmax(F.linear(flat, w[p + "gate.weight"]), dim=-1)
    weights, chosen = torch.topk(probs, cfg["num_experts_per_tok"], dim=-1)
    weights = weights / weights.sum(-1, keepdim=True)
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        for j in range(chosen.shape[1]):
            e = int(chosen[n, j])
            out[n] += weights[n, j] * swiglu_mlp(flat[n], w, p + "experts.%d." % e, "w1", "w3", "w2")
    return out.view(B, T, H)


def mixtral_forward(cfg, w, tokens):
    return llama_forward(cfg, w, tokens, mlp=lambda i, p, x: mixtral_moe(cfg, w, p + "block_sparse_moe.", x))


def deepseek_moe(cfg, w, p, x):
    """DeepseekV3MoE: sigmoid scores; experts chosen by scores + e_score_correction_bias within the
    top topk_group groups (a group scored by its top 2), weighted by the scores renormalised and
    scaled; plus the shared experts."""
    B, T, H = x.shape
    flat = x.reshape(-1, H)
    E, k, G, GK = cfg["n_routed_experts"], cfg["num_experts_per_tok"], cfg["n_group"], cfg["topk_group"]
    scores = torch.sigmoid(F.linear(flat, w[p + "gate.weight"]))
    choice = scores + w[p + "gate.e_score_correction_bias"]
    group_scores = choice.view(-1, G, E // G).topk(2, dim=-1)[0].sum(-1)
    group_idx = torch.topk(group_scores, k=GK, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter_(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(-1, G, E // G).reshape(-1, E)
    choice = choice.masked_fill(~score_mask.bool(), 0.0)
    chosen = torch.topk(choice, k=k, dim=-1, sorted=False)[1]
    weights = scores.gather(1, chosen)
    if cfg["norm_topk_prob"]:
        weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    weights = weights * cfg["routed_scaling_factor"]
    out = torch.zeros_like(flat)
    for n in range(flat.shape[0]):
        for j in range(k):
            out[n] += weights[n, j] * swiglu_mlp(flat[n], w, p + "experts.%d." % int(chosen[n, j]))
    return out.view(B, T, H) + swiglu_mlp(x, w, p + "shared_experts.")


def deepseek_forward(cfg, w, tokens):
    B, T = tokens.shape
    nh, eps = cfg["num_attention_heads"], cfg["rms_norm_eps"]
    qk, pe, dv, kvr = cfg["qk_nope_head_dim"], cfg["qk_rope_head_dim"], cfg["v_head_dim"], cfg["kv_lora_rank"]
    cos, sin = rope_tables(pe, cfg["rope_theta"], T)
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(cfg["num_hidden_layers"]):
        p = "model.layers.%d." % i
        a = "model.layers.%d.self_attn." % i
        x = rms_norm(h, w[p + "input_layernorm.weight"], eps)
        q = F.linear(rms_norm(F.linear(x, w[a + "q_a_proj.weight"]), w[a + "q_a_layernorm.weight"], 1e-6),
                     w[a + "q_b_proj.weight"]).view(B, T, nh, qk + pe).transpose(1, 2)
        q_pass, q_rot = q.split([qk, pe], dim=-1)
        ckv = F.linear(x, w[a + "kv_a_proj_with_mqa.weight"])
        k_pass, k_rot = ckv.split([kvr, pe], dim=-1)
        kv = F.linear(rms_norm(k_pass, w[a + "kv_a_layernorm.weight"], 1e-6), w[a + "kv_b_proj.weight"])
        k_pass, v = kv.view(B, T, nh, qk + dv).transpose(1, 2).split([qk, dv], dim=-1)
        k_rot = k_rot.view(B, 1, T, pe)
        q_rot, k_rot = q_rot * cos + rotate_half(q_rot) * sin, k_rot * cos + rotate_half(k_rot) * sin
        query = torch.cat((q_pass, q_rot), dim=-1)
        key = torch.cat((k_pass, k_rot.expand(B, nh, T, pe)), dim=-1)
        scores = query @ key.transpose(2, 3) / math.sqrt(qk + pe)
        scores = scores + torch.full((T, T), float("-inf")).triu(1)
        att = (torch.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(B, T, nh * dv)
        h = h + F.linear(att, w[a + "o_proj.weight"])
        x = rms_norm(h, w[p + "post_attention_layernorm.weight"], eps)
        if i < cfg["first_k_dense_replace"]:
            h = h + swiglu_mlp(x, w, p + "mlp.")
        else:
            h = h + deepseek_moe(cfg, w, p + "mlp.", x)
    h = rms_norm(h, w["model.norm.weight"], eps)
    return h @ w.get("lm_head.weight", w["model.embed_tokens.weight"]).T


def gpt2_forward(cfg, w, tokens):
    B, T = tokens.shape
    H, nh, eps = cfg["n_embd"], cfg["n_head"], cfg["layer_norm_epsilon"]
    hd = H // nh

    def ln(x, name):
        return F.layer_norm(x, (H,), w[name + ".weight"], w[name + ".bias"], eps)

    def conv1d(x, name):  # transformers' Conv1D: x @ W + b with W [in, out]
        return x @ w[name + ".weight"] + w[name + ".bias"]

    h = w["transformer.wte.weight"][tokens] + w["transformer.wpe.weight"][torch.arange(T)]
    for i in range(cfg["n_layer"]):
        p = "transformer.h.%d." % i
        qkv = conv1d(ln(h, p + "ln_1"), p + "attn.c_attn")
        q, k, v = (t.view(B, T, nh, hd).transpose(1, 2) for t in qkv.split(H, dim=-1))
        a = attention(q, k, v).transpose(1, 2).reshape(B, T, H)
        h = h + conv1d(a, p + "attn.c_proj")
        h = h + conv1d(F.gelu(conv1d(ln(h, p + "ln_2"), p + "mlp.c_fc"), approximate="tanh"), p + "mlp.c_proj")
    h = ln(h, "transformer.ln_f")
    return h @ w.get("lm_head.weight", w["transformer.wte.weight"]).T


def main():
    d, arch = sys.argv[1], sys.argv[2]
    os.makedirs(d, exist_ok=True)
    torch.manual_seed(20261202)
    tokenizer_size = write_tokenizer(d)
    V = 300  # more rows than the tokenizer's 260 tokens, as published models often have
    g = torch.Generator().manual_seed(7)

    def rnd(*shape, mean=0.0, std=0.2):
        return torch.randn(*shape, generator=g) * std + mean

    w = {}
    if arch == "mixtral":
        L, H, nh, ng, hd, Fh, P, E = 2, 32, 4, 2, 8, 24, 64, 4
        cfg = {"architectures": ["MixtralForCausalLM"], "model_type": "mixtral", "vocab_size": V, "hidden_size": H,
               "intermediate_size": Fh, "num_hidden_layers": L, "num_attention_heads": nh,
               "num_key_value_heads": ng, "head_dim": hd, "max_position_embeddings": P, "rms_norm_eps": 1e-5,
               "rope_theta": 1000000.0, "hidden_act": "silu", "rope_scaling": None, "sliding_window": None,
               "num_local_experts": E, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02,
               "router_jitter_noise": 0.0, "output_router_logits": False, "tie_word_embeddings": False,
               "torch_dtype": "float32", "bos_token_id": None, "eos_token_id": tokenizer_size - 1}
        w["model.embed_tokens.weight"] = rnd(V, H)
        for i in range(L):
            p = "model.layers.%d." % i
            w[p + "input_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            w[p + "self_attn.q_proj.weight"] = rnd(nh * hd, H)
            w[p + "self_attn.k_proj.weight"] = rnd(ng * hd, H)
            w[p + "self_attn.v_proj.weight"] = rnd(ng * hd, H)
            w[p + "self_attn.o_proj.weight"] = rnd(H, nh * hd)
            w[p + "post_attention_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            w[p + "block_sparse_moe.gate.weight"] = rnd(E, H, std=0.5)
            for e in range(E):
                x = p + "block_sparse_moe.experts.%d." % e
                w[x + "w1.weight"] = rnd(Fh, H)
                w[x + "w3.weight"] = rnd(Fh, H)
                w[x + "w2.weight"] = rnd(H, Fh)
        w["model.norm.weight"] = rnd(H, mean=1.0, std=0.1)
        w["lm_head.weight"] = rnd(V, H)
        forward = mixtral_forward
    elif arch == "deepseek_v3":
        L, H, nh, Fh, Fe, P, E = 3, 32, 4, 48, 16, 64, 8
        qr, kvr, qk, pe, dv = 12, 10, 8, 4, 6
        cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "vocab_size": V,
               "hidden_size": H, "intermediate_size": Fh, "moe_intermediate_size": Fe, "num_hidden_layers": L,
               "num_attention_heads": nh, "num_key_value_heads": nh, "max_position_embeddings": P,
               "rms_norm_eps": 1e-6, "rope_theta": 10000.0, "hidden_act": "silu", "rope_scaling": None,
               "rope_interleave": False, "attention_bias": False, "q_lora_rank": qr, "kv_lora_rank": kvr,
               "qk_nope_head_dim": qk, "qk_rope_head_dim": pe, "v_head_dim": dv, "first_k_dense_replace": 1,
               "n_routed_experts": E, "num_experts_per_tok": 4, "n_group": 4, "topk_group": 2,
               "n_shared_experts": 1, "norm_topk_prob": True, "routed_scaling_factor": 2.5,
               "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": None,
               "eos_token_id": tokenizer_size - 1}
        w["model.embed_tokens.weight"] = rnd(V, H)
        for i in range(L):
            p = "model.layers.%d." % i
            a = p + "self_attn."
            w[p + "input_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            w[a + "q_a_proj.weight"] = rnd(qr, H)
            w[a + "q_a_layernorm.weight"] = rnd(qr, mean=1.0, std=0.1)
            w[a + "q_b_proj.weight"] = rnd(nh * (qk + pe), qr)
            w[a + "kv_a_proj_with_mqa.weight"] = rnd(kvr + pe, H)
            w[a + "kv_a_layernorm.weight"] = rnd(kvr, mean=1.0, std=0.1)
            w[a + "kv_b_proj.weight"] = rnd(nh * (qk + dv), kvr)
            w[a + "o_proj.weight"] = rnd(H, nh * dv)
            w[p + "post_attention_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            if i < cfg["first_k_dense_replace"]:
                w[p + "mlp.gate_proj.weight"] = rnd(Fh, H)
                w[p + "mlp.up_proj.weight"] = rnd(Fh, H)
                w[p + "mlp.down_proj.weight"] = rnd(H, Fh)
                continue
            w[p + "mlp.gate.weight"] = rnd(E, H, std=0.5)
            # Positive, so every expert's sigmoid score + bias is > 0: transformers masks the groups
            # it drops with 0.0, not -inf, and a negative choice score would lose to a masked one
            # (Kiln, as Megatron, never picks outside the kept groups).
            w[p + "mlp.gate.e_score_correction_bias"] = rnd(E, mean=0.1, std=0.02)
            for e in range(E):
                x = p + "mlp.experts.%d." % e
                w[x + "gate_proj.weight"] = rnd(Fe, H)
                w[x + "up_proj.weight"] = rnd(Fe, H)
                w[x + "down_proj.weight"] = rnd(H, Fe)
            w[p + "mlp.shared_experts.gate_proj.weight"] = rnd(Fe, H)
            w[p + "mlp.shared_experts.up_proj.weight"] = rnd(Fe, H)
            w[p + "mlp.shared_experts.down_proj.weight"] = rnd(H, Fe)
        w["model.norm.weight"] = rnd(H, mean=1.0, std=0.1)
        w["lm_head.weight"] = rnd(V, H)
        forward = deepseek_forward
    elif arch == "llama":
        L, H, nh, ng, hd, Fh, P = 2, 32, 4, 2, 8, 48, 64
        cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": V, "hidden_size": H,
               "intermediate_size": Fh, "num_hidden_layers": L, "num_attention_heads": nh,
               "num_key_value_heads": ng, "head_dim": hd, "max_position_embeddings": P, "rms_norm_eps": 1e-5,
               "rope_theta": 500000.0, "hidden_act": "silu", "attention_bias": False, "mlp_bias": False,
               "rope_scaling": {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 8192},
               "tie_word_embeddings": False, "torch_dtype": "float32", "bos_token_id": None,
               "eos_token_id": tokenizer_size - 1}
        w["model.embed_tokens.weight"] = rnd(V, H)
        for i in range(L):
            p = "model.layers.%d." % i
            w[p + "input_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            w[p + "self_attn.q_proj.weight"] = rnd(nh * hd, H)
            w[p + "self_attn.k_proj.weight"] = rnd(ng * hd, H)
            w[p + "self_attn.v_proj.weight"] = rnd(ng * hd, H)
            w[p + "self_attn.o_proj.weight"] = rnd(H, nh * hd)
            w[p + "post_attention_layernorm.weight"] = rnd(H, mean=1.0, std=0.1)
            w[p + "mlp.gate_proj.weight"] = rnd(Fh, H)
            w[p + "mlp.up_proj.weight"] = rnd(Fh, H)
            w[p + "mlp.down_proj.weight"] = rnd(H, Fh)
        w["model.norm.weight"] = rnd(H, mean=1.0, std=0.1)
        w["lm_head.weight"] = rnd(V, H)
        forward = llama_forward
    else:
        L, H, nh, Fh, P = 2, 32, 4, 128, 64
        cfg = {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2", "vocab_size": V, "n_positions": P,
               "n_ctx": P, "n_embd": H, "n_layer": L, "n_head": nh, "n_inner": None,
               "activation_function": "gelu_new", "layer_norm_epsilon": 1e-5, "resid_pdrop": 0.1,
               "embd_pdrop": 0.1, "attn_pdrop": 0.1, "scale_attn_weights": True, "tie_word_embeddings": True,
               "torch_dtype": "float32", "bos_token_id": tokenizer_size - 1, "eos_token_id": tokenizer_size - 1}
        w["transformer.wte.weight"] = rnd(V, H)
        w["transformer.wpe.weight"] = rnd(P, H)
        for i in range(L):
            p = "transformer.h.%d." % i
            for n in ("ln_1", "ln_2"):
                w[p + n + ".weight"] = rnd(H, mean=1.0, std=0.1)
                w[p + n + ".bias"] = rnd(H, std=0.1)
            w[p + "attn.c_attn.weight"] = rnd(H, 3 * H)
            w[p + "attn.c_attn.bias"] = rnd(3 * H, std=0.1)
            w[p + "attn.c_proj.weight"] = rnd(H, H)
            w[p + "attn.c_proj.bias"] = rnd(H, std=0.1)
            w[p + "mlp.c_fc.weight"] = rnd(H, Fh)
            w[p + "mlp.c_fc.bias"] = rnd(Fh, std=0.1)
            w[p + "mlp.c_proj.weight"] = rnd(Fh, H)
            w[p + "mlp.c_proj.bias"] = rnd(H, std=0.1)
        w["transformer.ln_f.weight"] = rnd(H, mean=1.0, std=0.1)
        w["transformer.ln_f.bias"] = rnd(H, std=0.1)
        forward = gpt2_forward
    json.dump(cfg, open(os.path.join(d, "config.json"), "w"), indent=2)
    write_safetensors(os.path.join(d, "model.safetensors"), w, {"format": "pt"})
    tokens = torch.randint(0, tokenizer_size, (2, 11), generator=g)
    with torch.no_grad():
        logits = forward(cfg, w, tokens)
    write_safetensors(os.path.join(d, "reference.safetensors"), {"tokens": tokens, "logits": logits.float()})


if __name__ == "__main__":
    main()
