#!/usr/bin/env bash
# HPCG on one H200, next to its peers, in one run (about 4-5 minutes; the steps' time limits add up
# to under 11 minutes):
#   1. the kernel twins on the GPU (CUDA engine vs the reference kernels, 16^3 and 24x16x32);
#   2. kiln hpcg at a quick size (64^3);
#   3. cuSPARSE CSR SpMV on the same 27-point matrix with the device copy bandwidth, at 128^3 and
#      at the big size;
#   4. kiln hpcg at a size that fills most of the 141 GB (640^3 local: ~125 GB), with a short timed
#      phase. An official run uses --rt 1800 (the reference's minimum); the rating barely moves.
# Usage: bench/gpu_hpcg.sh BUILD_DIR   (a KILN_CUDA=ON build; logs and reports go to $OUT)
# Build: BUILD_DIR=build-cuda bash tools/build.sh -DCMAKE_CUDA_ARCHITECTURES=90a \
#          -DCMAKE_CUDA20_STANDARD_COMPILE_OPTION=-std=c++20 -DCMAKE_CUDA20_EXTENSION_COMPILE_OPTION=-std=c++20
# Knobs: NX (big size, default 640), RT (timed seconds for the big run, default 60).
set -uo pipefail
B=${1:?usage: bench/gpu_hpcg.sh BUILD_DIR}
OUT=${OUT:-out}
NX=${NX:-640}
RT=${RT:-60}
mkdir -p "$OUT"
KILN="$B/apps/kiln/kiln"
# The build may have been made elsewhere (carried in): find libkiln.so next to it, not at the
# absolute path baked into the binaries' run path.
export LD_LIBRARY_PATH="$(cd "$B" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
step() { echo "== $1 ($(date +%T))" | tee -a "$OUT/summary.log"; }

step "device"
"$KILN" check-device 2>&1 | tee "$OUT/check_device.log" | head -12
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.max.memory \
  --format=csv 2>&1 | tee -a "$OUT/check_device.log"

step "kernel twins on the GPU"
KILN_HPCG_TEST_CUDA=1 timeout 90 "$B/tests/test_hpcg" --gtest_filter='Boxes/*' 2>&1 | tee "$OUT/twins.log" | tail -3
grep -m1 "engine under test" "$OUT/twins.log"

step "kiln hpcg 64^3 (quick)"
timeout 90 "$KILN" hpcg --device cuda --nx 64 --rt 5 --report-dir "$OUT" 2>&1 | tee "$OUT/hpcg_64.log"

step "cuSPARSE peer 128^3"
timeout 45 "$KILN" hpcg --device cuda --nx 128 --peer cusparse 2>&1 | tee "$OUT/cusparse_128.log"

step "cuSPARSE peer ${NX}^3"
timeout 90 "$KILN" hpcg --device cuda --nx "$NX" --peer cusparse 2>&1 | tee "$OUT/cusparse_${NX}.log"

step "kiln hpcg ${NX}^3, --rt $RT (official: --rt 1800)"
# If this one runs out of memory or time, rerun with NX=512 (about 64 GB).
timeout 330 "$KILN" hpcg --device cuda --nx "$NX" --rt "$RT" --report-dir "$OUT" 2>&1 | tee "$OUT/hpcg_${NX}.log"

step "done"
grep -h -E "cuSPARSE CSR SpMV peer|HPCG result|bandwidth bound|iterations:" "$OUT"/*.log | tee -a "$OUT/summary.log"
