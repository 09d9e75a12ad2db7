#!/usr/bin/env python3
"""Writes a varied, reproducible text corpus for checking tokenizers against each other.

    python3 bench/make_tokenizer_corpus.py --mb 12 --out corpus.jsonl [--raw-out broken.txt]

corpus.jsonl: one {"text": ...} per line, mixing English prose, source code, CJK, emoji (with ZWJ
sequences and skin tones), other scripts, numbers, contractions in any case, rare Unicode
whitespace (NBSP, U+0085, U+2028, U+3000), long whitespace runs, strings that spell special tokens,
and text that was broken UTF-8 (random bytes decoded with errors="replace", as a Python pipeline
would read it). --raw-out also writes the broken bytes themselves (one document a line) for
tokenizers that take bytes (Kiln): they must round-trip, since byte-level BPE keeps bytes as bytes.
Only the standard library: it runs on Debian's python3 and on the H200 machine alike.
"""
import argparse
import json
import os
import random

ENGLISH_WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or have an they which one you "
    "were all we her she there would their will when who him been has more if no out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down should "
    "because each just those people how too little state good very make world still own see men work long get here "
    "between both life being under never day same another know while last might us great old year off come since "
    "against go came right used take three thou thee thy hath doth king lord queen brutus caesar romeo juliet"
).split()
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'T", "'RE", "'Ve", "'LL", "'D", "'M"]
UNICODE_SPACES = ["\u00a0", "\u0085", "\u2028", "\u2029", "\u3000", "\u2009", "\u200b", "\u202f", "\u1680", "\t",
                  "\x0b", "\x0c", "\r\n", "\r"]
SPECIAL_SPELLINGS = ["<|endoftext|>", "<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>", "<|start_header_id|>",
                     "<|reserved_special_token_5|>", "<|endoftext", "|>", "<|"]
OTHER_SCRIPTS = [
    "Привет, как дела? Съешь же ещё этих мягких французских булок.",
    "Γαζέες καὶ μυρτιὲς δὲν θὰ βρῶ πιὰ στὸ χρυσαφὶ ξέφωτο.",
    "مرحبا بالعالم، هذه جملة عربية للاختبار.",
    "नमस्ते दुनिया, यह एक परीक्षण वाक्य है।",
    "שלום עולם, זה משפט בדיקה.",
    "สวัสดีชาวโลก นี่คือประโยคทดสอบ",
    "Việt Nam có nhiều món ăn ngon như phở và bánh mì.",
    "Ţară, şcoală, ăsta, înţelegere — diacritice românești.",
    "Zoë's café naïve résumé façade coöperate Ångström ß ẞ ﬁ ﬂ",
    "e\u0301 a\u0308 n\u0303 combining marks, Hangul jamo \u1100\u1161\u11a8",
    "Ꭰꭰ 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 𝕞𝕒𝕥𝕙 𝟙𝟚𝟛 Ⅻ ½ ² ٣ ४ 〇",
]


def english(rng, n_words):
    out = []
    for i in range(n_words):
        w = rng.choice(ENGLISH_WORDS)
        r = rng.random()
        if r < 0.08:
            w = w.capitalize()
        elif r < 0.1:
            w = w.upper()
        if rng.random() < 0.05:
            w += rng.choice(CONTRACTIONS)
        out.append(w)
        if rng.random() < 0.08:
            out[-1] += rng.choice([",", ".", ";", ":", "!", "?", "...", " --", "'", '"'])
        if rng.random() < 0.02:
            out.append(str(rng.choice([rng.randint(0, 99), rng.randint(100, 99999), rng.randint(10**6, 10**12)])))
    text = " ".join(out)
    return text[0].upper() + text[1:] + "." if text else text


def cjk(rng, n):
    ranges = [(0x4E00, 0x9FFF), (0x3040, 0x309F), (0x30A0, 0x30FF), (0xAC00, 0xD7A3), (0x3000, 0x303F)]
    phrases = ["我们今天去北京。", "東京は日本の首都です。", "한국어 문장입니다.", "你好，世界！", "これはテストです、よろしく。"]
    out = []
    for _ in range(n):
        if rng.random() < 0.3:
            out.append(rng.choice(phrases))
        else:
            lo, hi = rng.choice(ranges)
            out.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 12))))
        if rng.random() < 0.2:
            out.append(rng.choice([" ", "\n", "，", "。", " 123 ", "abc"]))
    return "".join(out)


def emoji(rng, n):
    base = [0x1F600, 0x1F64F, 0x1F300, 0x1F5FF, 0x1F680, 0x1F6FF, 0x1F900, 0x1F9FF, 0x2600, 0x26FF]
    out = []
    for _ in range(n):
        i = rng.randrange(0, len(base), 2)
        e = chr(rng.randint(base[i], base[i + 1]))
        r = rng.random()
        if r < 0.15:
            e += chr(rng.randint(0x1F3FB, 0x1F3FF))  # skin tone
        elif r < 0.25:
            e = "\U0001F468\u200d\U0001F469\u200d\U0001F467"  # family, ZWJ
        elif r < 0.3:
            e = "\U0001F1EB\U0001F1F7"  # flag
        elif r < 0.35:
            e += "\ufe0f"
        out.append(e)
        if rng.random() < 0.4:
            out.append(rng.choice([" ", "  ", "!", " lol ", "\n", "😂😂😂"]))
    return "".join(out)


