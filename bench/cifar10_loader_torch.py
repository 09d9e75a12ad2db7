#!/usr/bin/env python3
"""The PyTorch peer of bench_cifar10_loader: the same work (uint8 NCHW CIFAR-10 -> shuffled batches
of 128 normalised float32 images, with and without 4-pixel-padded random crop + horizontal flip) in
PyTorch on the CPU, two ways: per image, as torchvision's transforms do it inside a DataLoader
worker, and batched (one vectorised op per batch), the fastest plain-PyTorch way.
Usage: python3 bench/cifar10_loader_torch.py [DATA_DIR]   (Debian's python3-torch; one thread)."""
import os
import sys
import time

import torch
import torch.nn.functional as F

torch.set_num_threads(1)
data_dir = sys.argv[1] if len(sys.argv) > 1 else "data/cifar10"
batches = os.path.join(data_dir, "cifar-10-batches-bin")
raw = b"".join(open(os.path.join(batches, f"data_batch_{i}.bin"), "rb").read() for i in range(1, 6))
records = torch.frombuffer(bytearray(raw), dtype=torch.uint8).view(50000, 3073)
images = records[:, 1:].reshape(50000, 3, 32, 32).contiguous()
labels = records[:, 0].long()
mean = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
std = torch.tensor([0.5, 0.5, 0.5]).view(3, 1, 1)
g = torch.Generator().manual_seed(0)


def per_image(augment, limit):
    order = torch.randperm(50000, generator=g)[:limit]
    for start in range(0, limit, 128):
        out = []
        for i in order[start:start + 128].tolist():
            x = images[i]
            if augment:
                x = F.pad(x, (4, 4, 4, 4))
                dy, dx = torch.randint(0, 9, (2,), generator=g).tolist()
                x = x[:, dy:dy + 32, dx:dx + 32]
                if torch.rand(1, generator=g).item() < 0.5:
                    x = x.flip(2)
            out.append((x.float() / 255 - mean) / std)
        yield torch.stack(out), labels[order[start:start + 128]]


def batched(augment, limit):
    order = torch.randperm(50000, generator=g)[:limit]
    rows = torch.arange(32).view(1, 32, 1)
    cols = torch.arange(32).view(1, 1, 32)
    for start in range(0, limit, 128):
        idx = order[start:start + 128]
        x = images[idx].float() / 255
        if augment:
            n = len(idx)
            x = F.pad(x, (4, 4, 4, 4))
            dy = torch.randint(0, 9, (n, 1, 1), generator=g)
            dx = torch.randint(0, 9, (n, 1, 1), generator=g)
            flip = torch.rand(n, 1, 1, generator=g) < 0.5
            c = torch.where(flip, 31 - cols, cols) + dx
            r = rows + dy
            x = x[torch.arange(n).view(n, 1, 1, 1), torch.arange(3).view(1, 3, 1, 1), r.unsqueeze(1), c.unsqueeze(1)]
        yield (x - mean) / std, labels[idx]


print(f"PyTorch {torch.__version__}, 1 thread")
print(f"{'method':>10} {'augment':>8} {'images/s':>12}")
for name, fn, limit in (("per-image", per_image, 10000), ("batched", batched, 50000)):
    for augment in (False, True):
        for _ in fn(augment, 1280):  # warm-up
            pass
        t = time.perf_counter()
        n = sum(len(y) for _, y in fn(augment, limit))
        print(f"{name:>10} {'yes' if augment else 'no':>8} {n / (time.perf_counter() - t):>12.0f}")
