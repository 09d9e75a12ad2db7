#!/usr/bin/env bash
# Builds Kiln on the H200 machine (Ubuntu 24.04, CUDA 13, no package registry): unpacks the
# Debian packages carried in .devdeps/ into /opt/deps, points CMake at them and at the cuDNN/NCCL
# that ship inside PyTorch's wheels, and builds for sm_90a with all cores. Source it to also get
# the environment (LD_LIBRARY_PATH) for running what it built:  source tools/gpu-build.sh [cmake args]
set -eo pipefail
KILN_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
DEPS=/opt/deps
if [ -d "$KILN_ROOT/.devdeps" ] && [ ! -f $DEPS/.unpacked ]; then
  mkdir -p $DEPS
  for f in "$KILN_ROOT"/.devdeps/*.deb; do dpkg -x "$f" $DEPS; done
  touch $DEPS/.unpacked
fi
# -dev packages' .so links point at runtime libraries we did not carry (the machine has its own,
# perhaps another minor version): re-point dangling links at the system's library of that soname.
for l in "$DEPS"/usr/lib/x86_64-linux-gnu/*.so; do
  if [ -L "$l" ] && [ ! -e "$l" ]; then
    t=$(basename "$(readlink "$l")")
    while [ ! -e "/usr/lib/x86_64-linux-gnu/$t" ] && [[ $t == *.so.*.* ]]; do t=${t%.*}; done
    [ -e "/usr/lib/x86_64-linux-gnu/$t" ] && ln -sf "/usr/lib/x86_64-linux-gnu/$t" "$l"
  fi
done
NV=${NV:-/opt/torch/.venv/lib/python3.12/site-packages/nvidia}
# The wheels ship only versioned sonames; give the linker unversioned names in a folder of ours.
mkdir -p $DEPS/nvlink
ln -sf $NV/cudnn/lib/libcudnn.so.9 $DEPS/nvlink/libcudnn.so
ln -sf $NV/nccl/lib/libnccl.so.2 $DEPS/nvlink/libnccl.so
ARCH_LIB=$DEPS/usr/lib/x86_64-linux-gnu
export CMAKE_PREFIX_PATH=$DEPS/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
export PKG_CONFIG_SYSROOT_DIR=$DEPS
export PKG_CONFIG_PATH=$ARCH_LIB/pkgconfig:$DEPS/usr/share/pkgconfig
export LD_LIBRARY_PATH=$ARCH_LIB:$ARCH_LIB/openblas-pthread:$NV/cudnn/lib:$NV/nccl/lib:$DEPS/nvlink${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
export LIBRARY_PATH=$ARCH_LIB:$ARCH_LIB/openblas-pthread:$DEPS/nvlink
# cairo's text needs fontconfig to find the carried DejaVu fonts.
mkdir -p /tmp/fontconfig-cache
cat > $DEPS/fonts.conf <<FONTS
<?xml version="1.0"?><!DOCTYPE fontconfig SYSTEM "fonts.dtd">
<fontconfig><dir>$DEPS/usr/share/fonts</dir><cachedir>/tmp/fontconfig-cache</cachedir></fontconfig>
FONTS
export FONTCONFIG_FILE=$DEPS/fonts.conf
# gromacs-data's topologies: the subset the MD tests and bench read (.devdeps/gromacs-top.tar.xz, 80 kB,
# made by tools/fetch-devdeps.sh), else the whole .deb when it was carried (41 MB, a call of its own)
if [ ! -d $DEPS/usr/share/gromacs/top ]; then
  if [ -f "$KILN_ROOT/.devdeps/gromacs-top.tar.xz" ]; then
    mkdir -p $DEPS/usr/share/gromacs/top && tar xJf "$KILN_ROOT/.devdeps/gromacs-top.tar.xz" -C $DEPS/usr/share/gromacs/top
  elif [ -d "$KILN_ROOT/.gromacs" ]; then
    for f in "$KILN_ROOT"/.gromacs/*.deb; do dpkg -x "$f" $DEPS; done
  fi
fi
[ -d $DEPS/usr/share/gromacs/top ] && export GMXLIB=$DEPS/usr/share/gromacs/top
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export PATH=/usr/local/cuda/bin:$PATH
BUILD_DIR=${BUILD_DIR:-$KILN_ROOT/build-gpu}
# KILN_PREBUILT=<tar.xz>: no build here; unpack a build made elsewhere (the kiln binary, test
# binaries and libkiln.so at their build-tree paths, for sm_90: tools/pack-prebuilt.sh) into
# BUILD_DIR, for a call with too little device time left to build.
if [ -n "${KILN_PREBUILT:-}" ]; then
  mkdir -p "$BUILD_DIR" && tar xJf "$KILN_PREBUILT" -C "$BUILD_DIR"
  export LD_LIBRARY_PATH=$BUILD_DIR:/usr/local/cuda/lib64:$LD_LIBRARY_PATH
  return 0 2>/dev/null || exit 0
fi
cmake -S "$KILN_ROOT" -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a \
  -DCMAKE_CUDA_COMPILER=/usr/local/cuda/bin/nvcc -DKILN_CUDNN_ROOT=$NV/cudnn -DKILN_NCCL_ROOT=$NV/nccl \
  -DCUDNN_LIBRARY=$DEPS/nvlink/libcudnn.so -DNCCL_LIBRARY=$DEPS/nvlink/libnccl.so "$@"
# KILN_BUILD_TARGETS="kiln test_io" builds only those targets (a quicker start for a run that needs few).
cmake --build "$BUILD_DIR" -j "$(nproc)" ${KILN_BUILD_TARGETS:+--target $KILN_BUILD_TARGETS}
