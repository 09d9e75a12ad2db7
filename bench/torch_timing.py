"""The timer every PyTorch peer in bench/ uses, so that all of them time alike: CUDA events around
each call after `warmup` calls, the median of `reps`, in milliseconds (as Kiln's benchmarks)."""
import torch


def time_ms(fn, warmup=3, reps=10):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(reps):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    ms.sort()
    return ms[len(ms) // 2]
