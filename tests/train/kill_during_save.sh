#!/usr/bin/env bash
# kill_during_save.sh KILN WORKDIR: a run that checkpoints every step is SIGKILLed 20 times at random
# moments (even trials: from outside, after a random delay; odd trials: by KILN_FAULT=kill_in_save,
# half-way through writing a checkpoint file). After every kill the next run must resume from an
# intact checkpoint (the resume verifies every file's CRC-32C against the manifest and says so) and
# must pass over no damaged one; the newest folder is also checked independently (sizes, headers).
set -euo pipefail
K=$1
W=$2
rm -rf "$W"
mkdir -p "$W"
bash "$(dirname "$0")/../../tools/synthetic_cifar10.sh" "$W/data"
RUN=$W/run
COMMON=(--model simple_cnn --batch-size 8 --limit-train 80 --limit-test 64 --data-dir "$W/data" --out-dir "$RUN"
        --device cpu --no-download --no-progress --save-interval 1 --keep-last 3)
"$K" train-cifar10 "${COMMON[@]}" --epochs 1 > "$W/first.txt"
grep -q "checkpoint iter_0000010" "$W/first.txt"

check_newest() {  # independent of Kiln's reader: every file has the manifest's size, headers parse
  python3 - "$RUN/checkpoints" <<'PY'
import json, os, re, struct, sys
root = sys.argv[1]
its = sorted(int(m.group(1)) for d in os.listdir(root) if (m := re.fullmatch(r"iter_(\d+)", d)))
assert its, "no checkpoint folder"
d = os.path.join(root, "iter_%07d" % its[-1])
m = json.load(open(os.path.join(d, "manifest.json")))
for f in m["files"]:
    p = os.path.join(d, f["name"])
    assert os.path.getsize(p) == f["bytes"], (p, os.path.getsize(p), f["bytes"])
    with open(p, "rb") as fh:
        n = struct.unpack("<Q", fh.read(8))[0]
        json.loads(fh.read(n))
PY
}

mid_save_kills=0
for trial in $(seq 1 20); do
  log=$W/trial$trial.txt
  if [ $((trial % 2)) -eq 1 ]; then
    # The fault hook kills inside save number 1..5 of this process.
    set +e
    KILN_FAULT=kill_in_save@$(((trial / 2) % 5 + 1)) "$K" train-cifar10 "${COMMON[@]}" --epochs 1000 --resume \
      $([ $((trial % 4)) -eq 1 ] && echo --async-save) > "$log" 2>&1
    rc=$?
    set -e
  else
    "$K" train-cifar10 "${COMMON[@]}" --epochs 1000 --resume $([ $((trial % 4)) -eq 0 ] && echo --async-save) \
      > "$log" 2>&1 &
    pid=$!
    # Once it has resumed (and so is training and saving), a random moment within the next 0.6 s.
    for _ in $(seq 1 200); do
      grep -q "checksums verified" "$log" 2> /dev/null && break
      sleep 0.05
    done
    sleep "$(python3 -c "import random; print(round(random.uniform(0.0, 0.6), 3))")"
    kill -KILL "$pid" 2> /dev/null || true
    set +e
    wait "$pid"
    rc=$?
    set -e
  fi
  if [ "$rc" -ne 137 ]; then
    echo "trial $trial: expected death by SIGKILL (137), got exit $rc:"
    cat "$log"
    exit 1
  fi
  if ! grep -q "resumed from .*iter_[0-9]* (step [0-9]*, checksums verified)" "$log"; then
    echo "trial $trial: the run did not resume from a verified checkpoint (killed before it loaded?):"
    cat "$log"
    exit 1
  fi
  if grep -q "passed over" "$log"; then
    echo "trial $trial: a damaged checkpoint was found after the previous kill:"
    cat "$log"
    exit 1
  fi
  ls -a "$RUN/checkpoints" | grep -q '^\.iter_.*\.tmp\.' && mid_save_kills=$((mid_save_kills + 1))
  check_newest
done
# The state the last kill left: it loads and verifies too.
"$K" train-cifar10 "${COMMON[@]}" --epochs 1000 --resume > "$W/final.txt" 2>&1 &
pid=$!
for _ in $(seq 1 100); do
  grep -q "checksums verified" "$W/final.txt" && break
  sleep 0.1
done
kill -KILL "$pid" 2> /dev/null || true
wait "$pid" || true
grep -q "resumed from .*checksums verified" "$W/final.txt"
! grep -q "passed over" "$W/final.txt"
echo "kill_during_save: 20 kills ($mid_save_kills of them left a half-written checkpoint folder); every time the newest checkpoint loaded and verified"
# The fault hook's ten kills are certainly mid-save.
test "$mid_save_kills" -ge 10
