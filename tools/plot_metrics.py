#!/usr/bin/python3
"""Plot llmpi run directories: loss curves, throughput and the step-time breakdown.

  tools/plot_metrics.py RUN_DIR [RUN_DIR...] [-o PREFIX] [--smooth N] [--logy] [--skip-first N]

reads each run's metrics.jsonl (and eval.jsonl when present) and writes three PNG files:

  PREFIX-loss.png        train loss vs step (solid) and validation loss (dashed, dots) per run
  PREFIX-throughput.png  tokens/s vs step per run, median in the legend
  PREFIX-breakdown.png   one stacked bar per run: median data / forward / backward /
                         exposed comm / optim milliseconds per step, median step time on top

PREFIX defaults to RUN_DIR/plot for one run and ./llmpi-plot for several. The legend names a run
by its directory name (with parent directories added where two runs share a name). When a run
was resumed from a checkpoint its metrics.jsonl holds some steps twice; the later record wins.

Needs matplotlib (Debian/Ubuntu: apt-get install python3-matplotlib); exits 2 without it, and 2
on bad input (missing directory or metrics.jsonl, malformed line).
"""

import argparse
import json
import math
import os
import statistics
import sys

PROG = "plot_metrics"
# (metrics.jsonl key, label, colour) of the breakdown's stacked parts, bottom to top.
PARTS = [("data_ms", "data", "#8c8c8c"), ("forward_ms", "forward", "#4c72b0"),
         ("backward_ms", "backward", "#55a868"), ("exposed_comm_ms", "exposed comm", "#c44e52"),
         ("optim_ms", "optimizer", "#dd8452")]


class InputError(Exception):
    pass


