#!/usr/bin/env bash
# Downloads (does not install) Debian 12's GROMACS 2022 and the shared libraries the H200 machine
# (Ubuntu 24.04, no package registry) lacks for it, and packs what `gmx` needs into
# .mdpeers/gromacs-2022.tar.xz (about 7 MB), which the device tool carries beside .devdeps/ and
# bench/gpu_mdrun_peers.sh unpacks into /opt/mdpeers.
#   bash tools/fetch-md-peers.sh      (on this Debian machine, once per fresh checkout)
#
# What goes and why (the ELF NEEDED entries of gmx and libgromacs.so.7, checked below):
# - gromacs (usr/bin/gmx, usr/bin/gmx_d) and, of libgromacs7's four 18 MB libraries (mixed/double x
#   thread-MPI/OpenMPI), the two thread-MPI ones they link: libgromacs.so.7 (mixed precision, the
#   speed peer) and libgromacs_d.so.7 (double precision, the reference for step-0 energies at sizes
#   where mixed precision's sums round: GMX_BINARY=gmx_d in bench/gpu_mdrun_peers.sh). The whole .deb
#   is 25 MB.
# - libhwloc15, libmuparser2v5: GROMACS's own dependencies, absent there.
# - libudev1 (hwloc's dependency), into a fallback folder the bench puts last on LD_LIBRARY_PATH:
#   Ubuntu's own is used when the machine has one.
# - gromacs-data's top/ subset the bench's grompp reads (oplsaa.ff, spc216.gro, residuetypes.dat
#   and the few files gmx looks up at start), not the 41 MB package.
# Already carried by .devdeps/ (tools/fetch-devdeps.sh) and unpacked by tools/gpu-build.sh into
# /opt/deps: libfftw3f.so.3 (libfftw3-single3), libfftw3.so.3 (libfftw3-double3), libblas.so.3/liblapack.so.3 (openblas-pthread's,
# with libgfortran5/libquadmath0), libX11.so.6 (gmx's, with libxcb1, libxau6, libxdmcp6, libbsd0,
# libmd0). Assumed on Ubuntu 24.04: glibc, libstdc++6, libgcc-s1, libgomp1, zlib1g.
#
# OpenMM as the second peer: not carried. Debian 12's libopenmm7.7 holds only libOpenMM.so.7.7
# (Reference and CPU platforms: no libOpenMMCUDA.so, Debian builds it without CUDA), and
# python3-simtk's extension module is built for Python 3.11 (Ubuntu 24.04 has 3.12); checked below.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DEST=$ROOT/.mdpeers
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$DEST"
cd "$tmp"
packages=(gromacs libgromacs7 libhwloc15 libmuparser2v5 libudev1 gromacs-data libopenmm7.7 python3-simtk)
apt-get download "${packages[@]}" 2>&1 | grep -v "^W: Download is performed unsandboxed" || true
for p in "${packages[@]}"; do ls ${p}_*.deb > /dev/null || { echo "apt-get download $p failed" >&2; exit 1; }; done
for p in gromacs libgromacs7 libhwloc15 libmuparser2v5 libudev1 gromacs-data; do dpkg-deb -x ${p}_*.deb root; done

# The carried tree: only what gmx runs with.
L=usr/lib/x86_64-linux-gnu
mkdir -p pack/usr/bin pack/$L pack/fallback pack/usr/share/gromacs/top
cp -a root/usr/bin/gmx root/usr/bin/gmx_d pack/usr/bin/
cp -a root/$L/libgromacs.so.7 root/$L/libgromacs.so.7.0.0 root/$L/libgromacs_d.so.7 root/$L/libgromacs_d.so.7.0.0 pack/$L/
cp -a root/$L/libhwloc.so.15* root/$L/libmuparser.so.2* pack/$L/
cp -a root/$L/libudev.so.1* pack/fallback/
T=root/usr/share/gromacs/top
cp -a $T/oplsaa.ff $T/spc216.gro $T/residuetypes.dat $T/atommass.dat $T/vdwradii.dat $T/elements.dat \
  $T/defselection.dat pack/usr/share/gromacs/top/

# Every NEEDED library of the carried ELF files must be carried here, carried by .devdeps/, or part
# of Ubuntu 24.04's base: anything else would fail only there, where nothing can be fetched.
devdeps_libs="libfftw3f.so.3 libfftw3.so.3 libblas.so.3 liblapack.so.3 libX11.so.6"
ubuntu_base="libc.so.6 libm.so.6 libstdc++.so.6 libgcc_s.so.1 libgomp.so.1 libz.so.1 ld-linux-x86-64.so.2"
missing=0
for f in pack/usr/bin/gmx pack/usr/bin/gmx_d pack/$L/*.so.*.* pack/fallback/*.so.*.*; do
  [ -L "$f" ] && continue
  for lib in $(readelf -d "$f" | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p'); do
    if [ -e "pack/$L/$lib" ] || [ -e "pack/fallback/$lib" ]; then continue; fi
    if [[ " $devdeps_libs $ubuntu_base " == *" $lib "* ]]; then continue; fi
    echo "not carried: $lib (needed by ${f#pack/})" >&2; missing=1
  done
done
[ $missing = 0 ] || { echo "add the packages of the libraries above" >&2; exit 1; }
# .devdeps must hold the packages of the libraries counted on above.
for p in libfftw3-single3 libfftw3-double3 libopenblas0-pthread libgfortran5 libquadmath0 libx11-6 libxcb1 libxau6 libxdmcp6 libbsd0 libmd0; do
  ls "$ROOT"/.devdeps/${p}_*.deb > /dev/null 2>&1 || { echo ".devdeps/ lacks $p: run tools/fetch-devdeps.sh first" >&2; exit 1; }
done

{ echo "# Debian 12 packages packed into gromacs-2022.tar.xz by tools/fetch-md-peers.sh (name version sha256 of the .deb)"
  for p in gromacs libgromacs7 libhwloc15 libmuparser2v5 libudev1 gromacs-data; do
    f=$(ls ${p}_*.deb); echo "$p $(dpkg-deb -f "$f" Version) $(sha256sum "$f" | cut -c1-64)"
  done; } > pack/MANIFEST
tar cf - -C pack . | xz -T2 -6 > "$DEST/gromacs-2022.tar.xz.tmp"
mv "$DEST/gromacs-2022.tar.xz.tmp" "$DEST/gromacs-2022.tar.xz"
cp pack/MANIFEST "$DEST/MANIFEST"

# The OpenMM check the bench's comment relies on.
dpkg-deb -c libopenmm7.7_*.deb | grep -q 'libOpenMMCUDA' && echo "note: libopenmm7.7 now has a CUDA platform: add it as a peer"
dpkg-deb -c python3-simtk_*.deb | grep -o '_openmm[^ ]*\.so' | sed 's/^/python3-simtk extension: /'
du -sh "$DEST"/*
