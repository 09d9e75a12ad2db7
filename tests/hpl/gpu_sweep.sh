#!/usr/bin/env bash
# HPL on one GPU over a sweep that reaches every edge of the panel code: N not a multiple of NB,
# NB not a multiple of NBMIN, NBMIN above the fused leaf's 64 columns, left- and right-looking
# panels, look-ahead on and off; with the fused leaf kernel (the default) and with the
# column-by-column cuBLAS panel; leaves spread over many blocks, in shared memory or not; U12 in two
# or four pieces or as one product; the update in chunks over two streams; narrower tail steps;
# W narrower than the matrix.
# Every run must pass the residual check.
#   tests/hpl/gpu_sweep.sh KILN_BINARY      (exit 77, "skipped", when there is no CUDA device)
set -euo pipefail
KILN=${1:?usage: gpu_sweep.sh KILN_BINARY}
if ! "$KILN" hpl --device cuda --n 64 --nb 16 > /dev/null 2>&1; then
  echo "gpu_sweep.sh: skipped (no CUDA device, or a build without CUDA)"
  exit 77
fi
expect() {  # expect "TEXT" COMMAND...: runs it, shows its report, fails unless TEXT is in it
  local text=$1 out
  shift
  out=$("$@")
  echo "$out"
  grep -q "$text" <<< "$out"
}
expect "72 tests completed and passed residual checks" \
  "$KILN" hpl --device cuda --n 1000 2049 4999 --nb 64 192 --nbmin 4 16 96 --pfact 0 2 --depth 0 1
expect "8 tests completed and passed residual checks" \
  env KILN_HPL_PANEL=columns "$KILN" hpl --device cuda --n 2049 --nb 64 192 --nbmin 4 96 --depth 0 1
# Leaves over many blocks (64 rows each), with their rows in shared memory and in the matrix.
expect "4 tests completed and passed residual checks" \
  env KILN_HPL_LEAF_ROWS=64 "$KILN" hpl --device cuda --n 4999 --nb 256 --nbmin 16 64 --depth 0 1
expect "4 tests completed and passed residual checks" \
  env KILN_HPL_LEAF_ROWS=64 KILN_HPL_LEAF_TILE=off "$KILN" hpl --device cuda --n 4999 --nb 256 --nbmin 16 64 --depth 0 1
# NB from 256 up: U12 by the two-half solve (an NB that splits unevenly, 300 = 128 + 172), and by
# the single product with inv(L11).
expect "4 tests completed and passed residual checks" \
  "$KILN" hpl --device cuda --n 3001 --nb 300 512 --nbmin 16 --depth 0 1
expect "2 tests completed and passed residual checks" \
  env KILN_HPL_U12=inverse "$KILN" hpl --device cuda --n 3001 --nb 300 512 --nbmin 16
# The trailing update in column chunks whose SWAP + U12 run on their own stream (chunks far
# smaller than the default, so that these N have many), with and without look-ahead.
expect "8 tests completed and passed residual checks" \
  env KILN_HPL_SWAP_CHUNK=700 "$KILN" hpl --device cuda --n 3001 4999 --nb 300 512 --nbmin 16 --depth 0 1
# U12 in two pieces (four is the default); the last rows in narrower steps (a tail width that does
# not divide the rows left); a leaf's interchanges carried by block 0 alone.
expect "2 tests completed and passed residual checks" \
  env KILN_HPL_U12_PIECES=2 "$KILN" hpl --device cuda --n 3001 --nb 300 512 --nbmin 16
expect "4 tests completed and passed residual checks" \
  env KILN_HPL_TAIL=1000:120 "$KILN" hpl --device cuda --n 3001 --nb 300 512 --nbmin 16 --depth 0 1
expect "2 tests completed and passed residual checks" \
  env KILN_HPL_LEAF_SWAP_BLOCKS=1 KILN_HPL_LEAF_ROWS=64 "$KILN" hpl --device cuda --n 4999 --nb 256 --nbmin 16 64
# W narrower than the matrix (KILN_HPL_W_COLUMNS; rounded up to 512 and 128 columns), so each
# update gathers and solves its columns chunk after chunk, alone and with the swap stream's chunks.
expect "8 tests completed and passed residual checks" \
  env KILN_HPL_W_COLUMNS=500 "$KILN" hpl --device cuda --n 3001 4999 --nb 300 512 --nbmin 16 --depth 0 1
expect "4 tests completed and passed residual checks" \
  env KILN_HPL_W_COLUMNS=100 "$KILN" hpl --device cuda --n 2049 --nb 64 192 --nbmin 16 --depth 0 1
expect "4 tests completed and passed residual checks" \
  env KILN_HPL_W_COLUMNS=500 KILN_HPL_SWAP_CHUNK=700 "$KILN" hpl --device cuda --n 4999 --nb 300 512 --nbmin 16 \
  --depth 0 1
echo "gpu_sweep.sh: all GPU HPL runs passed"
