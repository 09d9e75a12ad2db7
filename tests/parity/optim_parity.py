#!/usr/bin/env python3
"""Runs torch.optim on deterministic parameters and gradients and prints the parameters after
each step as JSON, for tests/optim/optim_test.cpp (which builds the same values in C++).

usage: optim_parity.py '<json list of configs>'   (prints a list of histories)
config: {"optimizer": "sgd" | "adam" | "adamw", "steps": N, "shapes": [[3, 4], [5]],
         "kwargs": {... torch.optim keyword arguments ...},
         "round_init": bool, "round_grads": bool}   (optional: initial values / gradients rounded
                                                      to bf16, as for bf16 parameters with fp32
                                                      master weights and bf16 gradients)
Values (float32): param j, element i = sin(0.7 i + 1.3 j);
gradient at step s (0-based) = 0.5 cos(0.3 i (s + 1) + j).
Exit code 77 when torch is missing (the test skips)."""
import json
import math
import sys

try:
    import torch
except ImportError:
    sys.exit(77)


def run(cfg):
    params = []
    for j, shape in enumerate(cfg["shapes"]):
        n = math.prod(shape)
        vals = [math.sin(0.7 * i + 1.3 * j) for i in range(n)]
        t = torch.tensor(vals, dtype=torch.float32)
        if cfg.get("round_init"):
            t = t.to(torch.bfloat16).to(torch.float32)
        params.append(t.reshape(shape).requires_grad_())
    cls = {"sgd": torch.optim.SGD, "adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[cfg["optimizer"]]
    opt = cls(params, **cfg["kwargs"])
    history = []
    for s in range(cfg["steps"]):
        for j, p in enumerate(params):
            n = p.numel()
            g = [0.5 * math.cos(0.3 * i * (s + 1) + j) for i in range(n)]
            grad = torch.tensor(g, dtype=torch.float32)
            if cfg.get("round_grads"):
                grad = grad.to(torch.bfloat16).to(torch.float32)
            p.grad = grad.reshape(p.shape)
        opt.step()
        history.append([p.detach().reshape(-1).tolist() for p in params])
    return history


def main():
    print(json.dumps([run(cfg) for cfg in json.loads(sys.argv[1])]))


if __name__ == "__main__":
    main()
