#!/usr/bin/env python3
"""The PyTorch reference for tests/models/moe_parity_test.cpp: a mixture-of-experts MLP written in
float64 from the papers' equations as Megatron-core computes them (moe_utils.py's
topk_softmax_with_capacity, group_limited_topk, switch_load_balancing_loss_func, z_loss_func,
get_updated_expert_bias), with dense per-expert loops instead of Kiln's plan and kernels:

  router     logits = x W^T; softmax (pre: softmax over all experts, then top-k; post: top-k of the
             logits, then softmax over the k) or sigmoid (top-k of sigmoid + expert bias, the picks'
             sigmoids normalised to sum 1 when k > 1); probs *= scaling factor
  groups     (DeepSeek-V3) a group's score is the sum of its top k / group_topk scores; the top
             group_topk groups are kept, the others masked before the top-k
  capacity   ceil(N k / E * factor) per expert; over it, policy probs keeps the highest probs,
             policy position the first tokens in order; padding: entries added up to capacity with
             probability 0 (their output is multiplied by 0, so which tokens pad does not matter)
  aux loss   Switch/GShard: sum_e (sum_n scores[n, e]) * tokens[e] * E * coeff / (k N^2), scores
             softmax(logits) (or sigmoid normalised), tokens from a plain top-k of those scores;
             seq_aux_loss: the same per sequence, averaged over the batch
  z loss     mean(logsumexp(logits)^2) * coeff
  experts    fc2(act(fc1(x))) per expert, act GELU(tanh) or SwiGLU (gate | up), no biases; the
             output is sum over a token's kept experts of prob * expert(x), plus a shared expert
  bias       new bias = bias + rate * sign(mean(load) - load), load = slots kept per expert

The loss backpropagated is sum(y * r) + aux + z (Megatron adds the aux losses' gradients through
MoEAuxLossAutoScaler with scale 1, the same gradient).

usage: moe_reference.py DIR...  (one case per DIR, in one process: importing torch takes seconds)
  reads  DIR/config.json, DIR/inputs.safetensors (x [B, T, H], r [B, T, H], and the layer's
         parameters and buffers by their Kiln names)
  writes DIR/outputs.safetensors: y, grad.x, grad.<parameter>, tokens, dropped (per expert),
         aux_loss, z_loss, new_expert_bias (with expert bias)."""
import json
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from gpt_reference import read_safetensors, write_safetensors  # noqa: E402


