#!/usr/bin/env python3
"""Checks a `kiln export-hf` directory without transformers: runs HF's math (the plain-torch
LlamaModel / GPT2Model / Mixtral / DeepseekV3 of make_hf_fixture.py) on the exported HF tensors and compares the logits
with the ones `kiln generate --dump-logits` wrote from the Kiln checkpoint. The CPU stand-in for
check_hf_export.py (which uses transformers itself, on the H200 machine).

usage: hf_forward_check.py HF_DIR REFERENCE.safetensors   (exit 1 when the rel. err > 1e-5)"""
import json
import math
import os
import struct
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_hf_fixture import deepseek_forward, gpt2_forward, llama_forward, mixtral_forward  # noqa: E402

FORWARDS = {"LlamaForCausalLM": llama_forward, "GPT2LMHeadModel": gpt2_forward,
            "MixtralForCausalLM": mixtral_forward, "DeepseekV3ForCausalLM": deepseek_forward}

DTYPES = {"F32": (torch.float32, 4), "I64": (torch.int64, 8), "BF16": (torch.bfloat16, 2)}


def read_safetensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    body = data[8 + n:]
    out = {}
    for name, info in header.items():
        dtype, size = DTYPES[info["dtype"]]
        begin, end = info["data_offsets"]
        count = math.prod(info["shape"]) if info["shape"] else 1
        assert end - begin == count * size, name
        out[name] = torch.frombuffer(bytearray(body[begin:end]), dtype=dtype).reshape(info["shape"]).clone()
    return out


def main():
    hf_dir, reference = sys.argv[1], sys.argv[2]
    cfg = json.load(open(os.path.join(hf_dir, "config.json")))
    w = {k: v.float() for k, v in read_safetensors(os.path.join(hf_dir, "model.safetensors")).items()}
    ref = read_safetensors(reference)
    forward = FORWARDS[cfg["architectures"][0]]
    with torch.no_grad():
        logits = forward(cfg, w, ref["tokens"])
    kiln = ref["logits"][..., : cfg["vocab_size"]]
    rel = ((logits - kiln).norm() / kiln.norm()).item()
    print("%s: HF math on the exported tensors vs Kiln's logits: rel. err %.2e" % (cfg["architectures"][0], rel))
    return 0 if rel <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
