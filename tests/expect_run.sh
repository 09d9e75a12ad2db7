#!/usr/bin/env bash
# Runs a command and checks both its exit status and its output, so a CLI test cannot pass on
# matching text alone (CTest's PASS_REGULAR_EXPRESSION ignores the exit code).
#   expect_run.sh EXIT [--line ERE]... [--output ERE]... [--absent ERE]... -- COMMAND [ARGS...]
# EXIT: a number, or "nonzero". --line: some whole line of the output (stdout + stderr) matches the
# extended regex. --output: the regex matches somewhere in the whole output ('.' spans lines).
# --absent: no line contains a match.
# No 'printf | grep -q' pipelines under pipefail: grep -q exits at its first match, the writer's
# last write then dies of SIGPIPE, and the pipeline fails at random (CI saw it on hpl_dat_sweep).
set -uo pipefail
want_exit=$1; shift
lines=(); outputs=(); absents=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do
  case "$1" in
    --line) lines+=("$2"); shift 2 ;;
    --output) outputs+=("$2"); shift 2 ;;
    --absent) absents+=("$2"); shift 2 ;;
    *) echo "expect_run.sh: unknown option '$1'" >&2; exit 2 ;;
  esac
done
[ "${1:-}" = "--" ] || { echo "expect_run.sh: missing '--' before the command" >&2; exit 2; }
shift
out=$("$@" 2>&1)
rc=$?
printf '%s\n' "$out"
fail=0
if [ "$want_exit" = nonzero ]; then
  [ "$rc" -ne 0 ] || { echo "expect_run.sh: expected a non-zero exit status, got 0"; fail=1; }
elif [ "$rc" -ne "$want_exit" ]; then
  echo "expect_run.sh: expected exit status $want_exit, got $rc"; fail=1
fi
for re in "${lines[@]}"; do
  grep -Eqx -- "$re" <<<"$out" || { echo "expect_run.sh: no whole line matches: $re"; fail=1; }
done
for re in "${outputs[@]}"; do
  grep -Ezq -- "$re" < <(printf '%s' "$out") || { echo "expect_run.sh: the output does not match: $re"; fail=1; }
done
for re in "${absents[@]}"; do
  if grep -Eq -- "$re" <<<"$out"; then echo "expect_run.sh: the output contains: $re"; fail=1; fi
done
exit $fail
