# Sourced by every tests/cli/*.sh (a .bash file, so not itself one of the checks). The scripts run
# from the repository root as `bash tests/cli/NAME.sh` (BUILD=dir for another build folder). This
# gives them the programs' folder $B, one thread per process, TIME_SCALE, the shared data folder
# $DATA, and the reporting tools/run_tests.sh reads: "ok   what" or "FAIL what  (the check)" per
# check, and the script's exit status (`exit $status` at its end) non-zero when any check failed.
set -u
BUILD=${BUILD:-build}
B=$(realpath "$BUILD")
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
# Every time limit in the scripts is a plain limit times TIME_SCALE (tools/run_tests.sh exports it:
# 4 for a sanitizer build), so a deadlock fails fast and a slow build does not fail by the clock.
TIME_SCALE=${TIME_SCALE:-1}
DATA=${LLMPI_SHARED_DATA:-../shared/data}
status=0
# check "what it shows" "shell condition": the condition is eval'ed; returns 1 when it fails, so
# a script may stop a sequence that makes no sense after a failure (check ... || exit $status).
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1  ($2)"; status=1; return 1; fi; }
skip() { echo "skip $1"; }
# tiny_rte DIR: a small entailment set in GLUE's RTE layout (64 sentence pairs of 12 words, two
# labels) as DIR/train.tsv and DIR/dev.tsv, for a bert run.
tiny_rte() {
  mkdir -p "$1"
  awk 'BEGIN { OFS = "\t"; print "index", "sentence1", "sentence2", "label"
    split("the a cat dog sat ran on under mat rug hello world", w, " ")
    for (i = 0; i < 64; i++) {
      s1 = w[i % 12 + 1] " " w[(i * 7) % 12 + 1] " " w[(i * 5 + 3) % 12 + 1] "."
      s2 = w[(i * 3) % 12 + 1] " " w[(i + 4) % 12 + 1] "."
      print i, s1, s2, (i % 3 ? "entailment" : "not_entailment") } }' >"$1/train.tsv"
  cp "$1/train.tsv" "$1/dev.tsv"
}
# wait_for "shell condition" SECONDS: polls the (eval'ed) condition every 0.1 s; returns 1 when it
# still fails after SECONDS.
wait_for() { local i; for ((i = 0; i < $2 * 10; i++)); do eval "$1" && return 0; sleep 0.1; done; return 1; }
# set_floats FILE.safetensors TENSOR FIRST COUNT HEX: overwrite COUNT float32 values of TENSOR from
# element FIRST with the 4 bytes HEX as stored (ffffffff: NaN; ffff7f7f: the largest float,
# 3.4028235e38). Returns 1 when the header has no F32 tensor of that name.
set_floats() {
  local f=$1 name=$2 first=$3 count=$4 hex=$5 n off bytes i
  n=$(od -An -tu8 -N8 "$f" | tr -d ' ')
  off=$(head -c $((8 + n)) "$f" | tail -c "$n" |
        grep -oP "\"${name//./\\.}\":\{\"dtype\":\"F32\",\"shape\":\[[0-9,]*\],\"data_offsets\":\[\K[0-9]+") || return 1
  bytes=$(printf '\\x%s' "${hex:0:2}" "${hex:2:2}" "${hex:4:2}" "${hex:6:2}")
  for ((i = 0; i < count; i++)); do printf "$bytes"; done |
    dd of="$f" bs=1 seek=$((8 + n + off + 4 * first)) conv=notrunc status=none
}
