#!/usr/bin/env python3
"""PyTorch peer of bench_cpu_cnn: the same SimpleCNN forward + backward on the CPU.
Usage: cpu_cnn_torch.py [batch] [iterations] [threads]"""
import json
import sys
import time

import torch
import torch.nn.functional as F

batch = int(sys.argv[1]) if len(sys.argv) > 1 else 128
iters = int(sys.argv[2]) if len(sys.argv) > 2 else 10
if len(sys.argv) > 3:
    torch.set_num_threads(int(sys.argv[3]))
g = torch.Generator().manual_seed(0)


def param(*shape, scale):
    return (torch.randn(*shape, generator=g) * scale).requires_grad_()


w1, b1 = param(32, 3, 3, 3, scale=0.2), param(32, scale=0.01)
w2, b2 = param(64, 32, 3, 3, scale=0.05), param(64, scale=0.01)
w3, b3 = param(128, 64 * 8 * 8, scale=0.01), param(128, scale=0.01)
w4, b4 = param(10, 128, scale=0.1), param(10, scale=0.01)
x = torch.randn(batch, 3, 32, 32, generator=g)
target = torch.arange(batch) % 10
fwd, step = [], []
for it in range(iters + 2):
    for p in (w1, b1, w2, b2, w3, b3, w4, b4):
        p.grad = None
    t0 = time.perf_counter()
    h = F.max_pool2d(F.relu(F.conv2d(x, w1, b1, padding=1)), 2)
    h = F.max_pool2d(F.relu(F.conv2d(h, w2, b2, padding=1)), 2)
    h = F.relu(F.linear(h.flatten(1), w3, b3))
    loss = F.cross_entropy(F.linear(h, w4, b4), target)
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    if it >= 2:
        fwd.append((t1 - t0) * 1e3)
        step.append((t2 - t0) * 1e3)
fwd.sort()
step.sort()
print(json.dumps({"impl": "torch", "threads": torch.get_num_threads(), "batch": batch,
                  "forward_ms": round(fwd[len(fwd) // 2], 2), "step_ms": round(step[len(step) // 2], 2)}))