def whitespace(rng):
    parts = []
    for _ in range(rng.randint(1, 12)):
        kind = rng.random()
        if kind < 0.3:
            parts.append(" " * rng.choice([1, 2, 3, 7, 16, 100, 1000, 5000]))
        elif kind < 0.45:
            parts.append("\n" * rng.randint(1, 300))
        elif kind < 0.55:
            parts.append("\t" * rng.randint(1, 64))
        elif kind < 0.7:
            parts.append("".join(rng.choice(UNICODE_SPACES) for _ in range(rng.randint(1, 40))))
        else:
            parts.append(english(rng, rng.randint(1, 10)))
    return "".join(parts)


def broken_bytes(rng):
    """Random bytes with some valid text around them: truncated sequences, lone continuation
    bytes, overlongs, surrogates encoded in UTF-8, 0xFF."""
    pieces = []
    for _ in range(rng.randint(3, 30)):
        r = rng.random()
        if r < 0.3:
            pieces.append(english(rng, rng.randint(1, 6)).encode())
        elif r < 0.45:
            pieces.append("日本語😀".encode()[: rng.randint(1, 12)])
        elif r < 0.6:
            pieces.append(bytes([rng.choice([0x80, 0xBF, 0xC0, 0xC1, 0xF5, 0xFF, 0xFE])]))
        elif r < 0.7:
            pieces.append(b"\xed\xa0\x80")  # a UTF-16 surrogate, not valid UTF-8
        elif r < 0.8:
            pieces.append(b"\xe0\x80\xaf")  # overlong
        else:
            pieces.append(bytes(rng.randrange(256) for _ in range(rng.randint(1, 20))))
    return b"".join(pieces)


def code_documents(root):
    """Kiln's own sources: C++, CMake, Python, shell, Markdown."""
    docs = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in ("build", "data", "out"))
        for name in sorted(filenames):
            if name.endswith((".h", ".cpp", ".cu", ".py", ".sh", ".md", ".txt", ".cmake")):
                try:
                    with open(os.path.join(dirpath, name), encoding="utf-8") as f:
                        docs.append(f.read())
                except (UnicodeDecodeError, OSError):
                    pass
    return docs


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=float, default=12.0, help="approximate size of corpus.jsonl's texts")
    ap.add_argument("--out", required=True)
    ap.add_argument("--raw-out", help="also write raw broken-UTF-8 documents, one a line")
    ap.add_argument("--seed", type=int, default=5)
    ap.add_argument("--source-root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    args = ap.parse_args()
    rng = random.Random(args.seed)
    code = code_documents(args.source_root)
    shakespeare = os.path.join(args.source_root, "tests", "data", "tinyshakespeare_100k.txt")
    prose = open(shakespeare, encoding="utf-8").read() if os.path.exists(shakespeare) else ""
    target = int(args.mb * 1e6)
    total = 0
    raw = []
    tmp = args.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        while total < target:
            r = rng.random()
            if r < 0.25:
                text = english(rng, rng.randint(5, 3000))
            elif r < 0.35 and prose:
                start = rng.randrange(len(prose))
                text = prose[start : start + rng.randint(10, 20000)]
            elif r < 0.5 and code:
                text = rng.choice(code)
            elif r < 0.6:
                text = cjk(rng, rng.randint(5, 2000))
            elif r < 0.68:
                text = emoji(rng, rng.randint(5, 500))
            elif r < 0.76:
                text = " ".join(rng.choice(OTHER_SCRIPTS) for _ in range(rng.randint(1, 60)))
            elif r < 0.84:
                text = whitespace(rng)
            elif r < 0.9:
                b = broken_bytes(rng)
                raw.append(b)
                text = b.decode("utf-8", errors="replace")
            elif r < 0.95:
                text = " ".join(rng.choice(SPECIAL_SPELLINGS + ENGLISH_WORDS[:20]) for _ in range(rng.randint(1, 200)))
            else:
                # Everything at once, so that the kinds meet inside one pre-tokenizer piece.
                text = "".join(
                    rng.choice([english(rng, 5), cjk(rng, 3), emoji(rng, 3), rng.choice(UNICODE_SPACES),
                                rng.choice(SPECIAL_SPELLINGS), rng.choice(CONTRACTIONS), str(rng.randint(0, 10**9))])
                    for _ in range(rng.randint(2, 100)))
            if not text:
                continue
            out.write(json.dumps({"text": text}, ensure_ascii=rng.random() < 0.5) + "\n")
            total += len(text.encode("utf-8"))
    os.replace(tmp, args.out)
    if args.raw_out:
        # Raw documents may hold "\n" bytes: they are written one a line with \n and \r escaped away.
        with open(args.raw_out + ".tmp", "wb") as f:
            for b in raw:
                f.write(b.replace(b"\n", b" ").replace(b"\r", b" ") + b"\n")
        os.replace(args.raw_out + ".tmp", args.raw_out)
    print(json.dumps({"corpus": args.out, "bytes": total, "broken_documents": len(raw)}))


if __name__ == "__main__":
    main()