def read_jsonl(path, required):
    """Objects of a JSON-lines file; a missing optional file gives []. Blank lines are skipped."""
    if not os.path.exists(path):
        if required:
            raise InputError(f"'{path}' does not exist: is '{os.path.dirname(path)}' an llmpi run directory?")
        return []
    out = []
    try:
        with open(path, "r", encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    obj = json.loads(line)
                except json.JSONDecodeError as e:
                    # The last line of a file a killed run was writing may be cut short: skip it.
                    rest = f.read()
                    if not rest.strip() and not line.endswith("\n"):
                        print(f"{PROG}: warning: {path}:{n}: incomplete last line skipped", file=sys.stderr)
                        break
                    raise InputError(f"malformed JSON in {path}:{n}, column {e.colno}: {e.msg}")
                if not isinstance(obj, dict) or not isinstance(obj.get("step"), (int, float)):
                    raise InputError(f"{path}:{n}: not a metrics record (an object with a numeric \"step\")")
                out.append(obj)
    except OSError as e:
        raise InputError(f"cannot read '{path}': {e.strerror}")
    except UnicodeDecodeError:
        raise InputError(f"'{path}' is not a text file")
    # Resumed runs log some steps again: keep the last record of each step, in step order.
    by_step = {}
    for obj in out:
        by_step[obj["step"]] = obj
    return [by_step[s] for s in sorted(by_step)]


class Run:
    def __init__(self, path):
        if not os.path.isdir(path):
            raise InputError(f"run directory '{path}' does not exist" if not os.path.exists(path)
                             else f"'{path}' is not a directory: give run directories (run.dir)")
        self.path = path
        self.metrics = read_jsonl(os.path.join(path, "metrics.jsonl"), required=True)
        if not self.metrics:
            raise InputError(f"'{os.path.join(path, 'metrics.jsonl')}' has no records yet: "
                             "the run logged no step (train.log_every)")
        self.evals = [e for e in read_jsonl(os.path.join(path, "eval.jsonl"), required=False) if "val_loss" in e]
        self.label = os.path.basename(os.path.normpath(path))

    def series(self, key, skip=0):
        pts = [(m["step"], m[key]) for m in self.metrics[skip:] if isinstance(m.get(key), (int, float))]
        return [p[0] for p in pts], [p[1] for p in pts]


def unique_labels(runs):
    """Directory names, made unique by adding parent directories where needed."""
    parts = [os.path.abspath(r.path).rstrip(os.sep).split(os.sep) for r in runs]
    depth = [1] * len(runs)
    for _ in range(8):
        labels = [os.sep.join(p[-d:]) for p, d in zip(parts, depth)]
        dup = {l for l in labels if labels.count(l) > 1}
        if not dup:
            break
        depth = [d + 1 if l in dup else d for l, d in zip(labels, depth)]
    for r, l in zip(runs, labels):
        r.label = l


def smooth(ys, window):
    """Trailing moving average over `window` points (1 = unchanged)."""
    if window <= 1:
        return list(ys)
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= window:
            acc -= ys[i - window]
        out.append(acc / min(i + 1, window))
    return out


def median_of(run, key, skip):
    vals = [m[key] for m in run.metrics[skip:] if isinstance(m.get(key), (int, float))]
    if not vals:  # the run is shorter than --skip-first: use what there is
        vals = [m[key] for m in run.metrics if isinstance(m.get(key), (int, float))]
    return statistics.median(vals) if vals else 0.0


def plot_loss(plt, runs, path, args):
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=args.dpi)
    for i, r in enumerate(runs):
        c = f"C{i % 10}"
        xs, ys = r.series("loss")
        if xs:
            lab = f"{r.label} train" + (f" (avg {args.smooth})" if args.smooth > 1 else "")
            ax.plot(xs, smooth(ys, args.smooth), color=c, lw=1.4, label=lab)
        if r.evals:
            ax.plot([e["step"] for e in r.evals], [e["val_loss"] for e in r.evals], color=c, ls="--",
                    marker="o", ms=4, lw=1.4, label=f"{r.label} val (last {r.evals[-1]['val_loss']:.4f})")
    ax.set_xlabel("step")
    ax.set_ylabel("loss (cross-entropy, nats/token)")
    ax.set_title("Loss")
    if args.logy:
        ax.set_yscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_throughput(plt, runs, path, args):
    fig, ax = plt.subplots(figsize=(9, 5.5), dpi=args.dpi)
    for i, r in enumerate(runs):
        xs, ys = r.series("tokens_per_s")
        if not xs:
            continue
        med = median_of(r, "tokens_per_s", args.skip_first)
        ax.plot(xs, smooth(ys, args.smooth), color=f"C{i % 10}", lw=1.2,
                label=f"{r.label} (median {med:,.0f} tok/s)")
        ax.axhline(med, color=f"C{i % 10}", lw=0.8, ls=":")
    ax.set_xlabel("step")
    ax.set_ylabel("tokens / s (all ranks)")
    ax.set_title("Throughput" + (f" (moving average over {args.smooth} logged steps)" if args.smooth > 1 else ""))
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_breakdown(plt, runs, path, args):
    n = len(runs)
    fig, ax = plt.subplots(figsize=(max(6.0, 1.6 + 1.5 * n), 5.5), dpi=args.dpi)
    xs = list(range(n))
    bottoms = [0.0] * n
    top = 0.0
    for key, label, colour in PARTS:
        vals = [median_of(r, key, args.skip_first) for r in runs]
        ax.bar(xs, vals, 0.6, bottom=bottoms, color=colour, label=label, edgecolor="white", lw=0.5)
        for x, v, b in zip(xs, vals, bottoms):
            if v > 0 and v >= 0.06 * max(1e-9, median_of(runs[x], "step_ms", args.skip_first)):
                ax.text(x, b + v / 2, f"{v:.1f}", ha="center", va="center", fontsize=8, color="white")
        bottoms = [b + v for b, v in zip(bottoms, vals)]
    for x, r in enumerate(runs):
        step = median_of(r, "step_ms", args.skip_first)
        comm = median_of(r, "comm_ms", args.skip_first)
        exposed = median_of(r, "exposed_comm_ms", args.skip_first)
        y = max(step, bottoms[x])
        ax.plot([x - 0.33, x + 0.33], [step, step], color="black", lw=1.2)
        note = f"step {step:.1f} ms"
        if comm > 0:
            hidden = max(0.0, 1.0 - exposed / comm) * 100.0
            note += f"\ncomm {comm:.1f} ms, {hidden:.0f}% hidden"
        ax.text(x, y * 1.02, note, ha="center", va="bottom", fontsize=8)
        top = max(top, y)
    ax.set_xticks(xs)
    ax.set_xticklabels([r.label for r in runs], rotation=20 if n > 3 else 0, ha="right" if n > 3 else "center",
                       fontsize=9)
    ax.set_ylabel("milliseconds per step (median of each part)")
    skip = f", first {args.skip_first} logged step{'s' if args.skip_first != 1 else ''} skipped" if args.skip_first else ""
    ax.set_title(f"Step-time breakdown (medians{skip})")
    ax.set_ylim(0, top * 1.25 if top > 0 else 1)
    ax.set_xlim(-0.6, n - 0.4 + 0.9)  # room on the right for the legend
    handles, labels = ax.get_legend_handles_labels()
    ax.legend(handles[::-1], labels[::-1], fontsize=8, loc="upper right")  # same order as the stack
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="plot_metrics.py",
        description="Plot loss, throughput and the step-time breakdown of llmpi run directories to PNG files.")
    ap.add_argument("runs", nargs="+", metavar="RUN_DIR", help="run directories (each with metrics.jsonl)")
    ap.add_argument("-o", "--prefix", help="output prefix: writes PREFIX-loss.png, PREFIX-throughput.png, "
                                           "PREFIX-breakdown.png (default RUN_DIR/plot, or ./llmpi-plot for several runs)")
    ap.add_argument("--smooth", type=int, default=1, metavar="N",
                    help="moving average over N logged steps for train loss and tokens/s (default 1 = raw)")
    ap.add_argument("--skip-first", type=int, default=1, metavar="N",
                    help="logged steps left out of the medians (warm-up; default 1)")
    ap.add_argument("--logy", action="store_true", help="log scale for the loss axis")
    ap.add_argument("--dpi", type=int, default=110, help="PNG resolution (default 110)")
    args = ap.parse_args(argv)
    if args.smooth < 1 or args.skip_first < 0 or args.dpi < 20:
        ap.error("--smooth must be >= 1, --skip-first >= 0, --dpi >= 20")

    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"{PROG}: error: matplotlib is not installed for {sys.executable}: "
              "apt-get install python3-matplotlib", file=sys.stderr)
        return 2

    try:
        runs = [Run(p) for p in args.runs]
        unique_labels(runs)
        prefix = args.prefix or (os.path.join(args.runs[0], "plot") if len(runs) == 1 else "llmpi-plot")
        d = os.path.dirname(os.path.abspath(prefix))
        if not os.path.isdir(d):
            raise InputError(f"cannot write '{prefix}-*.png': directory '{d}' does not exist")
        written = []
        for suffix, fn in (("loss", plot_loss), ("throughput", plot_throughput), ("breakdown", plot_breakdown)):
            path = f"{prefix}-{suffix}.png"
            try:
                fn(plt, runs, path, args)
            except OSError as e:
                raise InputError(f"cannot write '{path}': {e.strerror}")
            written.append(path)
        print(f"{PROG}: {len(runs)} run{'s' if len(runs) != 1 else ''} -> " + " ".join(written))
        return 0
    except InputError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
