#!/usr/bin/env bash
# Builds the libFuzzer harnesses in fuzz/ with clang (build-fuzz/, only the sources each parser
# needs) and runs each for SECONDS (default 30) starting from its committed corpus fuzz/corpus/<t>/
# (with the dictionary fuzz/dict/<t>.dict when there is one).
# SECONDS=0 only replays the corpus (the regression check). Fails on any crash, sanitizer report,
# leak, timeout or out-of-memory, printing the report and where the input was saved.
#   tools/fuzz.sh [SECONDS] [TARGET...]        (targets: build-fuzz/targets.txt; default all)
# Environment: KILN_FUZZ_CXX (default clang++-14), JOBS (build parallelism).
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-30}"
shift || true
build=build-fuzz
cmake -S fuzz -B "$build" -G Ninja -DCMAKE_CXX_COMPILER="${KILN_FUZZ_CXX:-clang++-14}" > /dev/null
cmake --build "$build" --parallel "${JOBS:-$(nproc)}" > "$build/build.log" 2>&1 || {
  tail -n 40 "$build/build.log"
  echo "tools/fuzz.sh: building the fuzz targets failed (log: $build/build.log)" >&2
  exit 1
}
if [ $# -gt 0 ]; then targets=("$@"); else mapfile -t targets < "$build/targets.txt"; fi

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
failed=()
for t in "${targets[@]}"; do
  work="$build/runs/$t"
  rm -rf "$work"
  mkdir -p "$work/new" "$work/found"
  if [ "$seconds" = 0 ]; then limit=(-runs=0); else limit=(-max_total_time="$seconds"); fi
  [ -f "fuzz/dict/$t.dict" ] && limit+=(-dict="fuzz/dict/$t.dict")
  # A fixed seed (KILN_FUZZ_SEED, default 1) makes a run repeatable: CI explores the same inputs each time.
  limit+=(-seed="${KILN_FUZZ_SEED:-1}")
  # New inputs go to $work/new (the first folder); the committed corpus is only read.
  set +e
  "$build/${t}_fuzz" "$work/new" "fuzz/corpus/$t" "${limit[@]}" -timeout=10 -rss_limit_mb=2048 \
    -artifact_prefix="$work/found/" -print_final_stats=1 > "$work/log" 2>&1
  rc=$?
  set -e
  runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/log" | tail -n 1 || true)
  cov=$(grep -o 'cov: [0-9]*' "$work/log" | tail -n 1 | cut -d' ' -f2 || true)
  corpus=$(($(ls "fuzz/corpus/$t" | wc -l) + $(ls "$work/new" | wc -l)))
  found=$(ls "$work/found")
  if [ $rc -ne 0 ] || [ -n "$found" ]; then
    failed+=("$t")
    grep -E -A 30 'ERROR: |FAILURE: |runtime error: |deadly signal|out-of-memory|timeout' "$work/log" | head -n 60 || tail -n 40 "$work/log"
    echo "fuzz $t: FAIL (exit $rc) after ${runs:-?} runs; input: $work/found/$found; log: $work/log"
  else
    echo "fuzz $t: ok, ${runs:-?} runs in ${seconds}s, coverage ${cov:-?} edges, corpus $corpus inputs"
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "tools/fuzz.sh: ${#failed[@]} target(s) failed: ${failed[*]} (reproduce: $build/<target>_fuzz <input>)" >&2
  exit 1
fi
echo "tools/fuzz.sh: ${#targets[@]} targets ran ${seconds}s each without a finding"
