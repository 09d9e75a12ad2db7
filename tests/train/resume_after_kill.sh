#!/usr/bin/env bash
# resume_after_kill.sh KILN WORKDIR: a run SIGKILLed mid-epoch (KILN_FAULT=crash@S) and resumed ends
# bit-identical to the same run never interrupted: the final checkpoint's tensor files are the same
# bytes. Synchronous and asynchronous saves both.
set -euo pipefail
K=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
bash "$(dirname "$0")/../../tools/synthetic_cifar10.sh" "$W/data"
common() {
  echo --model simple_cnn --batch-size 16 --limit-train 480 --limit-test 64 --data-dir "$W/data" --device cpu \
    --no-download --no-progress --save-interval 7 --epochs 2 --out-dir "$1"
}
"$K" train-cifar10 $(common "$W/whole") > "$W/whole.txt"
for mode in sync async; do
  extra=$([ $mode = async ] && echo --async-save || true)
  set +e
  KILN_FAULT=crash@40 "$K" train-cifar10 $(common "$W/$mode") $extra > "$W/$mode-killed.txt" 2>&1
  rc=$?
  set -e
  test $rc -eq 137 || { echo "$mode: expected SIGKILL (137), got $rc"; cat "$W/$mode-killed.txt"; exit 1; }
  grep -q "SIGKILL before step 40" "$W/$mode-killed.txt"
  "$K" train-cifar10 $(common "$W/$mode") $extra --resume > "$W/$mode-resumed.txt"
  # 30 steps an epoch: saves at 7, 14, 21, 28, 30 (epoch end), 35; the kill before step 40.
  # (An async save of step 35 may still have been writing when the kill came: then iter_0000030.)
  grep -Eq "resumed from .*iter_00000(35|30) \(step (35|30), checksums verified\)" "$W/$mode-resumed.txt"
  [ $mode = async ] || grep -q "iter_0000035 (step 35" "$W/$mode-resumed.txt"
  for f in model.safetensors optimizer.safetensors; do
    cmp "$W/whole/checkpoints/iter_0000060/$f" "$W/$mode/checkpoints/iter_0000060/$f" \
      || { echo "$mode: $f differs from the uninterrupted run's"; exit 1; }
  done
  a=$(grep "^Epoch 2/2" "$W/whole.txt" | sed 's/ | [0-9.]* s,.*//')
  b=$(grep "^Epoch 2/2" "$W/$mode-resumed.txt" | sed 's/ | [0-9.]* s,.*//')
  test "$a" = "$b" || { echo "$mode: epoch 2 reads '$b', the uninterrupted run '$a'"; exit 1; }
done
echo "resume_after_kill: killed at step 40 and resumed from iter_0000035, sync and async: bit-identical"
