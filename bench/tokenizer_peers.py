#!/usr/bin/env python3
"""Kiln's tokenizers next to Hugging Face `tokenizers` and `tiktoken`: identical ids, and speed.

    python3 bench/tokenizer_peers.py --kiln-build build --tokenizers data/tokenizers --out out/tokenizer

Needs python3 with numpy, tokenizers and tiktoken (the H200 machine has them; no network is used:
the peers are built from the same local files Kiln reads), a Kiln build (kiln + bench_tokenizer),
and the files of `kiln data tokenizers` (llama3/tokenizer.json, gpt2/vocab.json + merges.txt).

1. Writes a varied corpus (bench/make_tokenizer_corpus.py: English, code, CJK, emoji, other
   scripts, rare whitespace, long whitespace runs, special-token spellings, repaired broken UTF-8)
   of --mb megabytes, and the raw broken-UTF-8 documents.
2. Correctness: `kiln preprocess-data` on the corpus with each tokenizer; the .bin/.idx are read
   back here with numpy from the format (not with Kiln), and every document's ids are compared with
     GPT-2:   tiktoken (r50k_base rules: encode_ordinary) and tokenizers (BPE + ByteLevel);
     Llama 3: tokenizers (tokenizer.json, add_special_tokens=False) and tiktoken (ranks = ids,
              the Llama 3 pattern, special tokens allowed).
   Round trip: the peers decode Kiln's ids back to the document's bytes; the raw broken-UTF-8
   documents (bytes no Python str can hold) are tokenized by Kiln and decoded to the same bytes.
3. Speed, one thread each, same documents, best of --repeat: bench_tokenizer (Kiln), tokenizers
   Tokenizer.encode (RAYON_NUM_THREADS=1), tiktoken encode.
4. preprocess-data scaling: the corpus repeated to ~--scale-mb MB, --workers 1 2 4 8 16.
Writes results.json and results.md (tables for docs/PERF.md) under --out; exits 1 on any mismatch.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
DTYPES = {1: np.uint8, 2: np.int8, 3: np.int16, 4: np.int32, 5: np.int64, 6: np.float64, 7: np.float32, 8: np.uint16}


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


BYTE_DECODER = {c: b for b, c in bytes_to_unicode().items()}


def token_bytes(spelled):
    return bytes(BYTE_DECODER[c] for c in spelled)


def read_indexed_dataset(prefix):
    """Megatron MMIDIDX v1, read from the format description: a list of per-document id arrays."""
    with open(prefix + ".idx", "rb") as f:
        idx = f.read()
    assert idx[:9] == b"MMIDIDX\x00\x00", f"{prefix}.idx: bad magic"
    version = int(np.frombuffer(idx, np.uint64, 1, 9)[0])
    assert version == 1, f"{prefix}.idx: version {version}"
    dtype = DTYPES[idx[17]]
    seqs = int(np.frombuffer(idx, np.uint64, 1, 18)[0])
    docs = int(np.frombuffer(idx, np.uint64, 1, 26)[0])
    off = 34
    lengths = np.frombuffer(idx, np.int32, seqs, off)
    off += 4 * seqs
    pointers = np.frombuffer(idx, np.int64, seqs, off)
    off += 8 * seqs
    doc_idx = np.frombuffer(idx, np.int64, docs, off)
    off += 8 * docs
    assert off == len(idx), f"{prefix}.idx: {len(idx) - off} trailing bytes"
    bin_ = np.memmap(prefix + ".bin", dtype=dtype, mode="r")
    itemsize = np.dtype(dtype).itemsize
    out = []
    for d in range(docs - 1):
        parts = [bin_[pointers[s] // itemsize: pointers[s] // itemsize + lengths[s]] for s in range(doc_idx[d], doc_idx[d + 1])]
        out.append(np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64))
    return out, np.dtype(dtype).name


def python_decoder(tok_dir, name):
    """ids -> bytes from the vocabulary files alone (no peer library): for the round-trip checks."""
    if name == "gpt2":
        vocab = json.load(open(os.path.join(tok_dir, "gpt2", "vocab.json"), encoding="utf-8"))
        table = {i: token_bytes(t) for t, i in vocab.items()}
    else:
        tj = json.load(open(os.path.join(tok_dir, "llama3", "tokenizer.json"), encoding="utf-8"))
        table = {i: token_bytes(t) for t, i in tj["model"]["vocab"].items()}
        table.update({a["id"]: a["content"].encode("utf-8") for a in tj["added_tokens"]})
    return lambda ids: b"".join(table[i] for i in ids)


def run(cmd, **kw):
    print("+", " ".join(cmd), flush=True)
    done = subprocess.run(cmd, text=True, capture_output=True, **kw)
    if done.returncode != 0:
        sys.exit(f"{cmd[0]} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return done.stdout


def load_peers(tok_dir):
    import tiktoken
    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers

    peers = {}
    vocab_path = os.path.join(tok_dir, "gpt2", "vocab.json")
    merges_path = os.path.join(tok_dir, "gpt2", "merges.txt")
    encoder = json.load(open(vocab_path, encoding="utf-8"))
    ranks = {token_bytes(t): i for t, i in encoder.items() if t != "<|endoftext|>"}
    tk_gpt2 = tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]})
    def make_hf_gpt2():
        tok = tokenizers.Tokenizer(models.BPE.from_file(vocab_path, merges_path))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        return tok

    hf_gpt2 = make_hf_gpt2()
    peers["gpt2"] = {
        "tiktoken": (lambda s: tk_gpt2.encode_ordinary(s), tk_gpt2.decode_bytes),
        "tokenizers": (lambda s: hf_gpt2.encode(s, add_special_tokens=False).ids, None),
    }

    tj_path = os.path.join(tok_dir, "llama3", "tokenizer.json")
    hf_llama = tokenizers.Tokenizer.from_file(tj_path)
    tj = json.load(open(tj_path, encoding="utf-8"))
    pattern = tj["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"]
    l_ranks = {token_bytes(t): i for t, i in tj["model"]["vocab"].items()}
    specials = {a["content"]: a["id"] for a in tj["added_tokens"]}
    tk_llama = tiktoken.Encoding("llama3-local", pat_str=pattern, mergeable_ranks=l_ranks, special_tokens=specials)
    peers["llama3"] = {
        "tokenizers": (lambda s: hf_llama.encode(s, add_special_tokens=False).ids, None),
        "tiktoken": (lambda s: tk_llama.encode(s, allowed_special="all", disallowed_special=()), tk_llama.decode_bytes),
    }
    factories = {
        ("gpt2", "tokenizers"): make_hf_gpt2,
        ("gpt2", "tiktoken"): lambda: tiktoken.Encoding("gpt2-local", pat_str=GPT2_PATTERN, mergeable_ranks=ranks,
                                                        special_tokens={"<|endoftext|>": encoder["<|endoftext|>"]}),
        ("llama3", "tiktoken"): lambda: tiktoken.Encoding("llama3-local", pat_str=pattern, mergeable_ranks=l_ranks,
                                                          special_tokens=specials),
        ("llama3", "tokenizers"): lambda: tokenizers.Tokenizer.from_file(tj_path),
    }
    versions = {"tokenizers": tokenizers.__version__, "tiktoken": getattr(tiktoken, "__version__", "?")}
    return peers, factories, hf_gpt2, versions


def first_difference(a, b):
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kiln-build", default="build")
    ap.add_argument("--tokenizers", default="data/tokenizers")
    ap.add_argument("--out", default=os.environ.get("OUT", "out/tokenizer"))
    ap.add_argument("--mb", type=float, default=12.0)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale-mb", type=float, default=400.0)
    ap.add_argument("--workers", default="1,2,4,8,16")
    ap.add_argument("--kiln-only", action="store_true", help="no peers (a machine without tokenizers/tiktoken)")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    kiln = os.path.join(args.kiln_build, "apps", "kiln", "kiln")
    bench = os.path.join(args.kiln_build, "bench", "bench_tokenizer")
    corpus = os.path.join(args.out, "corpus.jsonl")
    broken = os.path.join(args.out, "broken.txt")
    run([sys.executable, os.path.join(HERE, "make_tokenizer_corpus.py"), "--mb", str(args.mb), "--out", corpus,
         "--raw-out", broken])
    docs = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8") if line.strip()]
    raw_docs = [line.rstrip(b"\n") for line in open(broken, "rb")]
    raw_docs = [d for d in raw_docs if d.strip(b" \t\r")]
    total_bytes = sum(len(d.encode("utf-8")) for d in docs)
    if args.kiln_only:
        peers, factories, versions = {"gpt2": {}, "llama3": {}}, {}, {"tokenizers": "-", "tiktoken": "-"}
    else:
        peers, factories, _, versions = load_peers(args.tokenizers)
    specs = {
        "gpt2": ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(args.tokenizers, "gpt2", "vocab.json"),
                 "--merge-file", os.path.join(args.tokenizers, "gpt2", "merges.txt")],
        "llama3": ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model",
                   os.path.join(args.tokenizers, "llama3", "tokenizer.json")],
    }
    results = {"corpus_bytes": total_bytes, "documents": len(docs), "versions": versions, "correctness": {},
               "speed": {}, "scaling": {}}
    ok = True

    for name, spec in specs.items():
        prefix = os.path.join(args.out, f"kiln_{name}")
        run([kiln, "preprocess-data", "--input", corpus, "--output-prefix", prefix, "--workers", "16", *spec])
        kiln_docs, dtype = read_indexed_dataset(prefix + "_text_document")
        assert len(kiln_docs) == len(docs), f"{name}: {len(kiln_docs)} documents, corpus has {len(docs)}"
        entry = {"dtype": dtype, "tokens": int(sum(len(d) for d in kiln_docs))}
        decode = python_decoder(args.tokenizers, name)
        bad = sum(decode(ids.tolist()) != text.encode("utf-8") for text, ids in zip(docs, kiln_docs))
        entry["round_trip_failures"] = bad
        ok = ok and bad == 0
        for peer, (encode, decode_bytes) in peers[name].items():
            mismatches = []
            for i, (text, ids) in enumerate(zip(docs, kiln_docs)):
                theirs = encode(text)
                mine = ids.tolist()
                if mine != list(theirs):
                    j = first_difference(mine, theirs)
                    mismatches.append({"document": i, "position": j, "kiln": mine[max(0, j - 3): j + 5],
                                       peer: list(theirs[max(0, j - 3): j + 5])})
            entry[peer] = {"identical_documents": len(docs) - len(mismatches), "mismatched_documents": len(mismatches),
                           "examples": mismatches[:5]}
            ok = ok and not mismatches
            print(f"{name} vs {peer}: {len(docs) - len(mismatches)}/{len(docs)} documents identical", flush=True)
            if decode_bytes:
                bad = sum(decode_bytes(ids.tolist()) != text.encode("utf-8") for text, ids in zip(docs, kiln_docs))
                entry[peer]["round_trip_failures"] = bad
                ok = ok and bad == 0
        # Bytes that are not UTF-8: Kiln keeps them (byte-level BPE), the ids decode to the same bytes.
        raw_prefix = os.path.join(args.out, f"kiln_{name}_broken")
        run([kiln, "preprocess-data", "--input", broken, "--input-format", "text", "--text-documents", "line",
             "--output-prefix", raw_prefix, *spec])
        raw_ids, _ = read_indexed_dataset(raw_prefix + "_text_document")
        raw_bad = sum(decode(ids.tolist()) != raw.rstrip(b"\r") for ids, raw in zip(raw_ids, raw_docs))
        entry["broken_utf8"] = {"documents": len(raw_ids), "round_trip_failures": raw_bad + abs(len(raw_ids) - len(raw_docs))}
        ok = ok and entry["broken_utf8"]["round_trip_failures"] == 0
        results["correctness"][name] = entry

    for name, spec in specs.items():
        speed = {}
        out = run([bench, *spec, "--input", corpus, "--repeat", str(args.repeat)])
        speed["kiln"] = json.loads(out.strip().splitlines()[-1])["mb_per_s"]
        for peer in peers[name]:
            best = float("inf")
            for _ in range(args.repeat):
                # A fresh peer each time: its caches start cold, as Kiln's does in bench_tokenizer.
                obj = factories[(name, peer)]()
                if peer == "tiktoken":
                    enc = obj.encode_ordinary if name == "gpt2" else (
                        lambda s, o=obj: o.encode(s, allowed_special="all", disallowed_special=()))
                else:
                    enc = lambda s, o=obj: o.encode(s, add_special_tokens=False).ids  # noqa: E731
                start = time.perf_counter()
                for d in docs:
                    enc(d)
                best = min(best, time.perf_counter() - start)
            speed[peer] = total_bytes / best / 1e6
        results["speed"][name] = speed
        print(name, "MB/s per thread:", {k: round(v, 2) for k, v in speed.items()}, flush=True)

    big = os.path.join(args.out, "big.jsonl")
    with open(corpus, "rb") as f:
        block = f.read()
    copies = max(1, int(args.scale_mb * 1e6 / len(block)))
    with open(big, "wb") as f:
        for _ in range(copies):
            f.write(block)
    for name, spec in specs.items():
        rows = {}
        for w in [int(x) for x in args.workers.split(",")]:
            out = run([kiln, "preprocess-data", "--input", big, "--output-prefix", os.path.join(args.out, f"scale_{name}"),
                       "--workers", str(w), "--append-eod", *spec])
            m = re.search(r"([0-9.]+) MB in ([0-9.]+) s \(([0-9.]+) MB/s", out)
            rows[w] = {"mb": float(m.group(1)), "seconds": float(m.group(2)), "mb_per_s": float(m.group(3))}
            print(name, w, "workers:", rows[w], flush=True)
        results["scaling"][name] = rows
    os.remove(big)

    with open(os.path.join(args.out, "results.json"), "w") as f:
        json.dump(results, f, indent=1)
    md = [f"Corpus: {total_bytes / 1e6:.1f} MB, {len(docs)} documents (bench/make_tokenizer_corpus.py --mb {args.mb}); "
          f"tokenizers {versions['tokenizers']}, tiktoken {versions['tiktoken']}.", "",
          "| tokenizer | peer | identical documents | round trip |", "|---|---|---|---|"]
    for name, entry in results["correctness"].items():
        md.append(f"| {name} | Kiln decode (vocabulary bytes) | - | "
                  f"{'ok' if entry['round_trip_failures'] == 0 else entry['round_trip_failures']} |")
        for peer in peers[name]:
            e = entry[peer]
            md.append(f"| {name} | {peer} | {e['identical_documents']}/{len(docs)} | "
                      f"{'ok' if e.get('round_trip_failures', 0) == 0 else e['round_trip_failures']} |")
        md.append(f"| {name} | raw broken UTF-8 | - | {entry['broken_utf8']['documents']} documents, "
                  f"{entry['broken_utf8']['round_trip_failures']} failures |")
    md += ["", "| tokenizer | Kiln MB/s | tokenizers MB/s | tiktoken MB/s | Kiln / tokenizers | Kiln / tiktoken |",
           "|---|---|---|---|---|---|"]
    for name, s in results["speed"].items():
        if "tokenizers" in s:
            md.append(f"| {name} | {s['kiln']:.1f} | {s['tokenizers']:.1f} | {s['tiktoken']:.1f} | "
                      f"{s['kiln'] / s['tokenizers']:.2f}x | {s['kiln'] / s['tiktoken']:.2f}x |")
        else:
            md.append(f"| {name} | {s['kiln']:.1f} | - | - | - | - |")
    md += ["", "| workers | " + " | ".join(f"{n} MB/s (speed-up)" for n in results["scaling"]) + " |",
           "|---|" + "---|" * len(results["scaling"])]
    for w in [int(x) for x in args.workers.split(",")]:
        cells = []
        for n, rows in results["scaling"].items():
            base = rows[min(rows)]["mb_per_s"]
            cells.append(f"{rows[w]['mb_per_s']:.1f} ({rows[w]['mb_per_s'] / base:.1f}x)")
        md.append(f"| {w} | " + " | ".join(cells) + " |")
    with open(os.path.join(args.out, "results.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    print("\n".join(md))
    verdict = "round trips ok (no peers compared)" if args.kiln_only else "all ids identical"
    print(f"tokenizer_peers: {verdict}" if ok else "tokenizer_peers: MISMATCHES (see results.json)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
