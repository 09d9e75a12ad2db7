#!/usr/bin/env python3
"""PyTorch peer for the CIFAR-10 benchmarks (run on the same machine, in the same script as Kiln).

  steps [STEPS] [VARIANTS] [ROUNDS] [CASES]: training-step images/s with data on the device (the cases of
         bench_cifar10_train_step), fused Adam, TF32 off; VARIANTS eager and/or compile (max-autotune)
  epoch DATA_DIR [EPOCHS] [cuda|cpu]: end-to-end epochs of simple_cnn (batch 64, fused Adam 1e-3, per-image
         crop+flip on the GPU, test evaluation after each epoch outside the timer), as `kiln train-cifar10`
         runs and times them
Prints JSON lines with the same keys as Kiln's benchmarks.
"""
import json
import os
import sys
import time

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 32, 3, padding=1)
        self.conv2 = nn.Conv2d(32, 64, 3, padding=1)
        self.conv3 = nn.Conv2d(64, 128, 3, padding=1)
        self.fc1 = nn.Linear(2048, 512)
        self.fc2 = nn.Linear(512, 256)
        self.fc3 = nn.Linear(256, 10)
        self.drop = nn.Dropout(0.5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        x = x.flatten(1)
        x = self.drop(F.relu(self.fc1(x)))
        x = self.drop(F.relu(self.fc2(x)))
        return self.fc3(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = nn.Sequential()
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

    def forward(self, x):
        h = F.relu(self.bn1(self.conv1(x)))
        h = self.bn2(self.conv2(h))
        return F.relu(h + self.shortcut(x))


class ResNet18(nn.Module):
    """Kiln's models::CifarResNet, module names included (its state dict loads into this one);
    tests/parity/torch_reference.py checks Kiln's simple_resnet against it (widths 64, 128, 256)."""

    def __init__(self, widths=(64, 128, 256, 512)):
        super().__init__()
        self.stem = nn.Conv2d(3, widths[0], 3, 1, 1, bias=False)
        self.stem_bn = nn.BatchNorm2d(widths[0])
        blocks, cin = [], widths[0]
        for s, w in enumerate(widths):
            for b in range(2):
                blocks.append(BasicBlock(cin, w, 2 if s > 0 and b == 0 else 1))
                cin = w
        self.stages = nn.Sequential(*blocks)
        self.fc = nn.Linear(cin, 10)

    def forward(self, x):
        x = F.relu(self.stem_bn(self.stem(x)))
        x = self.stages(x)
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


def steps_mode(steps=200, warmup=20, variants=("eager",), rounds=1, only=None):
    """The peer at its best, as a user chasing speed runs it: fused Adam (fused=True), cuDNN autotuning,
    channels-last for ResNet-18, and per variant either eager or torch.compile(mode="max-autotune"),
    which autotunes the kernels and replays CUDA graphs. TF32 is off on both sides (Kiln's f32 is true
    FP32 unless KILN_ALLOW_TF32=1), so fp32 rows compare FP32 with FP32. Warm-up steps (compilation
    included) run before the timer; CUDA events time the steps; rounds alternate the variants."""
    dev = "cuda"
    # KILN_PROFILE_TIMED=1: cudaProfilerStart/Stop around the timed steps, for `ncu --profile-from-start off`
    profile = os.environ.get("KILN_PROFILE_TIMED") == "1"
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    cases = [("simple_cnn", 64, False), ("simple_cnn", 512, False), ("resnet18", 512, True)]
    if only:
        cases = [c for c in cases if f"{c[0]}:{c[1]}" in only]
    for name, batch, bf16 in cases:
        runners = {}
        for variant in variants:
            torch.manual_seed(0)
            model = (SimpleCNN() if name == "simple_cnn" else ResNet18()).to(dev)
            cl = name == "resnet18"
            if cl:
                model = model.to(memory_format=torch.channels_last)
            opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=True)
            fwd = torch.compile(model, mode="max-autotune") if variant == "compile" else model
            x = torch.randn(batch, 3, 32, 32, device=dev)
            if cl:
                x = x.to(memory_format=torch.channels_last)
            y = torch.arange(batch, device=dev) % 10

            def step(fwd=fwd, opt=opt, x=x, y=y):
                with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
                    loss = F.cross_entropy(fwd(x).float(), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()

            t0 = time.perf_counter()
            for _ in range(warmup if variant == "eager" else max(warmup, 30)):
                step()
            torch.cuda.synchronize()
            runners[variant] = (step, cl, time.perf_counter() - t0)
        n = steps // 4 if name == "resnet18" else steps
        for r in range(rounds):
            for variant, (step, cl, warm_s) in runners.items():
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                if profile:
                    torch.cuda.profiler.start()
                a.record()
                for _ in range(n):
                    step()
                b.record()
                torch.cuda.synchronize()
                if profile:
                    torch.cuda.profiler.stop()
                ips = n * batch / (a.elapsed_time(b) / 1000)
                print(json.dumps({"bench": "cifar10_train_step", "impl": "torch" if variant == "eager" else "torch_compile",
                                  "mode": "eager" if variant == "eager" else "max-autotune", "optimizer": "Adam(fused=True)",
                                  "tf32": False, "round": r, "warmup_seconds": round(warm_s, 1), "model": name,
                                  "batch": batch, "precision": "bf16" if bf16 else "fp32", "channels_last": cl,
                                  "images_per_second": round(ips, 1)}), flush=True)


def load_split(data_dir, files):
    raw = np.concatenate([np.fromfile(os.path.join(data_dir, f), dtype=np.uint8).reshape(-1, 3073) for f in files])
    return torch.from_numpy(raw[:, 1:].reshape(-1, 3, 32, 32).copy()), torch.from_numpy(raw[:, 0].astype(np.int64))


def epoch_mode(data_dir, epochs=5, batch=64, seed=0, dev="cuda"):
    torch.backends.cudnn.benchmark = True
    torch.manual_seed(seed)
    xtr, ytr = load_split(data_dir, [f"data_batch_{i}.bin" for i in range(1, 6)])
    xte, yte = load_split(data_dir, ["test_batch.bin"])
    xtr, ytr, xte, yte = xtr.to(dev), ytr.to(dev), xte.to(dev), yte.to(dev)
    model = SimpleCNN().to(dev)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3, fused=dev == "cuda")
    norm = lambda u8: (u8.float() / 255 - 0.5) / 0.5
    ar = torch.arange(32, device=dev)
    chan = torch.arange(3, device=dev)[None, :, None, None]
    for epoch in range(1, epochs + 1):
        if dev == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        model.train()
        perm = torch.randperm(xtr.shape[0], device=dev)
        steps = xtr.shape[0] // batch
        for s in range(steps):
            idx = perm[s * batch:(s + 1) * batch]
            # Per image, as Kiln's augment_images: a random 32x32 crop of the 4-padded image and a
            # random horizontal flip, then normalisation.
            xp = F.pad(xtr[idx], (4, 4, 4, 4))
            dy, dx = torch.randint(0, 9, (2, batch, 1), device=dev)
            flip = torch.rand(batch, 1, device=dev) < 0.5
            cols = torch.where(flip, 31 - ar, ar) + dx
            rows = ar + dy
            xb = xp[torch.arange(batch, device=dev)[:, None, None, None], chan, rows[:, None, :, None],
                    cols[:, None, None, :]]
            loss = F.cross_entropy(model(norm(xb)), ytr[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        # The timer covers training only, as Kiln's epoch_seconds: evaluation runs after it.
        if dev == "cuda":
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        model.eval()
        correct = 0
        with torch.no_grad():
            for s in range(0, xte.shape[0], 1000):
                correct += (model(norm(xte[s:s + 1000])).argmax(1) == yte[s:s + 1000]).sum().item()
        print(json.dumps({"bench": "cifar10_epoch", "impl": "torch", "device": dev, "model": "simple_cnn", "batch": batch,
                          "optimizer": "Adam(fused=True)", "augmentation": "per-image crop+flip on the device",
                          "timer": "training only", "epoch": epoch, "epoch_seconds": round(seconds, 3),
                          "test_accuracy": correct / xte.shape[0]}), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "steps":
        # steps [STEPS] [VARIANTS] [ROUNDS] [CASES]: resnet18 runs STEPS / 4, as bench_cifar10_train_step;
        # VARIANTS "eager,compile"; CASES e.g. "resnet18:512,simple_cnn:64" (default: all).
        steps_mode(steps=int(sys.argv[2]) if len(sys.argv) > 2 else 200,
                   variants=tuple(sys.argv[3].split(",")) if len(sys.argv) > 3 else ("eager",),
                   rounds=int(sys.argv[4]) if len(sys.argv) > 4 else 1,
                   only=set(sys.argv[5].split(",")) if len(sys.argv) > 5 else None)
    else:  # epoch DATA_DIR [EPOCHS] [DEVICE]
        epoch_mode(sys.argv[2], epochs=int(sys.argv[3]) if len(sys.argv) > 3 else 5,
                   dev=sys.argv[4] if len(sys.argv) > 4 else "cuda")
