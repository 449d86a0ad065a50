#!/usr/bin/env python3
"""One pipeline step as the textbook draws it, from a run's per-rank traces.

  tools/pipeline_timeline_svg.py RUN_DIR [--step K] [-o OUT.svg] [--title TEXT]

RUN_DIR is an llmpi-train run directory of a pipelined run (parallel.pp_stages > 1,
runtime.trace_steps > K) holding trace-rank{N}.json. For step K (default: the last traced step)
it draws one row per rank (rank = stage for one pipeline) with every compute action of that step
as a box on wall-clock time: F (forward, blue), B (whole backward, green), BI (input-gradient
backward, light green), W (deferred weight gradients, orange), each labelled with its
micro-batch (and chunk, interleaved: "3.1"). White space is the bubble: time a stage waited for
a neighbour. Each rank's clock starts at its own start of training (after a collective), so the
rows line up to within a millisecond or so. The same traces open in Perfetto after
`tools/trace_merge.py RUN_DIR --align`.

Standard library only. Exit status 2 on bad input.
"""

import argparse
import json
import os
import re
import sys

PROG = "pipeline_timeline_svg"
ACTION_RE = re.compile(r"^(F|BI|B|W)(\d+)(?:\.(\d+))?$")
COLOURS = {"F": "#4c72b0", "B": "#55a868", "BI": "#8fd19e", "W": "#dd8452"}


def die(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr)
    sys.exit(2)


def load(run_dir):
    ranks = {}
    for name in os.listdir(run_dir):
        m = re.match(r"^trace-rank(\d+)\.json$", name)
        if not m:
            continue
        try:
            with open(os.path.join(run_dir, name)) as f:
                t = json.load(f)
        except (OSError, ValueError) as e:
            die(f"cannot read {name}: {e}")
        ranks[int(m.group(1))] = t["traceEvents"] if isinstance(t, dict) else t
    if not ranks:
        die(f"no trace-rank*.json in {run_dir}: run with runtime.trace_steps > 0 and a run.dir")
    return ranks


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_dir")
    p.add_argument("--step", type=int, default=-1)
    p.add_argument("-o", "--out", default="")
    p.add_argument("--title", default="")
    a = p.parse_args()
    if not os.path.isdir(a.run_dir):
        die(f"{a.run_dir} is not a directory")
    ranks = load(a.run_dir)
    boxes = {}  # rank -> [(kind, label, start ms, end ms)]
    steps = set()
    for r, events in ranks.items():
        for e in events:
            m = ACTION_RE.match(e.get("name", ""))
            if e.get("ph") == "X" and m and isinstance(e.get("args"), dict) and "step" in e["args"]:
                steps.add(e["args"]["step"])
    if not steps:
        die("the traces hold no pipeline actions (F/B/BI/W): is this a run with parallel.pp_stages > 1?")
    step = max(steps) if a.step < 0 else a.step
    if step not in steps:
        die(f"step {step} is not in the traces (traced steps: {sorted(steps)})")
    for r, events in ranks.items():
        for e in events:
            m = ACTION_RE.match(e.get("name", ""))
            if e.get("ph") != "X" or not m or e.get("args", {}).get("step") != step:
                continue
            label = m.group(2) + (("." + m.group(3)) if m.group(3) else "")
            t0 = e["ts"] / 1000.0
            boxes.setdefault(r, []).append((m.group(1), label, t0, t0 + e["dur"] / 1000.0))
    t_lo = min(b[2] for bs in boxes.values() for b in bs)
    t_hi = max(b[3] for bs in boxes.values() for b in bs)
    span = max(t_hi - t_lo, 1e-6)
    W, left, row, top = 1000, 70, 34, 40
    n = max(ranks) + 1
    H = top + n * row + 50
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="10">',
           '<rect width="100%" height="100%" fill="white"/>']
    title = a.title or f"{os.path.basename(os.path.normpath(a.run_dir))}: step {step}"
    out.append(f'<text x="{W / 2}" y="18" text-anchor="middle" font-size="13">{title}</text>')
    scale = (W - left - 20) / span
    busy_total = 0.0
    for r in range(n):
        y = top + r * row
        out.append(f'<text x="{left - 8}" y="{y + row / 2 + 3}" text-anchor="end">stage {r}</text>')
        out.append(f'<line x1="{left}" y1="{y + row - 2}" x2="{W - 20}" y2="{y + row - 2}" stroke="#ddd"/>')
        for kind, label, s, e in boxes.get(r, []):
            x, w = left + (s - t_lo) * scale, max((e - s) * scale, 0.5)
            busy_total += e - s
            out.append(f'<rect x="{x:.1f}" y="{y + 4}" width="{w:.1f}" height="{row - 10}" fill="{COLOURS[kind]}" '
                       f'stroke="white" stroke-width="0.5"><title>{kind}{label} {e - s:.1f} ms</title></rect>')
            if w > 9:
                out.append(f'<text x="{x + w / 2:.1f}" y="{y + row / 2 + 3}" text-anchor="middle" fill="white">{label}</text>')
    bubble = 1 - busy_total / (n * span)
    y = top + n * row + 18
    out.append(f'<text x="{left}" y="{y}">0 ms</text>')
    out.append(f'<text x="{W - 20}" y="{y}" text-anchor="end">{span:.0f} ms</text>')
    x = left + 90
    for kind in ("F", "B", "BI", "W"):
        if any(b[0] == kind for bs in boxes.values() for b in bs):
            out.append(f'<rect x="{x}" y="{y - 9}" width="12" height="10" fill="{COLOURS[kind]}"/>')
            out.append(f'<text x="{x + 16}" y="{y}">{kind}</text>')
            x += 50
    out.append(f'<text x="{x + 20}" y="{y}">bubble (idle share of the step on all stages): {bubble:.3f}</text>')
    out.append("</svg>")
    path = a.out or os.path.join(a.run_dir, f"pipeline-step{step}.svg")
    with open(path + ".tmp", "w") as f:
        f.write("\n".join(out) + "\n")
    os.replace(path + ".tmp", path)
    print(f"{PROG}: {path}: {n} stages, step {step}, {span:.1f} ms, bubble {bubble:.3f}")


if __name__ == "__main__":
    main()
