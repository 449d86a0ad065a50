#!/bin/bash
# measure_links.sh — the alpha and beta of this machine's links, measured, as the one JSON file
# that llmpi-plan reads (its link table for "this machine"). For every named link and world size
# it runs bench-allreduce_bw with
#     --op allreduce,reduce_scatter,allgather,sendrecv --fit --bytes SIZES
# and combines the fits. Run as root (the netns links create network namespaces).
#
#   tools/measure_links.sh [OPTIONS] OUTJSON
#
# Links (--links, default all three):
#   loopback       plain `mpiexec -n W` on this machine: MPICH's intra-node path (UCX shared
#                  memory); ranks_per_node = W
#   netns-1gbit    W/2 ranks in each of two network namespaces joined by tools/netns_link.sh's
#   netns-10gbit   tbf rate-limited veth (1 or 10 gbit, latency 1ms, MTU 1500), launched with the
#                  environment that script documents (UCX_TLS=tcp,self, MPIR_CVAR_NOLOCAL=1,
#                  UCX_NET_DEVICES = the namespace's veth), ranks 0..W/2-1 in namespace A, the rest
#                  in B; ranks_per_node = W/2. With MPIR_CVAR_NOLOCAL=1 two ranks in one namespace
#                  talk over TCP on that namespace's own address (kernel loopback, not rate-limited).
#                  sendrecv uses --pairs halves there (rank i with i + W/2), so every pair crosses
#                  the link, all pairs at once (at W = 4: two flows share each direction).
# OPTIONS
#   --build DIR     where bench-allreduce_bw is (default build; relative to the repository)
#   --links LIST    comma list of the links above (default loopback,netns-1gbit,netns-10gbit)
#   --worlds LIST   comma list of world sizes, even (default 2,4)
#   --sizes LIST    --bytes of the bench (default 4k,16k,64k,256k,1M,4M,16M,64M)
#   --iters I       timed iterations per size (default 10); --warmup W untimed first (default 2)
#   --max-seconds S  cap per op and size of one run (default 8): after S seconds the bench skips
#                   the remaining warm-ups and stops after 3 timed iterations (a slow collective on
#                   oversubscribed ranks cannot take the whole run)
#   --repeats R     run every (link, world) R times, round-robin over all of them so that a
#                   machine's drifting load spreads over all (default 2); per size the smallest
#                   of the repeats' medians is fitted: other jobs on a shared machine only ever add
#                   time, so the quietest repeat is the link's (every repeat's median is kept)
#   --timeout S     limit per bench run in seconds (default 900)
#   --keep DIR      keep the bench's own JSON files and logs there (default: a temporary folder,
#                   removed at the end)
#   --from DIR      run nothing: combine again what earlier runs kept with --keep DIR (links,
#                   worlds, sizes are read from DIR/run.env, the commands from DIR/commands.txt)
# More repeats can be added to a kept folder: a later run with --keep DIR (same --sizes) numbers
# its runs after those already there, and every run of a (link, world) found is combined.
#
# Output (OUTJSON, written via OUTJSON.tmp + rename; field names are what llmpi-plan reads):
#   {"date", "machine": "<uname -n>, <nproc> CPUs, <cpu model>", "mpi": "<mpichversion>",
#    "command", "sizes", "iters", "warmup", "max_seconds", "repeats", "fit_method",
#    "links": [{"name", "world", "ranks_per_node", "pairs", "launch", "seconds",
#               "loadavg_before_after" (per repeat: the 1-minute load average; others' work),
#               "ops": {"allreduce"|"reduce_scatter"|"allgather"|"sendrecv":
#                         {"a_s", "b_s_per_byte", "alpha_s", "beta_s_per_byte", "gbit_s",
#                          "max_rel_residual", "a_clamped",
#                          "fit_large": {the same fields, "min_bytes": 4e6}  (null if < 2 such sizes),
#                          "points": [{"bytes", "median_ms", "min_ms", "max_ms", "iters" (timed, all repeats),
#                                      "median_ms_repeats"}],
#                          "runs": [{"alpha_s", "gbit_s"}]   (each repeat's own fit)}}}]}
#   t(N) = a + b*N is fitted by weighted least squares (weights 1/t^2) to the medians; alpha and
#   beta follow from the algorithm formulas (see bench/allreduce_bw.cpp's header):
#   allreduce a = 2(p-1) alpha, b = 2(p-1)/p beta; reduce_scatter, allgather a = (p-1) alpha,
#   b = (p-1)/p beta; sendrecv (one way) a = alpha, b = beta; gbit_s = 8 / beta / 1e9.
#   fit_large is the same fit over the sizes >= 4 MB only: tbf lets a burst (1 ms of the rate: 125 kB
#   at 1gbit, 1.25 MB at 10gbit) through at veth speed, so smaller messages say little about the
#   rate; for bucket-sized messages fit_large predicts better (docs/PERF.md "Links").
#   The combining step refits in Python and, for every single run, checks that its refit equals
#   the bench's own fit (a cross-check of the C++ fit); a mismatch stops the script.
#
# MPICH 4.0.2 over UCX TCP now and then never returns from MPI_Finalize; a run whose JSON is
# written and which has not exited 20 s later is stopped and counts (a warning says so).
# Progress lines go to stderr. Needs: bash, python3 (stdlib only), mpiexec, and for netns links
# root, ip and tc (tools/netns_link.sh).
set -euo pipefail

