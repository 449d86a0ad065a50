#!/usr/bin/env bash
# The code's floors as docs/DESIGN.md states them: every `#include "folder/..."` in src/ and
# kernels/ must name its own folder or one that DESIGN.md's floors table lets it include.
#   tools/check_floors.sh [ROOT]     (ROOT: the repository, default: this script's)
# The table sits between the lines <!-- floors --> and <!-- /floors --> of ROOT/docs/DESIGN.md,
# one row per folder: | `src/model/` | `params/`, `backend/`, `runtime/` | ... ("anything" lets
# a folder include every other). Prints one line per include that goes where the table does not
# allow (file, line, the include, and the rule) and per folder the table does not place; exits 1
# when there is any, 0 otherwise.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
design=$root/docs/DESIGN.md
[ -f "$design" ] || { echo "check_floors: no $design"; exit 2; }
rules=$(awk '/<!-- floors -->/ {on = 1; next} /<!-- \/floors -->/ {on = 0} on && /^\|/' "$design" |
  awk -F'|' '{ f = $2; gsub(/[` ]/, "", f); a = $3; gsub(/[` ]/, "", a); if (f ~ /\/$/) print f " " a }')
[ -n "$rules" ] || { echo "check_floors: no floors table in $design (<!-- floors --> ... <!-- /floors -->)"; exit 2; }
declare -A allowed
while read -r folder list; do
  folder=${folder%/}; folder=${folder#src/}
  allowed[$folder]=",${list//\//},"
done <<<"$rules"
bad=0
for dir in "$root"/src/*/ "$root"/kernels/; do
  name=$(basename "$dir")
  if [ -z "${allowed[$name]+x}" ]; then
    echo "check_floors: folder $name/ is not in docs/DESIGN.md's floors table: add its row"
    bad=1
    continue
  fi
  [ "${allowed[$name]}" = ",anything," ] && continue
  while IFS=: read -r file line text; do
    inc=$(sed -E 's/^[[:space:]]*#include[[:space:]]*"([a-z_]+)\/.*/\1/' <<<"$text")
    [ "$inc" = "$name" ] && continue
    [ -d "$root/src/$inc" ] || continue          # not a folder of src/ (a kernels-local header, say)
    case "${allowed[$name]}" in *",$inc,"*) continue ;; esac
    echo "${file#$root/}:$line: #include \"$inc/...\": $name/ may not include $inc/ (docs/DESIGN.md, \"Floors\")"
    bad=1
  done < <(grep -rnE '^[[:space:]]*#include[[:space:]]*"[a-z_]+/' "$dir" --include='*.h' --include='*.cpp' \
             --include='*.cu' --include='*.cuh' 2>/dev/null)
done
exit $bad
