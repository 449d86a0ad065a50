#!/usr/bin/env bash
# The floors of docs/DESIGN.md hold in the code (tools/check_floors.sh), and the check fails, naming
# the file and the rule, when an include goes up a floor or a folder has no row.
source "$(dirname "${BASH_SOURCE[0]}")/lib.bash"
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT

out=$(bash tools/check_floors.sh 2>&1); rc=$?
check "every include in src/ and kernels/ stays on the floors docs/DESIGN.md allows" "[ $rc = 0 ]" || echo "$out"

mkdir -p "$tmp/repo/docs" && cp -r src kernels "$tmp/repo/" && cp docs/DESIGN.md "$tmp/repo/docs/"
printf '#include "train/trainer.h"\n' >>"$tmp/repo/src/model/model_desc.cpp"
out=$(bash tools/check_floors.sh "$tmp/repo" 2>&1); rc=$?
check "an include up a floor (model/ -> train/) fails, naming the file and the rule" \
  "[ $rc = 1 ] && grep -q 'src/model/model_desc.cpp:.*model/ may not include train/' <<<\"\$out\""

cp src/model/model_desc.cpp "$tmp/repo/src/model/model_desc.cpp"
mkdir -p "$tmp/repo/src/attic" && printf '#include "runtime/error.h"\n' >"$tmp/repo/src/attic/a.cpp"
out=$(bash tools/check_floors.sh "$tmp/repo" 2>&1); rc=$?
check "a folder the table does not place fails, naming it" \
  "[ $rc = 1 ] && grep -q 'folder attic/ is not in docs/DESIGN.md' <<<\"\$out\""
exit $status
