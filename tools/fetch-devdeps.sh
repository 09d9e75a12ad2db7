#!/usr/bin/env bash
# Downloads (does not install) the Debian 12 packages the H200 machine lacks into .devdeps/, which
# the device tool carries there and tools/gpu-build.sh unpacks into /opt/deps (about 25 MB).
#   bash tools/fetch-devdeps.sh      (on this Debian machine, once per fresh checkout)
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
cd .devdeps
packages=(
  libopenblas-dev libopenblas0-pthread libopenblas-pthread-dev libopenblas0 libgfortran5 libquadmath0
  libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3
  libfmt-dev libfmt9 nlohmann-json3-dev libcli11-dev
  libgtest-dev libgmock-dev libbenchmark-dev libbenchmark1debian
  libpng-dev libpng16-16 zlib1g-dev libssl-dev
  libcairo2-dev libcairo2 libpixman-1-0 libfontconfig1 libfreetype6 libxrender1 libx11-6 libxcb1
  libxcb-render0 libxcb-shm0 libxext6 libxau6 libxdmcp6 libbsd0 libmd0 libexpat1 libbrotli1 libx11-data
  fontconfig-config fonts-dejavu-core
  libfftw3-dev libfftw3-double3 libfftw3-single3 libfftw3-long3 libfftw3-quad3 libfftw3-bin
)
apt-get download "${packages[@]}"
du -sh .
# gromacs-data (41 MB) is too large to carry beside the rest; the MD tests and bench read only
# oplsaa.ff, amber99sb-ildn.ff and the water boxes, which go as .devdeps/gromacs-top.tar.xz (80 kB).
tmp=$(mktemp -d)
(cd "$tmp" && apt-get download gromacs-data >/dev/null && dpkg-deb -x gromacs-data_*.deb root)
tar cJf gromacs-top.tar.xz -C "$tmp/root/usr/share/gromacs/top" oplsaa.ff amber99sb-ildn.ff spc216.gro tip4p.gro
rm -rf "$tmp"
du -sh .
