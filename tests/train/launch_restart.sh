#!/usr/bin/env bash
# launch_restart.sh KILN WORKDIR SOURCE_DIR: `kiln launch` over mpirun -np 2 (oversubscribed, CPU,
# a tiny GPT on tinyshakespeare, checkpoints every 4 iterations, 10 iterations):
#  (a) rank 1 SIGKILLed before iteration 6 (KILN_FAULT=crash@6, once: KILN_FAULT_ONCE): launch names
#      the rank and the signal, restarts once from iter_0000004, the job ends with 0, and every
#      iteration's loss equals the uninterrupted run's (log.jsonl);
#  (b) rank 1 hangs before iteration 6 (hang@6): the heartbeat timeout stops the whole job, names
#      the rank, and the restart runs through with the same losses;
#  (c) --max-restarts 0 and the kill: launch exits non-zero naming the rank, the signal and that no
#      restart was left.
set -euo pipefail
K=$1
W=$2
SRC=$3
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OPENBLAS_NUM_THREADS=1
export OMPI_MCA_rmaps_base_oversubscribe=1  # CI has two cores
source "$SRC/tests/cli/byte_shakespeare.sh"  # sets TOK and DATA
RUN=(--num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 32 --make-vocab-size-divisible-by 1
     "${TOK[@]}" --data-path "$DATA" --split 95,5,0 --device cpu --no-progress --seed 7
     --attention-dropout 0 --hidden-dropout 0 --micro-batch-size 2 --global-batch-size 8 --train-iters 10
     --lr 3e-3 --lr-decay-style cosine --lr-warmup-iters 2 --log-interval 1 --eval-iters 0 --save-interval 4)
LAUNCH=("$K" launch --nproc-per-node 2)

fail() { echo "launch_restart: $1"; [ -n "${2:-}" ] && cat "$2"; exit 1; }

# The uninterrupted run, through launch too (a job that succeeds: exit 0, no restart).
"${LAUNCH[@]}" -- "$K" pretrain-gpt "${RUN[@]}" --save "$W/whole" > "$W/whole.txt" 2>&1 || fail "the plain run failed" "$W/whole.txt"
grep -q "^kiln launch: the job succeeded$" "$W/whole.txt" || fail "no success line" "$W/whole.txt"

# (a) rank 1 killed before iteration 6.
mkdir -p "$W/once_a"
KILN_FAULT=crash@6 KILN_FAULT_RANK=1 KILN_FAULT_ONCE=$W/once_a "${LAUNCH[@]}" --max-restarts 2 -- \
  "$K" pretrain-gpt "${RUN[@]}" --save "$W/killed" > "$W/killed.txt" 2>&1 || fail "(a) launch failed" "$W/killed.txt"
grep -q "^kiln launch: attempt 1 failed: rank 1 was killed by signal 9 (SIGKILL)" "$W/killed.txt" \
  || fail "(a) the failure does not name rank 1 and SIGKILL" "$W/killed.txt"
grep -q "^kiln launch: restart 1 of 2 (--max-restarts): resuming from --load $W/killed (newest checkpoint folder: iter_0000004" \
  "$W/killed.txt" || fail "(a) no restart from iter_0000004" "$W/killed.txt"
grep -q "^loaded checkpoint .*iter_0000004 (iteration 4, 32 samples consumed)$" "$W/killed.txt" \
  || fail "(a) pretrain-gpt did not resume at iteration 4" "$W/killed.txt"
grep -q "^kiln launch: the job succeeded after 1 restart(s)$" "$W/killed.txt" || fail "(a) no success line" "$W/killed.txt"
test "$(grep -c 'fault injection: SIGKILL' "$W/killed.txt")" -eq 1 || fail "(a) the fault fired more than once" "$W/killed.txt"

# (b) rank 1 hangs before iteration 6; 4 s without a beat is a hang here (iterations take milliseconds).
mkdir -p "$W/once_b"
KILN_FAULT=hang@6 KILN_FAULT_RANK=1 KILN_FAULT_ONCE=$W/once_b "${LAUNCH[@]}" --max-restarts 1 --heartbeat-timeout 4 \
  --kill-grace 2 -- "$K" pretrain-gpt "${RUN[@]}" --save "$W/hung" > "$W/hung.txt" 2>&1 || fail "(b) launch failed" "$W/hung.txt"
grep -q "^kiln launch: rank 1 hung: no heartbeat for .* s (--heartbeat-timeout 4); its last beat was at the start of iteration 5 (the others: rank 0 at iteration 6); stopping the whole job$" \
  "$W/hung.txt" || fail "(b) the hang is not reported for rank 1" "$W/hung.txt"
grep -q "^kiln launch: restart 1 of 1 (--max-restarts): resuming from --load $W/hung (newest checkpoint folder: iter_0000004" \
  "$W/hung.txt" || fail "(b) no restart from iter_0000004" "$W/hung.txt"
grep -q "^kiln launch: the job succeeded after 1 restart(s)$" "$W/hung.txt" || fail "(b) no success line" "$W/hung.txt"

# (a), (b): the curve continues: every iteration's loss and gradient norm as in the uninterrupted run.
python3 - "$W" <<'PY'
import json, sys
w = sys.argv[1]
def curve(run):
    out = {}
    for line in open(f"{w}/{run}/log.jsonl"):
        j = json.loads(line)
        if "lm_loss" in j:
            assert j["iteration"] not in out, (run, "iteration logged twice", j["iteration"])
            out[j["iteration"]] = (j["lm_loss"], j["grad_norm"])
    return out
whole = curve("whole")
assert sorted(whole) == list(range(1, 11)), sorted(whole)
for run in ["killed", "hung"]:
    c = curve(run)
    assert c == whole, f"{run}: {c} differs from the uninterrupted run {whole}"
print("launch_restart: the restarted runs' losses equal the uninterrupted run's at iterations 1..10 "
      f"(last: {whole[10][0]:.6f})")
PY

# (c) no restart allowed: non-zero, naming the rank, the signal and the budget.
mkdir -p "$W/once_c"
set +e
KILN_FAULT=crash@6 KILN_FAULT_RANK=1 KILN_FAULT_ONCE=$W/once_c "${LAUNCH[@]}" --max-restarts 0 -- \
  "$K" pretrain-gpt "${RUN[@]}" --save "$W/given_up" > "$W/given_up.txt" 2>&1
rc=$?
set -e
test $rc -ne 0 || fail "(c) launch exited 0 with a killed rank and --max-restarts 0" "$W/given_up.txt"
grep -q "^kiln launch: error: the job failed and no restart is left (0 made, --max-restarts 0): rank 1 was killed by signal 9 (SIGKILL)" \
  "$W/given_up.txt" || fail "(c) the final error does not say why" "$W/given_up.txt"
echo "launch_restart: OK (kill and hang restarted, curve continued; --max-restarts 0 refused with exit $rc)"