def topk_with_groups(scores, k, groups, group_topk):
    if not groups:
        return torch.topk(scores, k=k, dim=1)
    n, e = scores.shape
    group_scores = scores.view(n, groups, -1).topk(k // group_topk, dim=-1)[0].sum(dim=-1)
    group_idx = torch.topk(group_scores, k=group_topk, dim=-1, sorted=False)[1]
    group_mask = torch.zeros_like(group_scores).scatter(1, group_idx, 1)
    score_mask = group_mask.unsqueeze(-1).expand(n, groups, e // groups).reshape(n, -1)
    masked = scores.masked_fill(~score_mask.bool(), float("-inf"))
    return torch.topk(masked, k=k, dim=-1)


def act(h, swiglu):
    if swiglu:
        g, u = torch.chunk(h, 2, dim=-1)
        return F.silu(g) * u
    return F.gelu(h, approximate="tanh")


def run(d):
    c = json.load(open(os.path.join(d, "config.json")))
    t = {k: v.to(torch.float64) for k, v in read_safetensors(os.path.join(d, "inputs.safetensors")).items()}
    params = {k: t[k].clone().requires_grad_(True) for k in c["parameters"]}
    x = t["x"].clone().requires_grad_(True)
    b, s, h = x.shape
    xs = x.reshape(-1, h)
    n, e, k = xs.shape[0], c["num_experts"], c["topk"]

    logits = xs @ params["router.weight"].t()
    bias = t.get("router.expert_bias")
    groups, group_topk = c["num_groups"], c["group_topk"]
    if c["score"] == "softmax":
        if c["pre_softmax"]:
            scores = torch.softmax(logits, dim=-1)
            probs, idx = topk_with_groups(scores, k, groups, group_topk)
        else:
            sel, idx = topk_with_groups(logits, k, groups, group_topk)
            probs = torch.softmax(sel, dim=-1)
    else:
        scores = torch.sigmoid(logits)
        if bias is not None:
            _, idx = topk_with_groups(scores + bias, k, groups, group_topk)
            sel = torch.gather(scores, 1, idx)
        else:
            sel, idx = topk_with_groups(scores, k, groups, group_topk)
        probs = sel / (sel.sum(dim=-1, keepdim=True) + 1e-20) if k > 1 else sel
    if c["scaling_factor"]:
        probs = probs * c["scaling_factor"]
    dense = torch.zeros_like(logits).scatter(1, idx, probs)
    routed = torch.zeros_like(logits).scatter(1, idx, 1.0).bool()
    kept = routed
    if c["capacity_factor"] > 0:
        cap = math.ceil(n * k / e * c["capacity_factor"])
        if c["drop_policy"] == "probs":
            _, cidx = torch.topk(dense.detach(), k=cap, dim=0, sorted=False)
            cmask = torch.zeros_like(logits).scatter(0, cidx, 1.0).bool()
        else:  # the first `cap` routed tokens in order
            cmask = routed & (torch.cumsum(routed.long(), dim=0) <= cap)
        kept = routed & cmask
    final = dense * kept

    y = torch.zeros_like(xs)
    w1, w2 = params["experts.weight1"], params["experts.weight2"]
    for ex in range(e):
        rows = kept[:, ex].nonzero().flatten()
        if rows.numel() == 0:
            continue
        out = act(xs[rows] @ w1[ex].t(), c["swiglu"]) @ w2[ex].t()
        y = y.index_add(0, rows, out * final[rows, ex:ex + 1])
    if "shared_experts.linear_fc1.weight" in params:
        y = y + act(xs @ params["shared_experts.linear_fc1.weight"].t(), c["swiglu"]) @ \
            params["shared_experts.linear_fc2.weight"].t()
    y = y.reshape(b, s, h)

    loss = (y * t["r"]).sum()
    aux = torch.zeros((), dtype=torch.float64)
    if c["load_balancing"] != "none" and c["aux_loss_coeff"] > 0:
        if c["score"] == "softmax":
            aux_scores = torch.softmax(logits, dim=-1)
        else:
            sg = torch.sigmoid(logits)
            aux_scores = sg / (sg.sum(dim=-1, keepdim=True) + 1e-20)
        _, aidx = torch.topk(aux_scores, k=k, dim=1)
        amap = torch.zeros_like(logits).scatter(1, aidx, 1.0)
        coeff = c["aux_loss_coeff"]
        if c["load_balancing"] == "aux_loss":
            aux = (aux_scores.sum(0) * amap.sum(0)).sum() * e * coeff / (k * n * n)
        else:  # per sequence of s tokens (Kiln's tokens are b-major), averaged over the b sequences
            ps = aux_scores.reshape(b, s, e).sum(1)
            pt = amap.reshape(b, s, e).sum(1)
            aux = (ps * pt).sum() * e * coeff / (k * s * s) / b
        loss = loss + aux
    z = torch.zeros((), dtype=torch.float64)
    if c["z_loss_coeff"] > 0:
        z = torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * c["z_loss_coeff"]
        loss = loss + z
    loss.backward()

    out = {"y": y, "grad.x": x.grad, "aux_loss": aux, "z_loss": z,
           "tokens": routed.sum(0).to(torch.float64), "dropped": (routed & ~kept).sum(0).to(torch.float64)}
    for name, p in params.items():
        out["grad." + name] = p.grad
    if bias is not None:
        load = kept.sum(0).to(torch.float64)
        out["new_expert_bias"] = bias + torch.sign(load.mean() - load) * c["bias_update_rate"]
    write_safetensors(os.path.join(d, "outputs.safetensors"), out)


if __name__ == "__main__":
    for case_dir in sys.argv[1:]:
        run(case_dir)
