#!/usr/bin/env bash
# tools/check_docs.sh [ROOT] — check the relative links of the documentation.
#
# For README.md, docs/*.md, jobs/README.md and tools/cuda_cpu_sim/README.md under ROOT (default:
# the repository this script is in), every Markdown link [text](target) outside code blocks and
# code spans must:
#   - stay inside ROOT (no ../ out of the repository);
#   - name a file (or a folder holding files) that git tracks in ROOT (every file under ROOT when
#     ROOT is not a git work tree), not an ignored build output;
#   - with #anchor, name a heading of that file by GitHub's rule: lower case, spaces to '-', every
#     character but letters, digits, '-' and '_' dropped; a repeated heading gets -1, -2, ...
# http(s) and mailto links are allowed and not fetched. Prints one line per bad link, naming the
# file, the line and the fix; exit status 1 when there is one, else 0.
set -u
export LC_ALL=C.UTF-8
ROOT=$(realpath "${1:-$(dirname "$0")/..}")
cd "$ROOT" || exit 2

if git -C "$ROOT" rev-parse --is-inside-work-tree >/dev/null 2>&1; then
  tracked=$(git -C "$ROOT" ls-files)
else
  tracked=$(find . -type f -not -path './.git/*' | sed 's|^\./||')
fi
is_tracked() {  # a tracked file, or a folder with a tracked file in it
  local p=$1
  grep -qxF -- "$p" <<<"$tracked" || grep -q -- "^${p%/}/" <<<"$tracked"
}

# The anchors of a Markdown file, one per line.
anchors() {
  awk '/^```/ { code = !code; next } !code && /^#+ / { sub(/^#+ +/, ""); sub(/ +#* *$/, ""); print }' "$1" |
    tr '[:upper:]' '[:lower:]' | sed -E 's/[^[:alnum:] _-]//g; s/ /-/g' |
    awk '{ n = seen[$0]++; print (n ? $0 "-" n : $0) }'
}

# file<TAB>line<TAB>target for every link outside code blocks and code spans.
links() {
  awk '/^ *```/ { code = !code; next }
       !code { line = $0; gsub(/`[^`]*`/, "", line)
               while (match(line, /\]\([^) ]+( "[^"]*")?\)/)) {
                 t = substr(line, RSTART + 2, RLENGTH - 3); sub(/ ".*/, "", t)
                 printf "%s\t%d\t%s\n", FILENAME, FNR, t; line = substr(line, RSTART + RLENGTH) } }' "$@"
}

docs=()
for f in README.md docs/*.md jobs/README.md tools/cuda_cpu_sim/README.md; do [ -f "$f" ] && docs+=("$f"); done
bad=0
while IFS=$'\t' read -r file line target; do
  case $target in http://* | https://* | mailto:*) continue ;; esac
  path=${target%%#*}
  anchor=${target#"$path"}; anchor=${anchor#\#}
  if [ -z "$path" ]; then dest=$file
  else
    dest=$(realpath -m --relative-to="$ROOT" "$(dirname "$file")/$path")
    case $dest in
      .. | ../*) echo "$file:$line: link '$target' leaves the repository: link only to files in it (or a URL)"; bad=1; continue ;;
    esac
    if ! is_tracked "$dest"; then
      echo "$file:$line: link '$target': '$dest' is not a file in the repository: fix the path (or commit the file)"; bad=1; continue
    fi
  fi
  if [ -n "$anchor" ]; then
    if [ ! -f "$dest" ] || [[ $dest != *.md ]]; then
      echo "$file:$line: link '$target': an anchor needs a Markdown file, '$dest' is not one"; bad=1
    elif ! anchors "$dest" | grep -qxF -- "$anchor"; then
      echo "$file:$line: link '$target': '$dest' has no heading '#$anchor': use one of its headings' anchors"; bad=1
    fi
  fi
done < <(links "${docs[@]}")
exit $bad
