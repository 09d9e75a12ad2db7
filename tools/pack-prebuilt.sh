#!/usr/bin/env bash
# Packs what a device call needs to run without building there: the given targets' files from a
# CUDA build (default build/, made by `bash tools/build.sh <targets>` on this machine, sm_90) and
# libkiln.so, at their build-tree paths, into .prebuilt/kiln.tar.xz (git-ignored; carry
# `.prebuilt` and `.devdeps`, then `KILN_PREBUILT=.prebuilt/kiln.tar.xz bash tools/gpu-session.sh ...`).
#   bash tools/pack-prebuilt.sh apps/kiln/kiln tests/test_md
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD=${BUILD_DIR:-build}
mkdir -p .prebuilt
grep -qx '/.prebuilt/' .git/info/exclude 2>/dev/null || echo '/.prebuilt/' >> "$(git rev-parse --git-common-dir)/info/exclude"
tmp=$(mktemp -d)
for f in libkiln.so "$@"; do
  mkdir -p "$tmp/$(dirname "$f")"
  strip --strip-unneeded -o "$tmp/$f" "$BUILD/$f"
done
tar -C "$tmp" -cJf .prebuilt/kiln.tar.xz .
rm -rf "$tmp"
ls -la .prebuilt/kiln.tar.xz
