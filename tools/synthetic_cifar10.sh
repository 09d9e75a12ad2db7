#!/usr/bin/env bash
# synthetic_cifar10.sh DIR: a CIFAR-format dataset (DIR/cifar-10-batches-bin) with 600 learnable
# records per batch file and zeros after them, for runs where the real data is not at hand (the
# same files tests/cli/cifar10_flow.sh makes when npm is unreachable).
set -euo pipefail
python3 - "$1/cifar-10-batches-bin" <<'PY'
import os, random, sys
d = sys.argv[1]
os.makedirs(d, exist_ok=True)
rng = random.Random(0)
names = [f"data_batch_{i}.bin" for i in range(1, 6)] + ["test_batch.bin"]
for name in names:
    with open(os.path.join(d, name), "wb") as f:
        for i in range(600):  # a real slice is 600 records; the rest of the file is zeros
            label = i % 10
            # class-dependent colour so the model has something to learn
            f.write(bytes([label]) + bytes((label * 25 + rng.randrange(40)) % 256 for _ in range(3072)))
        f.truncate(30730000)
with open(os.path.join(d, "batches.meta.txt"), "w") as f:
    f.write("\n".join("airplane automobile bird cat deer dog frog horse ship truck".split()) + "\n")
PY
