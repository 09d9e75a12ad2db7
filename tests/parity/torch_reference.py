#!/usr/bin/env python3
"""PyTorch reference for tests/parity/parity_test.cpp.

Usage: torch_reference.py DIR. Reads DIR/inputs.json (name -> {"shape", "dtype": "f64"|"i64"})
with one raw little-endian file DIR/<name>.bin per tensor, computes every case with torch
(forward and backward), and writes the results the same way to DIR/outputs.json and
DIR/out_<name>.bin (always float64). Exit status 0 on success.
"""
import json
import os
import sys

import numpy as np
import torch
import torch.nn.functional as F

# The PyTorch twin of Kiln's CIFAR ResNets, shared with the speed peer.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench"))
from cifar10_torch_peer import ResNet18  # noqa: E402

DIR = sys.argv[1]
with open(os.path.join(DIR, "inputs.json")) as f:
    MANIFEST = json.load(f)


def load(name, dtype=torch.float64, grad=False):
    meta = MANIFEST[name]
    arr = np.fromfile(os.path.join(DIR, name + ".bin"), dtype=np.float64 if meta["dtype"] == "f64" else np.int64)
    t = torch.from_numpy(arr.reshape(meta["shape"]).copy())
    if meta["dtype"] == "f64":
        t = t.to(dtype)
        if grad:
            t.requires_grad_(True)
    return t


OUT = {}


def save(name, t):
    OUT[name] = t.detach().to(torch.float64).contiguous().numpy()


def backward(y, gy_name):
    (y * load(gy_name, y.dtype)).sum().backward()


def case_conv2d():
    x, w, b = load("conv.x", grad=True), load("conv.w", grad=True), load("conv.b", grad=True)
    y = F.conv2d(x, w, b, stride=(2, 1), padding=(1, 2), dilation=(1, 2), groups=2)
    backward(y, "conv.gy")
    save("conv.y", y), save("conv.gx", x.grad), save("conv.gw", w.grad), save("conv.gb", b.grad)


def case_max_pool():
    x = load("pool.x", grad=True)
    y = F.max_pool2d(x, 3, 2, 1)
    backward(y, "pool.gy")
    save("pool.y", y), save("pool.gx", x.grad)


def case_batch_norm():
    x, w, b = load("bn.x", grad=True), load("bn.w", grad=True), load("bn.b", grad=True)
    rm, rv = load("bn.rm"), load("bn.rv")
    y = F.batch_norm(x, rm, rv, w, b, training=True, momentum=0.1, eps=1e-5)
    backward(y, "bn.gy")
    save("bn.y", y), save("bn.gx", x.grad), save("bn.gw", w.grad), save("bn.gb", b.grad)
    save("bn.rm_after", rm), save("bn.rv_after", rv)


def case_batch_norm_act():
    # ResNet's block end: relu(batch_norm(x) + shortcut), which Kiln runs fused (batch_norm_act).
    x, w, b, r = load("bna.x", grad=True), load("bna.w", grad=True), load("bna.b", grad=True), load("bna.r", grad=True)
    y = F.relu(F.batch_norm(x, None, None, w, b, training=True, momentum=0.1, eps=1e-5) + r)
    backward(y, "bna.gy")
    save("bna.y", y), save("bna.gx", x.grad), save("bna.gw", w.grad), save("bna.gb", b.grad), save("bna.gr", r.grad)


def case_resnet():
    # Kiln's simple_resnet with Kiln's initial weights and buffers, float64, training mode: logits,
    # loss, every parameter's gradient and the updated running statistics.
    net = ResNet18(widths=(64, 128, 256)).to(torch.float64).train()
    state = {k[len("rn.p."):]: load(k) for k in MANIFEST if k.startswith("rn.p.")}
    net.load_state_dict(state, strict=True)
    logits = net(load("rn.x"))
    loss = F.cross_entropy(logits, load("rn.t"))
    loss.backward()
    save("rn.logits", logits), save("rn.loss", loss)
    for name, p in net.named_parameters():
        save("rn.g." + name, p.grad)
    for name, b in net.named_buffers():
        if not name.endswith("num_batches_tracked"):
            save("rn.b." + name, b)


def case_layer_norm():
    x, w, b = load("ln.x", grad=True), load("ln.w", grad=True), load("ln.b", grad=True)
    y = F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)
    backward(y, "ln.gy")
    save("ln.y", y), save("ln.gx", x.grad), save("ln.gw", w.grad), save("ln.gb", b.grad)


def case_cross_entropy():
    x, t = load("ce.x", grad=True), load("ce.t")
    loss = F.cross_entropy(x, t, ignore_index=3, label_smoothing=0.1)
    loss.backward()
    save("ce.loss", loss), save("ce.gx", x.grad)


def case_softmax():
    x = load("sm.x", grad=True)
    y = F.softmax(x, dim=1)
    backward(y, "sm.gy")
    save("sm.y", y), save("sm.gx", x.grad)
    x2 = load("sm.x", grad=True)
    y2 = F.log_softmax(x2, dim=-1)
    backward(y2, "sm.gy")
    save("lsm.y", y2), save("lsm.gx", x2.grad)


def case_gelu():
    for approx in ("none", "tanh"):
        x = load("gelu.x", grad=True)
        y = F.gelu(x, approximate=approx)
        backward(y, "gelu.gy")
        save("gelu_%s.y" % approx, y), save("gelu_%s.gx" % approx, x.grad)


def case_linear():
    x, w, b = load("lin.x", grad=True), load("lin.w", grad=True), load("lin.b", grad=True)
    y = F.linear(x, w, b)
    backward(y, "lin.gy")
    save("lin.y", y), save("lin.gx", x.grad), save("lin.gw", w.grad), save("lin.gb", b.grad)


def case_embedding():
    w, idx = load("emb.w", grad=True), load("emb.idx")
    y = F.embedding(idx, w)
    backward(y, "emb.gy")
    save("emb.y", y), save("emb.gw", w.grad)


def case_cnn():
    # conv(3->8, 3x3, pad 1) -> relu -> max_pool 2 -> flatten -> linear(8*4*4 -> 10) -> cross_entropy, in f32.
    f32 = torch.float32
    x = load("cnn.x", f32)
    w1, b1 = load("cnn.w1", f32, True), load("cnn.b1", f32, True)
    w2, b2 = load("cnn.w2", f32, True), load("cnn.b2", f32, True)
    t = load("cnn.t")
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    logits = F.linear(h.flatten(1), w2, b2)
    loss = F.cross_entropy(logits, t)
    loss.backward()
    save("cnn.logits", logits), save("cnn.loss", loss)
    save("cnn.gw1", w1.grad), save("cnn.gb1", b1.grad), save("cnn.gw2", w2.grad), save("cnn.gb2", b2.grad)


for fn in (case_conv2d, case_max_pool, case_batch_norm, case_batch_norm_act, case_layer_norm, case_cross_entropy, case_softmax, case_gelu,
           case_linear, case_embedding, case_cnn, case_resnet):
    fn()

manifest = {}
for name, arr in OUT.items():
    arr.astype(np.float64).tofile(os.path.join(DIR, "out_" + name + ".bin"))
    manifest[name] = {"shape": list(arr.shape), "dtype": "f64"}
with open(os.path.join(DIR, "outputs.json"), "w") as f:
    json.dump(manifest, f)
