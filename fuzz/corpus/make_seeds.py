#!/usr/bin/env python3
"""Writes the seed corpora of fuzz/corpus/<parser>/: a few valid files of each format, edge cases,
and small reproducers of the defects the fuzzers found (named found_<what>), in the input layout each
harness takes (see the comment at the top of fuzz/<parser>_fuzz.cpp).
Run from anywhere: python3 fuzz/corpus/make_seeds.py"""
import json
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def write(parser, name, data):
    folder = os.path.join(HERE, parser)
    os.makedirs(folder, exist_ok=True)
    if isinstance(data, str):
        data = data.encode("utf-8")
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


# --- safetensors: u64 header length, JSON header, data ---------------------------------------------
def safetensors(tensors, metadata=None, pad=True):
    """tensors: list of (name, dtype, shape, bytes)."""
    header, data = {}, b""
    if metadata is not None:
        header["__metadata__"] = metadata
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [len(data), len(data) + len(raw)]}
        data += raw
    text = json.dumps(header, separators=(",", ":")).encode()
    if pad:
        text += b" " * ((8 - len(text) % 8) % 8)
    return struct.pack("<Q", len(text)) + text + data


def raw_header(text, data=b""):
    text = text.encode()
    return struct.pack("<Q", len(text)) + text + data


write("safetensors", "two_tensors_metadata.safetensors",
      safetensors([("weight", "F32", [2, 3], struct.pack("<6f", 1, 2, 3, 4, 5, 6)),
                   ("step", "I64", [1], struct.pack("<q", 7))], {"format": "pt", "epoch": "3"}))
write("safetensors", "every_dtype.safetensors",
      safetensors([("f64", "F64", [1], struct.pack("<d", 0.5)), ("bf16", "BF16", [2], b"\x80\x3f\x00\x40"),
                   ("f16", "F16", [1], b"\x00\x3c"), ("e4m3", "F8_E4M3", [2], b"\x38\x40"),
                   ("e5m2", "F8_E5M2", [1], b"\x3c"), ("i32", "I32", [1], struct.pack("<i", -5)),
                   ("u8", "U8", [3], b"\x00\x7f\xff"), ("flag", "BOOL", [2], b"\x00\x01")]))
write("safetensors", "scalar_and_empty.safetensors",
      safetensors([("scalar", "F32", [], struct.pack("<f", 3.25)), ("none", "F32", [0, 4], b"")], pad=False))
write("safetensors", "no_tensors.safetensors", safetensors([], {}))
write("safetensors", "header_beyond_file.safetensors", struct.pack("<Q", 4096) + b"{}")
write("safetensors", "overlapping.safetensors",
      raw_header('{"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},'
                 '"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}}', b"abcdef"))
write("safetensors", "huge_shape.safetensors",
      raw_header('{"a":{"dtype":"F32","shape":[4611686018427387904,4],"data_offsets":[0,0]}}'))
write("safetensors", "short_data.safetensors",
      raw_header('{"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}}', b"\0" * 8))


# --- Megatron .idx/.bin: u32 .idx size, the .idx, then the .bin -----------------------------------
CODES = {"u8": (1, "B"), "i8": (2, "b"), "i16": (3, "h"), "i32": (4, "i"), "i64": (5, "q"), "u16": (8, "H")}


def indexed(documents, dtype="u16", docs=None):
    """documents: list of token lists, one sequence each; docs: the document indices (default one
    sequence per document)."""
    code, fmt = CODES[dtype]
    lengths, pointers, binary = [], [], b""
    for seq in documents:
        pointers.append(len(binary))
        lengths.append(len(seq))
        binary += struct.pack("<%d%s" % (len(seq), fmt), *seq)
    docs = docs if docs is not None else list(range(len(documents) + 1))
    idx = b"MMIDIDX\0\0" + struct.pack("<QBQQ", 1, code, len(documents), len(docs))
    idx += struct.pack("<%di" % len(lengths), *lengths) + struct.pack("<%dq" % len(pointers), *pointers)
    idx += struct.pack("<%dq" % len(docs), *docs)
    return struct.pack("<I", len(idx)) + idx + binary


write("indexed_dataset", "three_documents_uint16", indexed([[1, 2, 3], [50256], [7, 8, 9, 10, 11]]))
write("indexed_dataset", "int32_two_sequences_per_document",
      indexed([[100000, 2], [3], [4, 5, 6], []], "i32", docs=[0, 2, 4]))
