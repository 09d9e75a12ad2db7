#!/usr/bin/env python3
"""Writes tests/data/fixtures/tokenizer_ids.jsonl: token ids from the reference tokenizers for a
varied sample of text, so CI checks Kiln's ids without the network peers or a GPU machine.

    python3 tests/data/make_tokenizer_fixture.py --tokenizers data/tokenizers --out FILE [--documents 320]

Runs where `tiktoken` and Hugging Face `tokenizers` are installed (the H200 machine; no network: the
peers are built from the same local files `kiln data tokenizers` fetches, as bench/tokenizer_peers.py
does). Documents: bench/make_tokenizer_corpus.py's mix (English, Shakespeare, source code, CJK, emoji
with ZWJ and skin tones, other scripts, combining marks, rare Unicode whitespace, long whitespace
runs, special-token spellings, repaired broken UTF-8), each cut to at most --max-chars characters.
For GPT-2 the ids of tiktoken (encode_ordinary) and tokenizers (BPE + ByteLevel) must agree; for
Llama 3 those of tokenizers (tokenizer.json, no added specials) and tiktoken (special tokens
allowed) must agree; a disagreement stops it. The first line records the files' SHA-256 and the
peers' versions; each further line is {"text", "gpt2", "llama3"}.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
BENCH = os.path.join(HERE, "..", "..", "bench")
sys.path.insert(0, BENCH)


def sha256(path):
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokenizers", default="data/tokenizers")
    ap.add_argument("--out", required=True)
    ap.add_argument("--documents", type=int, default=320)
    ap.add_argument("--max-chars", type=int, default=1200)
    args = ap.parse_args()
    from tokenizer_peers import load_peers  # bench/tokenizer_peers.py

    peers, _, _, versions = load_peers(args.tokenizers)
    with tempfile.TemporaryDirectory() as tmp:
        corpus = os.path.join(tmp, "corpus.jsonl")
        subprocess.run([sys.executable, os.path.join(BENCH, "make_tokenizer_corpus.py"), "--mb", "1.5", "--out",
                        corpus, "--seed", "15"], check=True, stdout=subprocess.DEVNULL)
        texts = [json.loads(l)["text"] for l in open(corpus, encoding="utf-8") if l.strip()]
    docs = [t[: args.max_chars] for t in texts if t.strip()][: args.documents]
    files = {"gpt2/vocab.json": None, "gpt2/merges.txt": None, "llama3/tokenizer.json": None}
    for f in files:
        files[f] = sha256(os.path.join(args.tokenizers, f))
    rows = []
    for i, text in enumerate(docs):
        row = {"text": text}
        for name in ("gpt2", "llama3"):
            got = {peer: list(enc(text)) for peer, (enc, _) in peers[name].items()}
            first, *rest = got.values()
            if any(r != first for r in rest):
                sys.exit(f"document {i}: the {name} peers disagree: " + ", ".join(f"{p}: {v[:10]}" for p, v in got.items()))
            row[name] = first
        rows.append(row)
    tmp_out = args.out + ".tmp"
    with open(tmp_out, "w", encoding="utf-8") as f:
        f.write(json.dumps({"files_sha256": files, "peers": versions, "documents": len(rows),
                            "recipe": "tests/data/make_tokenizer_fixture.py"}) + "\n")
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False) + "\n")
    os.replace(tmp_out, args.out)
    print(f"{args.out}: {len(rows)} documents, {sum(len(r['gpt2']) for r in rows)} GPT-2 and "
          f"{sum(len(r['llama3']) for r in rows)} Llama 3 ids; peers {versions}")


if __name__ == "__main__":
    main()
