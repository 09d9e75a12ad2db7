#!/usr/bin/env python3
"""Megatron-LM's own code against Kiln's Megatron .bin/.idx files, both ways.

    python3 tests/data/megatron_interop.py --megatron DIR --kiln-prefix PREFIX --docs docs.jsonl \
        --vocab vocab.json --merges merges.txt --out OUT

--megatron: a folder holding Megatron-LM's `megatron/` package (a snapshot of NVIDIA/Megatron-LM;
never part of Kiln). Needs torch, numpy and Hugging Face `tokenizers` (the H200 machine has them).

1. The ids: each document of docs.jsonl ({"text": ...} a line) encoded by Hugging Face `tokenizers`
   (GPT-2 BPE from vocab.json + merges.txt, byte-level, no prefix space) plus GPT-2's end-of-document
   id, as `kiln preprocess-data --append-eod` writes them.
2. Megatron reads Kiln: megatron.core.datasets.indexed_dataset.IndexedDataset(PREFIX) must hold one
   sequence per document, equal to those ids, with dtype uint16 and document_indices 0..n.
3. Kiln reads Megatron: IndexedDatasetBuilder writes the same ids (every third document split into
   two sequences, so that document_indices differ from sequence indices) to
   OUT/megatron_text_document.{bin,idx}; OUT/ids.json records the ids and the sequence lengths, for
   tests/data/megatron_fixture_test.cpp to check Kiln's reader and writer against, byte for byte.
Exits 1 on any mismatch.
"""
import argparse
import json
import os
import subprocess
import sys

GPT2_EOD = 50256


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    for a in ("--megatron", "--kiln-prefix", "--docs", "--vocab", "--merges", "--out"):
        ap.add_argument(a, required=True)
    args = ap.parse_args()
    sys.path.insert(0, os.path.abspath(args.megatron))
    import numpy
    import tokenizers
    import torch
    from megatron.core.datasets.indexed_dataset import IndexedDataset, IndexedDatasetBuilder
    from tokenizers import models, pre_tokenizers

    tok = tokenizers.Tokenizer(models.BPE.from_file(args.vocab, args.merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    texts = [json.loads(line)["text"] for line in open(args.docs, encoding="utf-8") if line.strip()]
    ids = [tok.encode(t, add_special_tokens=False).ids + [GPT2_EOD] for t in texts]

    ok = True
    kiln = IndexedDataset(args.kiln_prefix)
    if len(kiln) != len(ids):
        print(f"Megatron reads {len(kiln)} sequences from Kiln's files; {len(ids)} documents expected")
        ok = False
    for i, expected in enumerate(ids[: len(kiln)]):
        got = kiln[i].tolist()
        if got != expected:
            print(f"document {i}: Megatron reads {got[:12]}..., expected {expected[:12]}...")
            ok = False
    if kiln.index.dtype != numpy.uint16:
        print(f"Kiln's dtype reads as {kiln.index.dtype}; Megatron writes GPT-2 ids as uint16")
        ok = False
    if list(kiln.document_indices) != list(range(len(ids) + 1)):
        print(f"document_indices {list(kiln.document_indices)[:10]}... expected 0..{len(ids)}")
        ok = False
    print(f"Megatron's IndexedDataset read Kiln's {len(kiln)} sequences: {'identical' if ok else 'MISMATCH'}")

    os.makedirs(args.out, exist_ok=True)
    prefix = os.path.join(args.out, "megatron_text_document")
    builder = IndexedDatasetBuilder(prefix + ".bin", dtype=numpy.uint16)
    lengths = []
    for i, doc in enumerate(ids):
        split = [len(doc) // 2, len(doc) - len(doc) // 2] if i % 3 == 0 and len(doc) >= 4 else [len(doc)]
        builder.add_document(torch.tensor(doc), split)
        lengths.append(split)
    builder.finalize(prefix + ".idx")
    back = IndexedDataset(prefix)
    flat = [s for doc, split in zip(ids, lengths) for s in
            ([doc[: split[0]], doc[split[0]:]] if len(split) == 2 else [doc])]
    if [back[i].tolist() for i in range(len(back))] != flat:
        print("Megatron does not read back what its builder wrote")
        ok = False
    try:
        commit = subprocess.run(["git", "-C", args.megatron, "rev-parse", "HEAD"], capture_output=True,
                                text=True).stdout.strip()
    except OSError:
        commit = ""
    with open(os.path.join(args.out, "ids.json"), "w") as f:
        json.dump({"eod": GPT2_EOD, "dtype": "uint16", "documents": ids, "sequence_lengths": lengths,
                   "tokenizers_version": tokenizers.__version__, "torch_version": torch.__version__,
                   "megatron": os.environ.get("MEGATRON_COMMIT", commit)}, f)
    print(f"Megatron's IndexedDatasetBuilder wrote {len(ids)} documents, {len(flat)} sequences to {prefix}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
