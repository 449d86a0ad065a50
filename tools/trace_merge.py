#!/usr/bin/python3
"""Merge llmpi's per-rank Chrome traces into one timeline, or summarise them.

llmpi-train writes run_dir/trace-rank{N}.json for the first runtime.trace_steps steps: complete
events ("ph":"X", ts/dur in microseconds from that rank's start of training) on two tracks per
rank, tid 0 "compute" (data, forward, backward, wait for gradients, optimizer; and the bucket
collectives when parallel.overlap=false) and tid 1 "communication" (one span per bucket
collective, when parallel.overlap=true).

  tools/trace_merge.py RUN_DIR                      -> RUN_DIR/trace-merged.json (open in Perfetto)
  tools/trace_merge.py RUN_DIR --align -o all.json   shift ranks so step 0's forward lines up
  tools/trace_merge.py a/trace-rank0.json a/trace-rank1.json -o merged.json
  tools/trace_merge.py RUN_DIR --summary [--json]   per rank: time per event, comm/backward overlap

Exit status: 0 on success, 2 on bad input (missing directory, no trace files, malformed JSON).
Standard library only.
"""

import argparse
import json
import os
import re
import sys

PROG = "trace_merge"
TRACE_RE = re.compile(r"^trace-rank(\d+)\.json$")
BUCKET_RE = re.compile(r"^(.*) bucket \d+$")
COMPUTE_TID, COMM_TID = 0, 1
# Rows of the summary, in this order; any other event name is listed after them.
MAIN_NAMES = ["data", "forward", "backward", "wait for gradients", "optimizer"]
BUCKETS = "bucket collectives"


class InputError(Exception):
    pass


# ---------------------------------------------------------------------------------------------
# Reading


def find_trace_files(paths):
    """Expand the command-line paths (run directories and/or trace files) to a list of files."""
    files = []
    for p in paths:
        if os.path.isdir(p):
            found = []
            for name in os.listdir(p):
                m = TRACE_RE.match(name)
                if m:
                    found.append((int(m.group(1)), os.path.join(p, name)))
            if not found:
                hint = ("it is not a run directory (no metrics.jsonl either)"
                        if not os.path.exists(os.path.join(p, "metrics.jsonl"))
                        else "the run wrote no trace: runtime.trace_steps=0, or it stopped before the end of training")
                raise InputError(f"no trace-rank*.json in '{p}': {hint}")
            files.extend(f for _, f in sorted(found))
        elif os.path.isfile(p):
            files.append(p)
        elif os.path.exists(p):
            raise InputError(f"'{p}' is neither a run directory nor a trace file")
        else:
            raise InputError(f"'{p}' does not exist: give a run directory (run.dir) or trace-rank*.json files")
    return files


