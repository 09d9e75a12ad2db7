#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `sanitize` preset:
# Debug, KILN_CUDA=OFF). Prints passes, failures and skips with their reasons, as tools/test.sh does.
#
# Two scopes:
# - Full (default): every test except those that rebuild or re-download everything or run whole
#   trainings through the CLI (extension_example, the cifar10 / pretrain-gpt / gpt-io / MoE / FP8
#   flows, the 20-kill and resume-after-kill scripts, the corpus fetch, the network integration
#   tests: 2-7 minutes each under the sanitizers); their library code runs here through the
#   GoogleTest suites. The layouts' training tests and mdrun's domain decomposition run at 2 ranks
#   (their 4- and 8-rank variants repeat the same code over more ranks: normal suite only).
# - CI (CI=true, or --gtest-only): the GoogleTest suites and the GoogleTest binaries under mpirun at
#   2 ranks only, and only their targets built (no CLI, benchmarks or scripts): the library code
#   all of it, at half the time, so that CI's clean clone stays within its hour on 2 cores. The
#   CLI's own code (argument parsing, apps/) is checked under the sanitizers in the full scope.
set -euo pipefail
cd "$(dirname "$0")/.."
scope=full
[ "${CI:-}" = true ] && scope=gtest
[ "${1:-}" = --gtest-only ] && scope=gtest
[ "${1:-}" = --full ] && scope=full
cmake --preset sanitize > /dev/null
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
rm -rf build-asan/gtest-xml
select=()
if [ "$scope" = gtest ]; then
  targets=(kiln)
  for d in tests/*/; do
    compgen -G "$d*.cpp" > /dev/null && targets+=("test_$(basename "$d")")
  done
  cmake --build build-asan --parallel "${JOBS:-$(nproc)}" --target "${targets[@]}"
  # The tests whose command runs a tests/test_* binary, directly or under mpirun -np 2.
  regex=$(ctest --test-dir build-asan --show-only=json-v1 | python3 -c '
import json, re, sys
names = []
for t in json.load(sys.stdin)["tests"]:
    cmd = t.get("command", [])
    if not any(re.search(r"/tests/test_[a-z_0-9]+$", c) for c in cmd):
        continue
    if "-np" in cmd and cmd[cmd.index("-np") + 1] != "2":
        continue
    names.append(re.escape(t["name"]))
print("^(" + "|".join(names) + ")$")')
  select=(-R "$regex")
else
  cmake --build build-asan --parallel "${JOBS:-$(nproc)}"
  select=(-E "extension_example|cli.cifar10_flow|cli.pretrain_gpt_flow|cli.gpt_io_flow|cli.english_corpus_fetch|train.kill_during_save|train.resume_after_kill|integration\.|cli.pretrain_moe_flow|cli.pretrain_fp8_flow|cli.pretrain_fp8_moe_flow|train_(tp|pp|pp_features|ep|cp|moe_tp)_mpirun_[48]|md_dd_mpirun_4")
fi
rc=0
ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)" --timeout 900 \
  --output-junit ctest-junit.xml "${select[@]}" || rc=$?
ci=()
[ "${CI:-}" = true ] && ci=(--ci)
python3 tools/test_summary.py build-asan/ctest-junit.xml "${ci[@]}" || rc=1
[ "$rc" -eq 0 ] || { echo "tools/test-sanitize.sh: FAILED ($scope scope)"; exit 1; }
echo "tools/test-sanitize.sh: all tests passed under ASan + UBSan ($scope scope)"