PROG=measure_links.sh
die() { echo "$PROG: error: $*" >&2; exit 2; }
say() { echo "$PROG: $*" >&2; }

ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=build LINKS=loopback,netns-1gbit,netns-10gbit WORLDS=2,4 SIZES=4k,16k,64k,256k,1M,4M,16M,64M
ITERS=10 WARMUP=2 REPEATS=2 MAX_SECONDS=8 TIMEOUT=900 KEEP="" FROM="" OUT=""
ARGS_GIVEN="$*"
while [ $# -gt 0 ]; do
  case "$1" in
    --build) BUILD="${2:?--build needs a value}"; shift 2 ;;
    --links) LINKS="${2:?--links needs a value}"; shift 2 ;;
    --worlds) WORLDS="${2:?--worlds needs a value}"; shift 2 ;;
    --sizes) SIZES="${2:?--sizes needs a value}"; shift 2 ;;
    --iters) ITERS="${2:?--iters needs a value}"; shift 2 ;;
    --warmup) WARMUP="${2:?--warmup needs a value}"; shift 2 ;;
    --max-seconds) MAX_SECONDS="${2:?--max-seconds needs a value}"; shift 2 ;;
    --repeats) REPEATS="${2:?--repeats needs a value}"; shift 2 ;;
    --timeout) TIMEOUT="${2:?--timeout needs a value}"; shift 2 ;;
    --keep) KEEP="${2:?--keep needs a value}"; shift 2 ;;
    --from) FROM="${2:?--from needs a value}"; shift 2 ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) die "unknown option '$1' (see --help)" ;;
    *) [ -z "$OUT" ] || die "one OUTJSON only, got '$OUT' and '$1'"; OUT="$1"; shift ;;
  esac
done
[ -n "$OUT" ] || die "say where to write the result: $0 [OPTIONS] OUTJSON (see --help)"
COMMAND="tools/measure_links.sh $ARGS_GIVEN" DATE=""
if [ -n "$FROM" ]; then
  [ -f "$FROM/run.env" ] || die "--from $FROM: no run.env there (made by a run with --keep $FROM)"
  # shellcheck disable=SC1091  # written by this script
  . "$FROM/run.env"
  KEEP="$FROM"
fi
for v in ITERS WARMUP REPEATS TIMEOUT MAX_SECONDS; do
  [[ "${!v}" =~ ^[1-9][0-9]*$ ]] || die "--$(tr _ - <<<"${v,,}") must be a positive integer, got '${!v}'"
