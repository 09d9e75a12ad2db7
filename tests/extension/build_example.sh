#!/usr/bin/env bash
# CTest extension_example: installs this Kiln build into a scratch prefix, builds
# examples/custom_op out of tree against it with find_package(Kiln), and runs its tests and a
# short benchmark. The CUDA kernel is compiled when the Kiln build has CUDA (then $4 is its nvcc).
#   build_example.sh <kiln build dir> <kiln source dir> <work dir> [<CUDA compiler>] [<CUDA architectures>]
#                    [<extra host compile and link flags, e.g. sanitizers>]
set -euo pipefail
build=$1 source=$2 work=$3 cuda_compiler=${4:-} cuda_archs=${5:-} extra_flags=${6:-}
rm -rf "$work"
mkdir -p "$work"
cmake --install "$build" --prefix "$work/prefix" >"$work/install.log"
echo "build_example.sh: installed Kiln into $work/prefix"

args=(-S "$source/examples/custom_op" -B "$work/build" -G Ninja -DCMAKE_PREFIX_PATH="$work/prefix")
if [ -n "$cuda_compiler" ]; then
  args+=(-DCMAKE_CUDA_COMPILER="$cuda_compiler")
  [ -n "$cuda_archs" ] && args+=(-DCMAKE_CUDA_ARCHITECTURES="$cuda_archs")
fi
if [ -n "$extra_flags" ]; then
  args+=(-DCMAKE_CXX_FLAGS="$extra_flags" -DCMAKE_EXE_LINKER_FLAGS="$extra_flags"
         -DCMAKE_SHARED_LINKER_FLAGS="$extra_flags")
fi
cmake "${args[@]}"
grep -q '^BIAS_GELU_CUDA:BOOL=ON' "$work/build/CMakeCache.txt" && echo "build_example.sh: the CUDA kernel is built"
cmake --build "$work/build" --parallel 2
ctest --test-dir "$work/build" --output-on-failure
"$work/build/bench_bias_gelu" --extension "$work/build/libbias_gelu_ext_o3.so" --label O3 --rows 64 --cols 256 \
  --iters 2 --repeats 1
echo "build_example.sh: the example built and passed against the installed Kiln"
