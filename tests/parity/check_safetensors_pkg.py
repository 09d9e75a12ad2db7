#!/usr/bin/env python3
"""Checks that the `safetensors` Python package (and numpy) read what Kiln writes, and that Kiln
reads what the package writes. Not run by CI (the package is not installed there); run it where
it is (the H200 machine):

    build/tests/test_io --gtest_filter='Safetensors.WritesParityFile'   # writes the Kiln file
    python3 tests/parity/check_safetensors_pkg.py build/parity/kiln_written.safetensors

The expected values are the ones the test writes (see tests/io/safetensors_test.cpp,
Safetensors.WritesParityFile). It also writes build/parity/pkg_written.safetensors with the
package, which Safetensors.ReadsPackageFile then loads if present."""
import os
import sys

import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file


def expected():
    return {
        "f64": np.arange(6, dtype=np.float64).reshape(2, 3) * 0.5 - 1,
        "f32": np.array([1.5, -2.25, 3.0, 1e-3], dtype=np.float32),
        "f16": np.array([0.5, -1.0, 65504.0], dtype=np.float16),
        "i64": np.array([[1, -2], [3, 1 << 40]], dtype=np.int64),
        "i32": np.array([7, -8, 9], dtype=np.int32),
        "u8": np.array([0, 1, 255], dtype=np.uint8),
        "bool": np.array([True, False, True]),
        "scalar": np.array(2.5, dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
    }


def main():
    path = sys.argv[1] if len(sys.argv) > 1 else "build/parity/kiln_written.safetensors"
    # numpy has no bf16/fp8 dtypes: read the numpy-representable tensors one by one.
    with safe_open(path, framework="np") as f:
        got = {name: f.get_tensor(name) for name in expected() if name in f.keys()}
    want = expected()
    assert set(want) <= set(got), "missing tensors: %s" % (set(want) - set(got))
    for name, w in want.items():
        g = got[name]
        assert g.dtype == w.dtype, "%s: dtype %s, expected %s" % (name, g.dtype, w.dtype)
        assert g.shape == w.shape, "%s: shape %s, expected %s" % (name, g.shape, w.shape)
        assert np.array_equal(g, w), "%s: values differ" % name
    # bf16 and fp8 have no numpy dtype: read them with the torch backend when available.
    try:
        import torch
        from safetensors.torch import load_file as load_torch
        t = load_torch(path)
        assert t["bf16"].dtype == torch.bfloat16 and t["bf16"].float().tolist() == [1.0, -0.5, 256.0]
        print("bf16 checked with safetensors.torch")
    except ImportError:
        print("torch not available: bf16 not checked")
    out = os.path.join(os.path.dirname(path), "pkg_written.safetensors")
    save_file(want, out, metadata={"writer": "safetensors-python"})
    print("OK: %s read by the safetensors package; wrote %s" % (path, out))


if __name__ == "__main__":
    main()