write("indexed_dataset", "uint8", indexed([[255, 0, 1]], "u8"))
write("indexed_dataset", "int64", indexed([[1, 2], [3]], "i64"))
write("indexed_dataset", "empty", indexed([]))
write("indexed_dataset", "bin_too_short", indexed([[1, 2, 3, 4]])[:-3])
write("indexed_dataset", "bad_magic", b"\x20\0\0\0" + b"MMIDIDX\0\1" + bytes(23))


# --- GPT-2 byte-level BPE: vocab.json, NUL, merges.txt; Hugging Face tokenizer.json -----------------
def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs)}


B2U = bytes_to_unicode()


def spell(text):
    return "".join(B2U[b] for b in text.encode("utf-8"))


MERGES = [("t", "h"), ("th", "e"), (" ", "t"), (" t", "he"), ("i", "n"), ("e", "r"), ("c", "a"), ("ca", "f")]


def byte_level_vocab():
    vocab = {B2U[b]: b for b in range(256)}
    for a, b in MERGES:
        vocab[spell(a + b)] = len(vocab)
    return vocab


gpt2_vocab = byte_level_vocab()
gpt2_vocab["<|endoftext|>"] = len(gpt2_vocab)
merges_txt = "#version: 0.2\n" + "".join("%s %s\n" % (spell(a), spell(b)) for a, b in MERGES)
write("gpt2_bpe", "small_vocab", json.dumps(gpt2_vocab) + "\0" + merges_txt)
write("gpt2_bpe", "crlf_merges_no_version", json.dumps(gpt2_vocab) + "\0" + merges_txt[14:].replace("\n", "\r\n"))
write("gpt2_bpe", "no_endoftext", json.dumps(byte_level_vocab()) + "\0" + merges_txt)
write("gpt2_bpe", "bad_merge_line", json.dumps(gpt2_vocab) + "\0" + "#version: 0.2\nĠ t h\n")
write("gpt2_bpe", "merge_of_unknown_tokens", json.dumps(gpt2_vocab) + "\0" + "q z\nqz x\n")

LLAMA3_PATTERN = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
                  "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")


def hf_tokenizer(pre_tokenizer, merges_as_pairs=False, ignore_merges=False, added=None, extra=None):
    vocab = byte_level_vocab()
    added = added if added is not None else [{"id": len(vocab), "content": "<|endoftext|>", "special": True}]
    merges = [[spell(a), spell(b)] if merges_as_pairs else "%s %s" % (spell(a), spell(b)) for a, b in MERGES]
    root = {"version": "1.0", "added_tokens": added, "normalizer": None, "pre_tokenizer": pre_tokenizer,
            "post_processor": None, "decoder": {"type": "ByteLevel"},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                      "ignore_merges": ignore_merges, "vocab": vocab, "merges": merges}}
    root.update(extra or {})
    return json.dumps(root)