done
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BENCH="$BUILD/bench-allreduce_bw"
[ -n "$FROM" ] || [ -x "$BENCH" ] || die "$BENCH not found; build it: make BUILD=${BUILD#"$ROOT"/} $BUILD/bench-allreduce_bw"
command -v mpiexec >/dev/null 2>&1 || die "'mpiexec' not found (apt-get install mpich)"
command -v python3 >/dev/null 2>&1 || die "'python3' not found (it combines the JSON files)"
IFS=, read -r -a LINK_LIST <<<"$LINKS"
IFS=, read -r -a WORLD_LIST <<<"$WORLDS"
NEED_ROOT=0
for l in "${LINK_LIST[@]}"; do
  case "$l" in
    loopback) ;;
    netns-1gbit|netns-10gbit) NEED_ROOT=1 ;;
    *) die "--links: unknown link '$l' (use loopback, netns-1gbit, netns-10gbit)" ;;
  esac
done
for w in "${WORLD_LIST[@]}"; do
  if ! [[ "$w" =~ ^[0-9]+$ ]] || [ "$w" -lt 2 ] || [ $((w % 2)) != 0 ]; then
    die "--worlds: '$w' must be an even number >= 2"
  fi
done
if [ -z "$FROM" ] && [ "$NEED_ROOT" = 1 ] && [ "$(id -u)" != 0 ]; then
  die "the netns links need root (network namespaces and tc qdiscs): run as root, or --links loopback"
fi
OUT_DIR=$(dirname "$OUT")
[ -d "$OUT_DIR" ] || die "folder '$OUT_DIR' (of OUTJSON) does not exist"

if [ -n "$KEEP" ]; then mkdir -p "$KEEP"; WORK=$(cd "$KEEP" && pwd); else WORK=$(mktemp -d); fi
CHILD=""
cleanup() {
  if [ -n "$CHILD" ] && kill -0 "$CHILD" 2>/dev/null; then
    kill -TERM "$CHILD" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$CHILD" 2>/dev/null || break; sleep 0.2; done
    kill -KILL "$CHILD" 2>/dev/null || true
  fi
  [ -n "$KEEP" ] || rm -rf "$WORK"
}
trap cleanup EXIT
trap 'say "interrupted"; exit 130' INT TERM HUP

# run_bench NAME WORLD: one bench run; writes $WORK/NAME-wWORLD-rK.{json,log,launch,seconds,load}
# with K the next free repeat number there (so runs added with --keep DIR pool with earlier ones)
run_bench() {
  local name=$1 world=$2 rep=1 tag js log pairs=neighbours
  while [ -e "$WORK/$name-w$world-r$rep.launch" ]; do rep=$((rep + 1)); done
  tag="$name-w$world-r$rep" LAST_TAG="$name-w$world-r$rep"
  js="$WORK/$tag.json" log="$WORK/$tag.log"
  rm -f "$js" "$js.tmp"
  local -a cmd args
  case "$name" in
    netns-*) pairs=halves ;;
  esac
  args=(--op "allreduce,reduce_scatter,allgather,sendrecv" --fit --bytes "$SIZES" --iters "$ITERS"
        --warmup "$WARMUP" --max-seconds "$MAX_SECONDS" --pairs "$pairs" --json "$js")
  case "$name" in
    loopback)
      cmd=(mpiexec -n "$world" "$BENCH" "${args[@]}") ;;
    netns-*)
      local rate=${name#netns-} rpn=$((world / 2))
      # the MPMD launch of tools/netns_link.sh's `mpi` form, with rpn ranks in each namespace
      # shellcheck disable=SC2016  # expanded by the inner bash, where netns_link.sh set them
      cmd=("$ROOT/tools/netns_link.sh" --quiet --rate "$rate" --latency 1ms --stats "$WORK/$tag-link.json" run --
           bash -c 'exec mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 \
             -n "$0" -env UCX_NET_DEVICES "$LLMPI_NETNS_DEV_A" ip netns exec "$LLMPI_NETNS_A" "$@" : \
             -n "$0" -env UCX_NET_DEVICES "$LLMPI_NETNS_DEV_B" ip netns exec "$LLMPI_NETNS_B" "$@"' \
           "$rpn" "$BENCH" "${args[@]}") ;;
  esac
  printf '%s\n' "${cmd[*]}" >"$WORK/$tag.launch"
  cut -d' ' -f1 /proc/loadavg >"$WORK/$tag.load"  # the 1-minute load average before and after
  local t0 done_at="" rc=0 waited
  t0=$(date +%s)
  "${cmd[@]}" >"$log" 2>&1 &
  CHILD=$!
  while kill -0 "$CHILD" 2>/dev/null; do
    sleep 0.5
    waited=$(( $(date +%s) - t0 ))
    if [ -z "$done_at" ] && [ -s "$js" ]; then done_at=$(date +%s); fi
    if [ -n "$done_at" ] && [ $(( $(date +%s) - done_at )) -gt 20 ]; then
      say "warning: $tag: JSON written but no exit 20 s later (MPI_Finalize hang): stopping it"
      kill -TERM "$CHILD" 2>/dev/null || true
      break
    fi
    if [ "$waited" -gt "$TIMEOUT" ]; then
      kill -TERM "$CHILD" 2>/dev/null || true
      wait "$CHILD" 2>/dev/null || true
      CHILD=""
      tail -20 "$log" >&2
      die "$tag: timed out after $TIMEOUT s (log above; --timeout S to allow more)"
    fi
  done
  set +e
  wait "$CHILD"
  rc=$?
  set -e
  CHILD=""
  if [ ! -s "$js" ]; then
    tail -30 "$log" >&2
    die "$tag: the bench failed (exit $rc) and wrote no JSON (log above)"
  fi
  echo $(( $(date +%s) - t0 )) >"$WORK/$tag.seconds"
  cut -d' ' -f1 /proc/loadavg >>"$WORK/$tag.load"
}

