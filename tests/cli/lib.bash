# Sourced by every tests/cli/*.sh (a .bash file, so not itself one of the checks). The scripts run
# from the repository root as `bash tests/cli/NAME.sh` (BUILD=dir for another build folder). This
# gives them the programs' folder $B, one thread per process, the shared data folder $DATA, and
# the reporting tools/run_tests.sh reads: "ok   what" or "FAIL what  (the check)" per check, and
# the script's exit status (`exit $status` at its end) non-zero when any check failed.
set -u
BUILD=${BUILD:-build}
B=$(realpath "$BUILD")
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
DATA=${LLMPI_SHARED_DATA:-../shared/data}
status=0
# check "what it shows" "shell condition": the condition is eval'ed; returns 1 when it fails, so
# a script may stop a sequence that makes no sense after a failure (check ... || exit $status).
check() { if eval "$2"; then echo "ok   $1"; else echo "FAIL $1  ($2)"; status=1; return 1; fi; }
skip() { echo "skip $1"; }