def load_trace(path):
    """Return (rank, events) of one per-rank trace; rank from the events' pid, else the file name."""
    try:
        with open(path, "r", encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise InputError(f"cannot read '{path}': {e.strerror}")
    except UnicodeDecodeError:
        raise InputError(f"'{path}' is not a text file (not UTF-8): not a Chrome trace")
    if not text.strip():
        raise InputError(f"'{path}' is empty: the run was probably killed while writing it")
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise InputError(f"malformed JSON in '{path}' at line {e.lineno}, column {e.colno}: {e.msg}"
                         " (truncated or not a trace file)")
    # Chrome trace: the JSON object format {"traceEvents": [...]} or the bare array format.
    if isinstance(doc, dict):
        if not isinstance(doc.get("traceEvents"), list):
            raise InputError(f"'{path}' is JSON but not a Chrome trace: no \"traceEvents\" list")
        events = doc["traceEvents"]
    elif isinstance(doc, list):
        events = doc
    else:
        raise InputError(f"'{path}' is JSON but not a Chrome trace (expected an object or an array)")
    for i, e in enumerate(events):
        if not isinstance(e, dict) or "ph" not in e:
            raise InputError(f"'{path}': traceEvents[{i}] is not a trace event (an object with \"ph\")")
        if e["ph"] == "X":
            for k in ("ts", "dur"):
                if not isinstance(e.get(k), (int, float)):
                    raise InputError(f"'{path}': traceEvents[{i}] (\"{e.get('name')}\") has no numeric \"{k}\"")
    pids = {e.get("pid") for e in events if "pid" in e}
    m = TRACE_RE.match(os.path.basename(path))
    if len(pids) == 1 and isinstance(next(iter(pids)), int):
        rank = next(iter(pids))
    elif m:
        rank = int(m.group(1))
    else:
        raise InputError(f"cannot tell the rank of '{path}': its events have pids {sorted(map(str, pids))} "
                         "and the name is not trace-rank<N>.json")
    return rank, events


def load_all(paths):
    files = find_trace_files(paths)
    ranks = {}
    for path in files:
        rank, events = load_trace(path)
        if rank in ranks:
            raise InputError(f"two traces for rank {rank}: '{ranks[rank][0]}' and '{path}' "
                             "(are they from different runs?)")
        ranks[rank] = (path, events)
    return dict(sorted(ranks.items()))


def spans(events, tid=None, name=None):
    return [e for e in events if e.get("ph") == "X" and (tid is None or e.get("tid") == tid)
            and (name is None or e.get("name") == name)]


def step0_forward_ts(events):
    fwd = spans(events, name="forward")
    if not fwd:
        return None
    at0 = [e for e in fwd if isinstance(e.get("args"), dict) and e["args"].get("step") == 0]
    return min(e["ts"] for e in (at0 or fwd))


# ---------------------------------------------------------------------------------------------
# Merge


def merge(ranks, align):
    """One trace with a process (pid = rank) per rank; returns (doc, shifts in us by rank)."""
    shifts = {r: 0.0 for r in ranks}
    if align:
        ref = None
        for r, (path, events) in ranks.items():
            t = step0_forward_ts(events)
            if t is None:
                raise InputError(f"--align: '{path}' has no \"forward\" event to align on")
            if ref is None:
                ref = t  # the lowest rank is the reference
            shifts[r] = ref - t
    out = []
    for r, (path, events) in ranks.items():
        named = {(e.get("name"), e.get("tid")) for e in events if e.get("ph") == "M"}
        if ("process_name", None) not in named:
            out.append({"ph": "M", "name": "process_name", "pid": r, "args": {"name": f"rank {r}"}})
        out.append({"ph": "M", "name": "process_sort_index", "pid": r, "args": {"sort_index": r}})
        for e in events:
            e = dict(e)
            e["pid"] = r
            if "ts" in e and shifts[r]:
                e["ts"] = round(e["ts"] + shifts[r], 3)
            out.append(e)
    doc = {"displayTimeUnit": "ms", "traceEvents": out,
           "otherData": {"merged_by": "llmpi tools/trace_merge.py",
                         "sources": {str(r): p for r, (p, _) in ranks.items()},
                         "aligned_on": "forward of step 0" if align else "none (each rank's own start)",
                         "shift_us": {str(r): round(s, 3) for r, s in shifts.items()}}}
    return doc, shifts


def write_json_atomic(path, doc):
    d = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(d):
        raise InputError(f"cannot write '{path}': directory '{d}' does not exist")
    tmp = path + ".tmp"
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            json.dump(doc, f, separators=(",", ":"))
            f.write("\n")
        os.replace(tmp, path)
    except OSError as e:
        raise InputError(f"cannot write '{path}': {e.strerror}")


# ---------------------------------------------------------------------------------------------
# Summary


def union(intervals):
    """Sorted, disjoint union of (start, end) intervals."""
    out = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        else:
            out.append([s, e])
    return out


def length(intervals):
    return sum(e - s for s, e in intervals)


def intersection_length(a, b):
    """Length of the intersection of two sorted disjoint interval lists."""
    i = j = 0
    total = 0.0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            total += hi - lo
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total


def summarise_rank(events):
    xs = spans(events)
    rows = {}
    methods = set()
    for e in xs:
        m = BUCKET_RE.match(e.get("name", ""))
        key = BUCKETS if m else e.get("name", "?")
        if m:
            methods.add(m.group(1))
        row = rows.setdefault(key, {"count": 0, "total_ms": 0.0, "max_ms": 0.0})
        row["count"] += 1
        row["total_ms"] += e["dur"] / 1e3
        row["max_ms"] = max(row["max_ms"], e["dur"] / 1e3)
    steps = {e["args"]["step"] for e in xs if isinstance(e.get("args"), dict) and "step" in e["args"]}
    start = min((e["ts"] for e in xs), default=0.0)
    end = max((e["ts"] + e["dur"] for e in xs), default=0.0)
    comm = union((e["ts"], e["ts"] + e["dur"]) for e in xs if e.get("tid") == COMM_TID)
    bwd = union((e["ts"], e["ts"] + e["dur"]) for e in spans(events, tid=COMPUTE_TID, name="backward"))
    comm_ms = length(comm) / 1e3
    overlap_ms = intersection_length(comm, bwd) / 1e3
    inline_buckets = any(BUCKET_RE.match(e.get("name", "")) and e.get("tid") != COMM_TID for e in xs)
    order = [n for n in MAIN_NAMES if n in rows] + ([BUCKETS] if BUCKETS in rows else [])
    order += sorted(n for n in rows if n not in order)
    return {
        "steps": len(steps),
        "first_step": min(steps) if steps else None,
        "last_step": max(steps) if steps else None,
        "wall_ms": (end - start) / 1e3,
        "events": [dict(name=n, **rows[n]) for n in order],
        "collective_methods": sorted(methods),
        "comm_track_ms": comm_ms,
        "comm_overlapped_backward_ms": overlap_ms,
        "overlap_pct": (100.0 * overlap_ms / comm_ms) if comm_ms > 0 else None,
        "collectives_on_compute_track": inline_buckets,
    }


def summary(ranks):
    return {str(r): dict(source=p, **summarise_rank(ev)) for r, (p, ev) in ranks.items()}


def print_summary(where, summ):
    print(f"{where}: {len(summ)} rank{'s' if len(summ) != 1 else ''}")
    for r, s in summ.items():
        steps = (f"steps {s['first_step']}-{s['last_step']} ({s['steps']} traced)" if s["steps"] else "no step tags")
        print(f"rank {r}: {steps}, {s['wall_ms']:.1f} ms from first to last event")
        names = []
        for row in s["events"]:
            name = row["name"]
            if name == BUCKETS and s["collective_methods"]:
                name = f"{BUCKETS} ({'/'.join(s['collective_methods'])})"
            names.append(name[:48])
        w = max([len(n) for n in names] + [20]) + 2
        print(f"  {'event':<{w}}{'count':>6}{'total ms':>11}{'mean ms':>10}{'max ms':>10}{'% wall':>8}")
        for name, row in zip(names, s["events"]):
            pct = 100.0 * row["total_ms"] / s["wall_ms"] if s["wall_ms"] > 0 else 0.0
            print(f"  {name:<{w}}{row['count']:>6}{row['total_ms']:>11.1f}{row['total_ms'] / row['count']:>10.2f}"
                  f"{row['max_ms']:>10.2f}{pct:>7.1f}%")
        if s["overlap_pct"] is not None:
            c, o = s["comm_track_ms"], s["comm_overlapped_backward_ms"]
            print(f"  communication track: {c:.1f} ms busy, {o:.1f} ms of it during backward = "
                  f"{s['overlap_pct']:.1f}% overlap ({c - o:.1f} ms outside backward)")
        elif s["collectives_on_compute_track"]:
            print("  communication track: empty (parallel.overlap=false: collectives run on the compute "
                  "track after backward) = 0% overlap")
        else:
            print("  communication track: empty (one rank, or a sync method without gradient collectives)")


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="trace_merge.py",
        description="Merge llmpi per-rank traces (trace-rank{N}.json) into one Chrome trace with a track "
                    "per rank, or print a per-rank summary (--summary).",
        epilog="Open the merged file in https://ui.perfetto.dev or chrome://tracing. Timestamps are each "
               "rank's own (ranks start within a barrier of each other); --align shifts ranks so their "
               "step-0 forward begins at the same time as the lowest rank's.")
    ap.add_argument("inputs", nargs="+", metavar="RUN_DIR|TRACE",
                    help="a run directory (all its trace-rank*.json) or trace files")
    ap.add_argument("-o", "--output", help="merged trace path (default: trace-merged.json in the run "
                                           "directory, or in the directory of the given trace files)")
    ap.add_argument("--align", action="store_true",
                    help="shift each rank so its first forward of step 0 lines up with the lowest rank's")
    ap.add_argument("--summary", action="store_true",
                    help="print per-rank time per event and the communication/backward overlap; write nothing")
    ap.add_argument("--json", action="store_true", help="with --summary: print the summary as JSON")
    args = ap.parse_args(argv)
    if args.json and not args.summary:
        ap.error("--json goes with --summary")

    try:
        ranks = load_all(args.inputs)
        where = args.inputs[0] if len(args.inputs) == 1 else f"{len(args.inputs)} inputs"
        if args.summary:
            summ = summary(ranks)
            if args.json:
                json.dump(summ, sys.stdout, indent=1)
                print()
            else:
                print_summary(where, summ)
            return 0
        out = args.output
        if out is None:
            dirs = {os.path.abspath(p if os.path.isdir(p) else os.path.dirname(p) or ".") for p in args.inputs}
            if len(dirs) != 1:
                raise InputError("the inputs are in different directories: give -o FILE for the merged trace")
            out = os.path.join(args.inputs[0] if os.path.isdir(args.inputs[0])
                               else os.path.dirname(args.inputs[0]) or ".", "trace-merged.json")
        doc, shifts = merge(ranks, args.align)
        write_json_atomic(out, doc)
        n = sum(1 for e in doc["traceEvents"] if e.get("ph") == "X")
        xs = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
        span_ms = (max(e["ts"] + e["dur"] for e in xs) - min(e["ts"] for e in xs)) / 1e3 if xs else 0.0
        al = ""
        if args.align:
            al = ", aligned on step-0 forward (shift " + ", ".join(
                f"rank {r} {s / 1e3:+.3f} ms" for r, s in shifts.items()) + ")"
        print(f"{PROG}: {len(ranks)} rank{'s' if len(ranks) != 1 else ''}, {n} events, "
              f"{span_ms:.1f} ms{al} -> {out}")
        return 0
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
