#!/usr/bin/env python3
"""An independent safetensors reader using only json and struct (no numpy, no safetensors
package), to check that files Kiln writes follow the format. Validates the layout as the
reference implementation does (header alignment, offsets contiguous and covering the data) and
prints {"metadata": {...}, "tensors": {name: {"dtype", "shape", "values"}}} as JSON, with values
decoded for the numeric dtypes (floats as Python floats, bf16/f16 widened).

usage: read_safetensors.py FILE"""
import json
import struct
import sys

SIZES = {"F64": 8, "F32": 4, "BF16": 2, "F16": 2, "F8_E4M3": 1, "F8_E5M2": 1,
         "I64": 8, "I32": 4, "U8": 1, "BOOL": 1}


def decode(dtype, raw):
    n = len(raw) // SIZES[dtype]
    if dtype == "F64":
        return list(struct.unpack("<%dd" % n, raw))
    if dtype == "F32":
        return list(struct.unpack("<%df" % n, raw))
    if dtype == "F16":
        return list(struct.unpack("<%de" % n, raw))
    if dtype == "BF16":
        halves = struct.unpack("<%dH" % n, raw)
        return [struct.unpack("<f", struct.pack("<I", h << 16))[0] for h in halves]
    if dtype == "I64":
        return list(struct.unpack("<%dq" % n, raw))
    if dtype == "I32":
        return list(struct.unpack("<%di" % n, raw))
    if dtype in ("U8", "F8_E4M3", "F8_E5M2"):
        return list(raw)
    if dtype == "BOOL":
        return [b != 0 for b in raw]
    raise ValueError("unknown dtype " + dtype)


def main():
    path = sys.argv[1]
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    assert 8 + n <= len(data), "header length beyond the file"
    header_bytes = data[8:8 + n]
    assert n % 8 == 0, "header not padded to a multiple of 8"
    header = json.loads(header_bytes.decode("utf-8"))
    body = data[8 + n:]
    metadata = header.pop("__metadata__", {})
    entries = sorted(header.items(), key=lambda kv: kv[1]["data_offsets"][0])
    pos = 0
    out = {}
    for name, info in entries:
        begin, end = info["data_offsets"]
        assert begin == pos, "gap or overlap before %s" % name
        count = 1
        for d in info["shape"]:
            count *= d
        assert end - begin == count * SIZES[info["dtype"]], "size mismatch for %s" % name
        out[name] = {"dtype": info["dtype"], "shape": info["shape"], "values": decode(info["dtype"], body[begin:end])}
        pos = end
    assert pos == len(body), "data does not end where the last tensor ends"
    print(json.dumps({"metadata": metadata, "tensors": out}))


if __name__ == "__main__":
    main()
