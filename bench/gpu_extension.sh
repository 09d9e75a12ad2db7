#!/usr/bin/env bash
# The custom-op extension on a GPU machine: builds examples/custom_op against a Kiln build or
# install, runs its tests (CUDA kernel against the CPU built-ins), then bench_bias_gelu for the
# default build and the -O3 build of the extension on the GPU and the CPU. Results (JSON lines)
# and logs go to $OUT/extension/ when OUT is set, else to <work>/results/.
#   bench/gpu_extension.sh [<kiln build dir or install prefix>]   (default: build/)
# Environment: CUDACXX or CMAKE_CUDA_COMPILER (nvcc; default: what Kiln was built with),
# ROWS/COLS (GPU problem size, default 16384 x 8192), WORK (scratch dir, default /tmp/kiln-extension-bench),
# NO_GPU=1 (a dry run on a machine without a GPU: CPU benchmarks only).
set -euo pipefail
cd "$(dirname "$0")/.."
kiln=${1:-build}
work=${WORK:-/tmp/kiln-extension-bench}
results=${OUT:+$OUT/extension}
results=${results:-$work/results}
rm -rf "$work/example"
mkdir -p "$work" "$results"

if [ -f "$kiln/CMakeCache.txt" ]; then
  echo "gpu_extension.sh: installing the Kiln build $kiln into $work/prefix"
  rm -rf "$work/prefix"
  cmake --install "$kiln" --prefix "$work/prefix" >/dev/null
  prefix=$work/prefix
elif [ -f "$kiln/lib/cmake/Kiln/KilnConfig.cmake" ] || [ -f "$kiln/lib64/cmake/Kiln/KilnConfig.cmake" ]; then
  prefix=$(cd "$kiln" && pwd)
else
  echo "gpu_extension.sh: $kiln is neither a Kiln build directory nor an install prefix" >&2
  exit 2
fi

args=(-S examples/custom_op -B "$work/example" -G Ninja -DCMAKE_PREFIX_PATH="$prefix")
[ -n "${CMAKE_CUDA_COMPILER:-}" ] && args+=(-DCMAKE_CUDA_COMPILER="$CMAKE_CUDA_COMPILER")
cmake "${args[@]}" | tee "$results/configure.log"
cmake --build "$work/example" --parallel "$(nproc)" | tee "$results/build.log"
if ! grep -q '^BIAS_GELU_CUDA:BOOL=ON' "$work/example/CMakeCache.txt"; then
  echo "gpu_extension.sh: this Kiln has no CUDA backend, so the example has no CUDA kernel" >&2
  exit 1
fi

# Tests: the CUDA kernel against the CPU built-ins (they print [skip] if no GPU is visible).
"$work/example/test_bias_gelu" | tee "$results/test.log"
"$work/example/test_bias_gelu_dlopen" "$work/example/libbias_gelu_ext.so" | tee -a "$results/test.log"
devices=(cuda cpu)
if [ "${NO_GPU:-0}" = 1 ]; then
  devices=(cpu)
elif grep -q '^\[skip\] GPU checks' "$results/test.log"; then
  echo "gpu_extension.sh: the GPU checks were skipped (no CUDA device visible)" >&2
  exit 1
fi

bench=$results/bench.jsonl
: >"$bench"
for label in default O3; do
  lib=$work/example/libbias_gelu_ext.so
  [ "$label" = O3 ] && lib=$work/example/libbias_gelu_ext_o3.so
  for device in "${devices[@]}"; do
    size=()
    [ "$device" = cuda ] && size=(--rows "${ROWS:-16384}" --cols "${COLS:-8192}")
    "$work/example/bench_bias_gelu" --extension "$lib" --label "$label" --device "$device" "${size[@]}" | tee -a "$bench"
  done
done
{
  echo "# bias_gelu extension benchmark, $(date -u +%Y-%m-%dT%H:%MZ), $(hostname)"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null || true
  python3 - "$bench" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
print(f"{'device':8} {'case':26} {'build':8} {'ms':>10} {'GB/s':>8}")
for r in rows:
    ms = f"{r['ms']:.4f}" if 'ms' in r else 'n/a'
    bw = f"{r['GB_per_s']:.1f}" if 'GB_per_s' in r else r.get('error', '')[:60]
    print(f"{r['device']:8} {r['case']:26} {r['extension']:8} {ms:>10} {bw:>8}")
PY
} | tee "$results/summary.txt"
echo "gpu_extension.sh: results in $results"
