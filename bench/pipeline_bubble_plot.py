#!/usr/bin/env python3
"""Plot of the pipeline bubble against the number of micro-batches (docs/images/pipeline_bubble.svg).

Reads the JSON written by `bench-pipeline_schedule_sim --measure --json FILE` (the schedules
simulated with measured per-stage costs F, B, BI, W) and draws, for S = 2, 4, 8, each schedule's
simulated bubble fraction (markers) against M, with the unit-cost formulas as dashed lines: GPipe
and 1F1B (S-1)/(M+S-1), interleaved v = 2 (S-1)/(2M+S-1), zb-h1 (S-1)/(3M+S-1) (F = BI = W), and
zb-h1's formula for the measured costs, (S-1)(F+BI-W) / (M(F+BI+W) + (S-1)(F+BI-W)), solid.

  bench/pipeline_bubble_plot.py SIM.json [--out docs/images/pipeline_bubble.svg]

Needs matplotlib (pip install matplotlib).
"""
import argparse
import json
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

STYLE = {"gpipe": ("tab:gray", "s"), "1f1b": ("tab:blue", "o"), "interleaved": ("tab:green", "^"),
         "zb-h1": ("tab:red", "D")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("sim")
    ap.add_argument("--out", default="docs/images/pipeline_bubble.svg")
    args = ap.parse_args()
    data = json.load(open(args.sim))
    c = data["costs"]
    stages = sorted({r["S"] for r in data["rows"]})
    fig, axes = plt.subplots(1, len(stages), figsize=(4.2 * len(stages), 3.6), sharey=True)
    for ax, S in zip(axes, stages):
        rows = [r for r in data["rows"] if r["S"] == S]
        Ms = sorted({r["M"] for r in rows})
        dense = [S * x / 8 for x in range(8, 8 * 8 + 1)]
        for name, mult in [("1f1b", 1), ("interleaved", 2), ("zb-h1", 3)]:
            ax.plot(dense, [(S - 1) / (mult * m + S - 1) for m in dense], color=STYLE[name][0], lw=1, ls="--",
                    alpha=0.7)
        # zb-h1's formula with these costs: idle (S-1)(F+BI-W) against M(F+BI+W) of work
        idle = (S - 1) * (c["F"] + c["BI"] - c["W"])
        ax.plot(dense, [idle / (m * (c["F"] + c["BI"] + c["W"]) + idle) for m in dense], color=STYLE["zb-h1"][0],
                lw=1, label="zb-h1 formula, these costs" if S == stages[0] else None)
        for name, (color, marker) in STYLE.items():
            pts = sorted((r["M"], r["bubble"]) for r in rows if r["schedule"] == name)
            label = name + (" (= 1f1b)" if name == "gpipe" else "")
            ax.plot([p[0] for p in pts], [p[1] for p in pts], color=color, marker=marker, ls="none",
                    ms=7 if name == "gpipe" else 5, mfc="none" if name == "gpipe" else color, label=label)
        ax.set_xscale("log", base=2)
        ax.set_xticks(Ms)
        ax.set_xticklabels([str(m) for m in Ms])
        ax.set_xlabel("micro-batches M")
        ax.set_title(f"S = {S} stages")
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("bubble fraction")
    axes[0].legend(fontsize=8)
    src = "measured" if data.get("measured") else "unit"
    fig.suptitle(f"Pipeline bubble, simulated with {src} costs F {c['F']:.2f}, B {c['B']:.2f}, "
                 f"BI {c['BI']:.2f} + W {c['W']:.2f} (markers); unit-cost formulas (dashed)", fontsize=9)
    fig.tight_layout()
    fig.savefig(args.out, metadata={"Date": None} if args.out.endswith(".svg") else None)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