gpt2_pre = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
llama_pre = {"type": "Sequence", "pretokenizers": [
    {"type": "Split", "pattern": {"Regex": LLAMA3_PATTERN}, "behavior": "Isolated", "invert": False},
    {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]}
write("tokenizer_json", "gpt2_style", hf_tokenizer(gpt2_pre))
write("tokenizer_json", "llama3_style_with_config",
      hf_tokenizer(llama_pre, merges_as_pairs=True, ignore_merges=True,
                   added=[{"id": 264, "content": "<|begin_of_text|>", "special": True},
                          {"id": 265, "content": "<|end_of_text|>", "special": True}])
      + "\0" + json.dumps({"eos_token": {"content": "<|end_of_text|>"}}))
write("tokenizer_json", "prefix_space_eos_string",
      hf_tokenizer(dict(gpt2_pre, add_prefix_space=True)) + "\0" + json.dumps({"eos_token": "<|endoftext|>"}))
write("tokenizer_json", "normalizer", hf_tokenizer(gpt2_pre, extra={"normalizer": {"type": "NFC"}}))
# Found by the fuzzer: PCRE2's error named the pattern, not the file.
write("tokenizer_json", "found_bad_split_regex",
      hf_tokenizer({"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "(unclosed"}, "behavior": "Isolated", "invert": False}]}))
write("tokenizer_json", "no_model", '{"pre_tokenizer": {"type": "ByteLevel"}}')
# Found by the fuzzer: an added token without "id" escaped as nlohmann's out_of_range ("key 'id' not found").
write("tokenizer_json", "found_added_token_without_id", hf_tokenizer(gpt2_pre, added=[{"content": "<|endoftext|>"}]))
# Found by the fuzzer: a missing model.vocab or Sequence.pretokenizers read through a const json's
# operator[] (undefined behaviour; an assertion in debug builds).
write("tokenizer_json", "found_no_model_vocab", json.dumps(dict(json.loads(hf_tokenizer(gpt2_pre)),
                                                                model={"type": "BPE", "merges": []})))
write("tokenizer_json", "found_sequence_without_pretokenizers", hf_tokenizer({"type": "Sequence"}))

# --- JSONL as preprocess-data reads it: one option byte (fuzz/jsonl_fuzz.cpp), then the file -------
JSONL = ('{"text": "the cat sat on the mat", "title": "cats"}\n'
         '{"text": "caf\\u00e9 \\u65e5\\u672c \\ud83d\\udd25", "title": ""}\n'
         '\n'
         '{"text": "", "title": "empty text"}\r\n'
         '{"text": "line\\nbreaks\\tand <|endoftext|> inside", "title": "x"}\n')
BAD = '{"text": 5}\n[1, 2]\n{"title": "no text"}\n{"text": "unterminated\n"just a string"\n{"text": "ok"}\n'
write("jsonl", "one_key", b"\x00" + JSONL.encode())
write("jsonl", "two_keys_eod_two_workers", bytes([4 | 16 | 32]) + JSONL.encode())
write("jsonl", "bad_lines_skipped", bytes([8]) + (JSONL + BAD).encode())
write("jsonl", "bad_line_refused", bytes([0]) + (JSONL + BAD).encode())
write("jsonl", "text_lines", bytes([1 | 16]) + b"first line\n\n  \nsecond line\r\nthird without newline")
write("jsonl", "text_file", bytes([2]) + "a whole file\nof text \xe6\x97\xa5".encode("utf-8", "surrogateescape"))
write("jsonl", "invalid_utf8", bytes([0]) + b'{"text": "\xff\xfe\xc3"}\n')

# --- HPL.dat (31 lines) ----------------------------------------------------------------------------
with open(os.path.join(HERE, "..", "..", "tests", "hpl", "HPL.dat")) as f:
    HPL = f.read()
write("hpl_dat", "HPL.dat", HPL)
lines = HPL.splitlines(True)
sweep = lines[:]
sweep[4:8] = ["3    # of problems sizes (N)\n", "1000 2000 3000 Ns\n", "2   # of NBs\n", "64 256 NBs\n"]
sweep[9:12] = ["2    # of process grids (P x Q)\n", "1 2  Ps\n", "4 2  Qs\n"]
sweep[18:20] = ["3    # of recursive panel fact.\n", "0 1 2 RFACTs\n"]
write("hpl_dat", "sweep_crlf.dat", "".join(sweep).replace("\n", "\r\n"))
write("hpl_dat", "thirty_lines.dat", "".join(lines[:30]))
short_list = lines[:]
short_list[4] = "3   # of problems sizes (N)\n"
write("hpl_dat", "count_beyond_list.dat", "".join(short_list))
bad = lines[:]
bad[12] = "nan          threshold\n"
bad[5] = "99999999999999999999 Ns\n"
write("hpl_dat", "nan_threshold_huge_n.dat", "".join(bad))

# --- hpcg.dat --------------------------------------------------------------------------------------
HEAD = "HPCG benchmark input file\nSandia National Laboratories; University of Tennessee, Knoxville\n"
write("hpcg_dat", "hpcg.dat", HEAD + "104 104 104\n60\n")
write("hpcg_dat", "no_run_time.dat", HEAD + "16 16 16\n")
write("hpcg_dat", "bad_dims.dat", HEAD + "16 x 16\n1800\n")
write("hpcg_dat", "out_of_range.dat", HEAD + "-8 0 99999999999\n1e999\n")
write("hpcg_dat", "header_only.dat", HEAD)

# --- CIFAR-10 binary batches: records of 1 label byte + 3,072 pixel bytes --------------------------
def record(label, seed):
    return bytes([label]) + bytes((seed * 7 + i * 13) % 256 for i in range(3072))


write("cifar10", "one_record.bin", record(3, 1))
write("cifar10", "two_records.bin", record(0, 2) + record(9, 3))
write("cifar10", "label_out_of_range.bin", record(10, 4))
write("cifar10", "truncated.bin", record(1, 5)[:1000])
write("cifar10", "empty.bin", b"")
