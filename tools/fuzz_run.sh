#!/usr/bin/env bash
# Run one libFuzzer target for a bounded time; what `make fuzz` runs for each target.
#   tools/fuzz_run.sh NAME SECONDS FUZZ_BUILD [SEED_DIR...] [-- LIBFUZZER_FLAGS...]
# Binary FUZZ_BUILD/NAME_fuzz; corpus FUZZ_BUILD/corpus/NAME (kept between runs, grown from the
# seed dirs); findings FUZZ_BUILD/artifacts/NAME/{crash,timeout,oom,leak}-*; log FUZZ_BUILD/NAME.log.
# Reproduce a finding with:  FUZZ_BUILD/NAME_fuzz FILE
#
# Triage. A finding whose stack, below the sanitizer / libFuzzer / libc / allocator frames, starts
# inside libhdf5 is a defect of the HDF5 library itself on a malformed file (Debian 12 ships HDF5
# 1.10.8), which llmpi cannot fix: its input is moved to FUZZ_BUILD/third-party/NAME/, listed, and
# fuzzing goes on for the rest of the time. Any other finding (llmpi's code, the tokenizers, the
# config parser, an exception other than llmpi::Error) ends the run and fails it.
#
# Exit status: 0 when nothing was found in llmpi's code, 1 otherwise.
set -u
name=$1 seconds=$2 build=$3
shift 3
seeds=() flags=()
while [ $# -gt 0 ]; do
  if [ "$1" = -- ]; then shift; flags=("$@"); break; fi
  seeds+=("$1"); shift
done
here=$(cd "$(dirname "$0")" && pwd)
bin=$build/${name}_fuzz
corpus=$build/corpus/$name arts=$build/artifacts/$name third=$build/third-party/$name
log=$build/$name.log
mkdir -p "$corpus" "$arts" "$third"
: >"$log"

# allocator_may_return_null: a huge malloc fails as it would with glibc (libhdf5 checks for NULL)
# instead of aborting. Leaks: reported, except those inside third-party libraries (lsan.supp).
# UBSan: the targets are built with -fno-sanitize-recover, so any undefined behaviour is a finding.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:symbolize=1:allocator_may_return_null=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$here/sanitizer/lsan.supp:print_suppressions=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-halt_on_error=1:print_stacktrace=1}

# The module of the first stack frame of the report in $1 that is not sanitizer, libFuzzer, libc,
# libstdc++ or allocator machinery.
first_real_frame() {
  grep -E '^ *#[0-9]+ 0x' "$1" |
    grep -vE ' in (__sanitizer|__asan|__lsan|__ubsan|__interceptor_|__interception|__cxa_|__gxx_|_Unwind|fuzzer::|__libc_|__GI_|__pthread_kill|__mem|__str)' |
    grep -vE ' in (raise|abort|malloc|calloc|realloc|free|operator new|operator delete|mem(cpy|move|set|cmp)|str[a-z]*|std::terminate)\b' |
    grep -vE '\((/lib|/usr/lib)/x86_64-linux-gnu/(libc|libstdc\+\+|libgcc_s)\.so' |
    grep -vE '^ *#[0-9]+ 0x[0-9a-f]+ +\((/lib|/usr/lib)/x86_64-linux-gnu/libc\.so' |
    head -1
}

end=$((SECONDS + seconds)) runs=0 execs=0 third_party=0 bug=0 found=()
while :; do
  left=$((end - SECONDS))
  [ $left -gt 0 ] || break
  part=$(mktemp)
  "$bin" -max_total_time=$left -timeout=25 -print_final_stats=1 -artifact_prefix="$arts/" \
    "${flags[@]}" "$corpus" "${seeds[@]}" >"$part" 2>&1
  rc=$?
  cat "$part" >>"$log"
  runs=$((runs + 1))
  n=$(grep -oP '^stat::number_of_executed_units: \K[0-9]+' "$part" | tail -1)
  execs=$((execs + ${n:-0}))
  if [ $rc = 0 ]; then rm -f "$part"; break; fi  # ran to the time limit: nothing (more) found
  art=$(grep -oP 'Test unit written to \K\S+' "$part" | tail -1)
  frame=$(first_real_frame "$part")
  if [ -n "$art" ] && [ -f "$art" ] && [[ "$frame" == *libhdf5* ]]; then
    third_party=$((third_party + 1))
    mv "$art" "$third/"
    # The same input may sit in the corpus (a finding that did not reproduce when it was added).
    for f in "$corpus"/*; do [ -f "$f" ] && cmp -s "$f" "$third/$(basename "$art")" && rm -f "$f"; done
    kind=$(grep -oE 'ERROR: (AddressSanitizer|LeakSanitizer|libFuzzer): [A-Za-z-]+' "$part" | head -1)
    where=$(sed -E 's/ \(BuildId.*//; s/^ *#[0-9]+ 0x[0-9a-f]+ +(in )?//; s/ *\(.*\/(lib[^/)]*)\)$/ (\1)/; s/^ +//' <<<"$frame")
    found+=("${kind#ERROR: }${kind:+ }in $where")
    rm -f "$part"
    continue
  fi
  bug=1
  echo "   FOUND A BUG (exit $rc) in $(sed -E 's/ \(BuildId.*//; s/^ *#[0-9]+ 0x[0-9a-f]+ +(in )?//' <<<"${frame:-?}")"
  grep -E 'ERROR|SUMMARY|runtime error|terminate called|what\(\)|_fuzz: ' "$part" | head -8 | sed 's/^/   | /'
  echo "   input: ${art:-?}  (reproduce: $bin ${art:-FILE}; log $log)"
  rm -f "$part"
  break
done
echo "   $name: $seconds s, $execs executions in $runs run(s), $third_party third-party finding(s)"
if [ $third_party -gt 0 ]; then
  echo "   third-party findings (libhdf5 on malformed files, not llmpi; inputs in $third/):"
  printf '%s\n' "${found[@]}" | sort | uniq -c | sort -rn | sed 's/^ */     /'
fi
exit $bug
