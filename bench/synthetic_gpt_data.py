#!/usr/bin/env python3
"""Writes a Megatron-format GPT dataset (<prefix>.bin / <prefix>.idx, MMIDIDX version 1) of uniformly
random token ids, for speed runs of `kiln pretrain-gpt` where the text does not matter (the time of a
step does not depend on which tokens it sees). Like Megatron's --mock-data, it is never a learning run.

  python3 bench/synthetic_gpt_data.py PREFIX [--vocab 50257] [--documents 2048] [--doc-tokens 4096] [--seed 0]
"""
import argparse
import struct

import numpy as np


def main():
    p = argparse.ArgumentParser()
    p.add_argument("prefix")
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--documents", type=int, default=2048)
    p.add_argument("--doc-tokens", type=int, default=4096)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    if a.vocab > 65535:
        raise SystemExit("--vocab: this writer stores uint16 ids (vocabularies up to 65535)")
    rng = np.random.default_rng(a.seed)
    tokens = rng.integers(0, a.vocab, size=(a.documents, a.doc_tokens), dtype=np.uint16)
    with open(a.prefix + ".bin", "wb") as f:
        f.write(tokens.tobytes())
    sizes = np.full(a.documents, a.doc_tokens, dtype=np.int32)
    pointers = np.arange(a.documents, dtype=np.int64) * a.doc_tokens * 2
    doc_idx = np.arange(a.documents + 1, dtype=np.int64)
    with open(a.prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00")
        f.write(struct.pack("<Q", 1))
        f.write(struct.pack("<B", 8))  # dtype code 8: uint16
        f.write(struct.pack("<Q", a.documents))
        f.write(struct.pack("<Q", a.documents + 1))
        f.write(sizes.tobytes())
        f.write(pointers.tobytes())
        f.write(doc_idx.tobytes())
    print(f"wrote {a.prefix}.bin/.idx: {a.documents} documents x {a.doc_tokens} tokens, vocab {a.vocab}")


if __name__ == "__main__":
    main()
