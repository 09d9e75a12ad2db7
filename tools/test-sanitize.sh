#!/usr/bin/env bash
# The CPU test suite under AddressSanitizer + UndefinedBehaviorSanitizer (the `sanitize` preset:
# Debug, KILN_CUDA=OFF). The tests that rebuild or re-download everything, or run whole trainings
# (extension_example, the cifar10 / pretrain-gpt / gpt-io flows, the 20-kill and resume-after-kill
# scripts, the corpus fetch and the network integration tests; the MoE and FP8 training flows, which
# took 2-7 minutes each under the sanitizers) run in the normal suite only, to keep CI's time; their
# library code runs under the sanitizers through the GoogleTest suites. The layouts' training tests run
# here at 2 ranks (their 4- and 8-rank variants repeat the same code over more ranks: normal suite only).
# Prints passes, failures and skips with their reasons, as tools/test.sh does.
set -euo pipefail
cd "$(dirname "$0")/.."
cmake --preset sanitize > /dev/null
cmake --build build-asan --parallel "${JOBS:-$(nproc)}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export ASAN_OPTIONS=detect_leaks=0 UBSAN_OPTIONS=print_stacktrace=1
rc=0
ctest --test-dir build-asan --output-on-failure --parallel "$(nproc)" --timeout 900 \
  --output-junit ctest-junit.xml -E "extension_example|cli.cifar10_flow|cli.pretrain_gpt_flow|cli.gpt_io_flow|cli.english_corpus_fetch|train.kill_during_save|train.resume_after_kill|integration\.|cli.pretrain_moe_flow|cli.pretrain_fp8_flow|cli.pretrain_fp8_moe_flow|train_(tp|pp|pp_features|ep|cp|moe_tp)_mpirun_[48]" || rc=$?
ci=()
[ "${CI:-}" = true ] && ci=(--ci)
python3 tools/test_summary.py build-asan/ctest-junit.xml "${ci[@]}" || rc=1
[ "$rc" -eq 0 ] || { echo "tools/test-sanitize.sh: FAILED"; exit 1; }
echo "tools/test-sanitize.sh: all tests passed under ASan + UBSan"
