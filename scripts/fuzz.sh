#!/usr/bin/env bash
# The libFuzzer targets of tests/fuzz (docs/fuzzing.md): the config reader, the model spec reader, the
# scaler spec parser, the IDX reader, the checkpoint reader, the ablation file and the trace reader,
# built by clang with ASan + UBSan.
#   scripts/fuzz.sh [SECONDS [TARGET...]] build, then fuzz each target (default: all) for SECONDS
#                                        (default 60), one after
#                                        another at nice ${FUZZ_NICE:-19}; prints seconds, executions,
#                                        corpus, findings
#   scripts/fuzz.sh --replay [TARGET...] run every committed seed once (what CI does: ctest runs this)
# Environment: FUZZ_BUILD_DIR (default: ${BUILD_DIR:-build}/fuzz for --replay, the suite's unoptimised
# copy; ${BUILD_DIR:-build}/fuzz-campaign, built with -O2, for campaigns), FUZZ_WORK (default
# ${BUILD_DIR:-build}/fuzz-work: grown corpora, logs, crash inputs), JOBS, CXX_FUZZ (default clang++),
# FUZZ_NICE (default 19; 0 when the fuzzer must not yield to other work, e.g. a timed campaign).
set -euo pipefail
cd "$(dirname "$0")/.."
all_targets=(config model_spec scaler_spec idx checkpoint ablation trace)
if [ "${1:-}" = "--replay" ]; then
  build_dir=${FUZZ_BUILD_DIR:-${BUILD_DIR:-build}/fuzz}
else
  build_dir=${FUZZ_BUILD_DIR:-${BUILD_DIR:-build}/fuzz-campaign}
fi
work=${FUZZ_WORK:-${BUILD_DIR:-build}/fuzz-work}
corpus_root=tests/fuzz/corpus

build() {
  cmake -S tests/fuzz -B "$build_dir" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build "$build_dir" -j "${JOBS:-$(nproc)}"
}

binary() {
  local bin="$build_dir/fuzz_$1"
  [ -x "$bin" ] || { echo "fuzz.sh: $bin is not built (the suite's build makes build/fuzz; scripts/fuzz.sh 0 builds build/fuzz-campaign)" >&2; exit 1; }
  echo "$bin"
}

if [ "${1:-}" = "--replay" ]; then
  shift
  targets=("$@")
  [ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
  for t in "${targets[@]}"; do
    bin=$(binary "$t")
    seeds=("$corpus_root/$t"/*)
    # Each seed runs once; a sanitizer report or a crash fails the replay.
    if out=$("$bin" "${seeds[@]}" </dev/null 2>&1); then
      echo "fuzz replay: $t: ${#seeds[@]} seeds, no finding"
    else
      echo "$out" | tail -n 40 >&2
      echo "fuzz replay: $t: FINDING (above)" >&2
      exit 1
    fi
  done
  exit 0
fi

case "${1:-60}" in
  ''|*[!0-9]*) sed -n '2,12p' "$0"; exit 2 ;;
esac
seconds=${1:-60}
[ $# -gt 0 ] && shift
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=("${all_targets[@]}")
build
[ "$seconds" -gt 0 ] || exit 0
status=0
printf '%-12s %8s %14s %8s %9s\n' target seconds executions corpus findings
for t in "${targets[@]}"; do
  bin=$(binary "$t")
  mkdir -p "$work/$t/corpus" "$work/$t/crashes"
  dict=()
  [ "$t" = idx ] || dict=(-dict=tests/fuzz/json.dict)
  start=$(date +%s)
  rc=0
  nice -n "${FUZZ_NICE:-19}" "$bin" -max_total_time="$seconds" -timeout=30 -rss_limit_mb=2560 -print_final_stats=1 \
    "${dict[@]}" -artifact_prefix="$work/$t/crashes/" "$work/$t/corpus" "$corpus_root/$t" \
    </dev/null >"$work/$t/log" 2>&1 || rc=$?
  elapsed=$(( $(date +%s) - start ))
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$work/$t/log" | tail -n 1)
  corpus=$(find "$work/$t/corpus" -type f | wc -l)
  findings=$(find "$work/$t/crashes" -type f | wc -l)
  printf '%-12s %8s %14s %8s %9s\n' "$t" "$elapsed" "${execs:-?}" "$corpus" "$findings"
  if [ "$rc" -ne 0 ] || [ "$findings" -gt 0 ]; then
    status=1
    echo "  finding: see $work/$t/log and $work/$t/crashes/" >&2
  fi
done
exit "$status"
