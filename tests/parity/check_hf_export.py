#!/usr/bin/env python3
"""Checks a `kiln export-hf` directory with Hugging Face transformers (run where transformers is
installed: the H200 machine). Loads HF_DIR with AutoModelForCausalLM (and AutoTokenizer), runs the
token ids Kiln ran, and compares the logits with Kiln's, which
  kiln generate --load CKPT --prompt TEXT --dump-logits REFERENCE.safetensors
writes (the prompt's ids, and the logits of one forward pass over them, before any sampling).

usage: check_hf_export.py HF_DIR REFERENCE.safetensors [--tolerance 1e-4] [--prompt TEXT]
  HF_DIR                  what `kiln export-hf --out` wrote
  REFERENCE.safetensors   tokens [B, T] (int64) and Kiln's logits [B, T, Vpad] (float32); the
                          padded vocabulary columns beyond config.vocab_size are ignored
prints the relative error ||hf - kiln|| / ||kiln|| of the logits (over the tokenizer's vocabulary),
the largest absolute difference, whether the argmax agrees everywhere, and exits 1 past the
tolerance. With --prompt it also checks that the exported tokenizer encodes TEXT to the ids Kiln's
tokenizer gave (REFERENCE must then hold "prompt_ids" int64 [N])."""
import argparse
import json
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("hf_dir")
    ap.add_argument("reference")
    ap.add_argument("--tolerance", type=float, default=1e-4)
    ap.add_argument("--prompt")
    ap.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    args = ap.parse_args()

    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    ref = load_file(args.reference)
    tokens, kiln_logits = ref["tokens"].long(), ref["logits"].float()
    config = json.load(open(args.hf_dir + "/config.json"))
    vocab = config["vocab_size"]
    dtype = torch.float32 if args.dtype == "float32" else torch.bfloat16
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, torch_dtype=dtype)
    model.eval()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device)
    with torch.no_grad():
        hf_logits = model(tokens.to(device)).logits.float().cpu()
    ours = kiln_logits[..., :vocab]
    assert hf_logits.shape == ours.shape, "shapes differ: transformers %s, Kiln %s" % (hf_logits.shape, ours.shape)
    rel = ((hf_logits - ours).norm() / ours.norm()).item()
    max_abs = (hf_logits - ours).abs().max().item()
    argmax_agree = (hf_logits.argmax(-1) == ours.argmax(-1)).float().mean().item()
    print("%s: %s, logits rel. err %.3e, max abs diff %.3e, argmax agreement %.4f"
          % (args.hf_dir, config["architectures"][0], rel, max_abs, argmax_agree))
    ok = rel <= args.tolerance

    if args.prompt is not None:
        tok = AutoTokenizer.from_pretrained(args.hf_dir)
        ids = tok(args.prompt, add_special_tokens=False)["input_ids"]
        want = ref["prompt_ids"].tolist()
        same = ids == want
        print("tokenizer: transformers %s Kiln's ids for the prompt" % ("gives" if same else "does NOT give"))
        ok = ok and same
    if not ok:
        print("FAILED (tolerance %.1e)" % args.tolerance)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    sys.exit(main())