TOTAL=$(( ${#LINK_LIST[@]} * ${#WORLD_LIST[@]} * REPEATS )) N=0 T_START=$(date +%s)
if [ -z "$FROM" ]; then
DATE=$(date -u +%Y-%m-%dT%H:%M:%SZ)
if [ ! -f "$WORK/run.env" ]; then  # the first run into WORK says what the combined file covers
  printf '%s=%q\n' LINKS "$LINKS" WORLDS "$WORLDS" SIZES "$SIZES" ITERS "$ITERS" WARMUP "$WARMUP" \
    MAX_SECONDS "$MAX_SECONDS" DATE "$DATE" >"$WORK/run.env"
else
  [ "$(sed -n 's/^SIZES=//p' "$WORK/run.env")" = "$(printf '%q' "$SIZES")" ] \
    || die "$WORK holds runs with other --sizes (see $WORK/run.env); use another --keep folder"
fi
echo "$DATE $COMMAND" >>"$WORK/commands.txt"
say "$TOTAL bench runs: links $LINKS, worlds $WORLDS, sizes $SIZES, $ITERS iterations (+$WARMUP warm-up, at most ~$MAX_SECONDS s per op and size), $REPEATS repeat(s); work folder $WORK"
for rep in $(seq "$REPEATS"); do
  for name in "${LINK_LIST[@]}"; do
    for world in "${WORLD_LIST[@]}"; do
      N=$((N + 1))
      say "[$N/$TOTAL] $name, world $world (round $rep of $REPEATS) ..."
      run_bench "$name" "$world"
      say "[$N/$TOTAL] $LAST_TAG: $(cat "$WORK/$LAST_TAG.seconds") s; $(python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
print("; ".join("%s alpha %.1f us, %.2f Gbit/s" % (o["op"], o["fit"]["alpha_s"] * 1e6, o["fit"]["gbit_s"] or 0) for o in d["ops"]))' "$WORK/$LAST_TAG.json")"
    done
  done
done

fi
# the combined file covers every run in WORK: its date is the first run's, its command all of them
DATE=$(sed -n 's/^DATE=//p' "$WORK/run.env")
COMMAND=$(paste -sd';' "$WORK/commands.txt" | sed 's/;/; /g')

MACHINE="$(uname -n), $(nproc) CPUs, $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //')"
MPI="$(mpichversion 2>/dev/null | grep -E 'Version|Device' | tr -s ' \t' ' ' | paste -sd, - | sed 's/,/, /g' || echo unknown)"
python3 - "$WORK" "$OUT" "$MACHINE" "$MPI" "$COMMAND" "$DATE" "$LINKS" "$WORLDS" "$SIZES" \
  "$ITERS" "$WARMUP" "$MAX_SECONDS" <<'PYEOF'
import glob, json, os, re, sys
work, out, machine, mpi, command, date, links, worlds, sizes, iters, warmup, max_seconds = sys.argv[1:]
LARGE = 4e6  # fit_large: the sizes >= 4 MB only (beyond the 10gbit tbf's 1.25 MB burst)

def factors(op, p):  # (ka, kb) of a = ka alpha, b = kb beta (bench/allreduce_bw.cpp's header)
    return {"allreduce": (2 * (p - 1), 2 * (p - 1) / p), "reduce_scatter": (p - 1, (p - 1) / p),
            "allgather": (p - 1, (p - 1) / p), "sendrecv": (1, 1)}[op]

def fit(op, p, xs, ts):
    """weighted least squares t = a + b x, weights 1/t^2; a < 0 clamped to 0 (b through the origin)"""
    if len(set(xs)) < 2:
        return None
    w = [1 / t ** 2 for t in ts]
    S0, S1, S2 = sum(w), sum(wi * x for wi, x in zip(w, xs)), sum(wi * x * x for wi, x in zip(w, xs))
    T0, T1 = sum(wi * t for wi, t in zip(w, ts)), sum(wi * x * t for wi, x, t in zip(w, xs, ts))
    det = S0 * S2 - S1 * S1
    a, b = (S2 * T0 - S1 * T1) / det, (S0 * T1 - S1 * T0) / det
    clamped = a < 0
    if clamped:
        a, b = 0.0, T1 / S2
    ka, kb = factors(op, p)
    beta = b / kb
    return {"a_s": a, "b_s_per_byte": b, "alpha_s": a / ka, "beta_s_per_byte": beta,
            "gbit_s": 8 / beta / 1e9 if beta > 0 else None,
            "max_rel_residual": max(abs(a + b * x - t) / t for x, t in zip(xs, ts)), "a_clamped": clamped}

def close(x, y, tol):
    return (x is None and y is None) or (x is not None and y is not None and abs(x - y) <= tol * max(abs(x), abs(y), 1e-30))

entries = []
found = {}  # (link, world) -> repeat numbers, from the files in work
for path in glob.glob(os.path.join(work, "*-w*-r*.json")):
    m = re.fullmatch(r"(.+)-w(\d+)-r(\d+)\.json", os.path.basename(path))
    if m:
        found.setdefault((m.group(1), int(m.group(2))), []).append(int(m.group(3)))
order = ["loopback", "netns-1gbit", "netns-10gbit"]
for name, world in sorted(found, key=lambda k: (order.index(k[0]) if k[0] in order else 99, k[0], k[1])):
        runs = []
        for rep in sorted(found[(name, world)]):
            tag = f"{name}-w{world}-r{rep}"
            with open(os.path.join(work, tag + ".json")) as f:
                d = json.load(f)
            if d["ranks"] != world:
                sys.exit(f"measure_links.sh: error: {tag}: the bench ran {d['ranks']} ranks, not {world}")
            with open(os.path.join(work, tag + ".launch")) as f:
                launch = f.read().strip()
            with open(os.path.join(work, tag + ".seconds")) as f:
                seconds = float(f.read())
            with open(os.path.join(work, tag + ".load")) as f:
                load = [float(x) for x in f.read().split()]
            runs.append((d, launch, seconds, load))
        ops = {}
        for op in ("allreduce", "reduce_scatter", "allgather", "sendrecv"):
            per_run = [next(o for o in d["ops"] if o["op"] == op) for d, _, _, _ in runs]
            for k, o in enumerate(per_run):
                # cross-check of the bench's fit: the Python refit of the same (printed, 5-digit)
                # medians predicts every point to 0.1%, and alpha, beta = a/ka, b/kb
                xs, ts = [p["bytes"] for p in o["points"]], [p["median_ms"] * 1e-3 for p in o["points"]]
                mine, theirs, (ka, kb) = fit(op, world, xs, ts), o["fit"], factors(op, world)
                worst = max(abs((mine["a_s"] + mine["b_s_per_byte"] * x) - (theirs["a_s"] + theirs["b_s_per_byte"] * x)) / t
                            for x, t in zip(xs, ts))
                if worst > 1e-3 or not close(theirs["alpha_s"], theirs["a_s"] / ka, 1e-4) \
                        or not close(theirs["beta_s_per_byte"], theirs["b_s_per_byte"] / kb, 1e-4):
                    sys.exit(f"measure_links.sh: error: {name} world {world} repeat {k + 1} {op}: the bench's fit "
                             f"{theirs} differs from the refit {mine} (worst point {worst:.2g})")
            points = []
            for i, p in enumerate(per_run[0]["points"]):
                rows = [o["points"][i] for o in per_run]
                if any(r["bytes"] != p["bytes"] for r in rows):
                    sys.exit(f"measure_links.sh: error: {name} world {world}: the repeats measured different sizes")
                # the quietest repeat's median (others' load only adds time); all kept
                points.append({"bytes": p["bytes"], "median_ms": min(r["median_ms"] for r in rows),
                               "min_ms": min(r["min_ms"] for r in rows), "max_ms": max(r["max_ms"] for r in rows),
                               "iters": sum(r.get("iters", 0) for r in rows),
                               "median_ms_repeats": [r["median_ms"] for r in rows]})
            xs, ts = [p["bytes"] for p in points], [p["median_ms"] * 1e-3 for p in points]
            f = fit(op, world, xs, ts)
            f["points"] = points
            f["fit_large"] = fit(op, world, [x for x in xs if x >= LARGE], [t for x, t in zip(xs, ts) if x >= LARGE])
            if f["fit_large"]:
                f["fit_large"]["min_bytes"] = LARGE
            f["runs"] = [{"alpha_s": o["fit"]["alpha_s"], "gbit_s": o["fit"]["gbit_s"]} for o in per_run]
            ops[op] = f
        entries.append({"name": name, "world": world, "ranks_per_node": world if name == "loopback" else world // 2,
                        "pairs": runs[0][0].get("pairs"), "repeats": len(runs), "launch": runs[0][1],
                        "seconds": sum(r[2] for r in runs), "loadavg_before_after": [r[3] for r in runs],
                        "ops": ops})

doc = {"date": date, "machine": machine,
       "mpi": mpi, "command": command, "sizes": sizes, "iters": int(iters), "warmup": int(warmup), "max_seconds": int(max_seconds),
       "fit_method": "t(N) = a + b N, weighted least squares (weights 1/t^2) over all sizes, on the per-size "
                     "smallest of the repeats' medians; a < 0 clamped to 0; alpha, beta from the ring formulas. "
                     "fit_large: the same over the sizes >= fit_large.min_bytes only",
       "links": entries}
tmp = out + ".tmp"
with open(tmp, "w") as f:
    json.dump(doc, f, indent=1)
    f.write("\n")
os.replace(tmp, out)
print(f"{'link':<13} {'W':>2} {'op':<15} {'alpha_us':>9} {'Gbit/s':>8} {'max_resid':>9}   "
      f"{'>=4MB: alpha_us':>15} {'Gbit/s':>8} {'max_resid':>9}", file=sys.stderr)
for e in entries:
    for op, f in e["ops"].items():
        g = f["fit_large"]
        print(f"{e['name']:<13} {e['world']:>2} {op:<15} {f['alpha_s'] * 1e6:9.2f} {f['gbit_s'] or float('nan'):8.3f} "
              f"{f['max_rel_residual'] * 100:8.1f}%{'c' if f['a_clamped'] else ' '}  "
              + (f"{g['alpha_s'] * 1e6:15.2f} {g['gbit_s'] or float('nan'):8.3f} {g['max_rel_residual'] * 100:8.1f}%"
                 f"{'c' if g['a_clamped'] else ''}" if g else "(fewer than 2 sizes >= 4 MB)"), file=sys.stderr)
print("(c: a < 0 clamped to 0)", file=sys.stderr)
PYEOF
say "wrote $OUT ($(( $(date +%s) - T_START )) s)"
