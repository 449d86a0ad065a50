#!/usr/bin/env bash
# tools/demo_run_aside.sh DIR: before `make run` trains a fresh demo run in DIR, the run already
# there (if any) is moved to DIR.previous, replacing the one kept there before (both are demo
# runs that `make run` made). A run still training in DIR (its LOCK held: src/train/run_dir.h) is
# left alone: exit 1 with one line naming its holder. Exit 0 otherwise.
set -u
dir=${1:?usage: tools/demo_run_aside.sh DIR}
[ -e "$dir" ] || exit 0
if [ -e "$dir/LOCK" ] && ! flock -n "$dir/LOCK" true; then
  echo "llmpi run: $dir is in use by a demo run still training ($(tr '\n' ' ' <"$dir/LOCK" | sed 's/ *$//')):" \
       "let it finish or stop it, then run make run again" >&2
  exit 1
fi
rm -rf "$dir.previous" && mv "$dir" "$dir.previous" || exit 1
echo "llmpi run: the previous demo run is kept in $dir.previous; this one trains afresh in $dir"
