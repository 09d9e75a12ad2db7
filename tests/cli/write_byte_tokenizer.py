#!/usr/bin/env python3
"""write_byte_tokenizer.py DIR: a byte-level GPT-2 tokenizer in DIR (vocab.json: the 256 byte tokens
under GPT-2's byte-to-unicode names and <|endoftext|> = 256; merges.txt: no merges), so the CLI flows
tokenize text without fetching anything."""
import json
import sys

# GPT-2's byte-to-unicode table: printable bytes map to themselves, the rest to 256 + n.
bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
cs = bs[:]
n = 0
for b in range(256):
    if b not in bs:
        bs.append(b)
        cs.append(256 + n)
        n += 1
byte_to_char = dict(zip(bs, (chr(c) for c in cs)))
vocab = {byte_to_char[b]: b for b in range(256)}
vocab["<|endoftext|>"] = 256
json.dump(vocab, open(sys.argv[1] + "/vocab.json", "w"))
open(sys.argv[1] + "/merges.txt", "w").write("#version: 0.2\n")
