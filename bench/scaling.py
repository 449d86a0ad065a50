#!/usr/bin/python3
"""Strong and weak scaling of llmpi-train, data-parallel and pipelined (`make scaling`).

  /usr/bin/python3 bench/scaling.py [--build build] [--out DIR] [--ranks 1,2,4] [--steps 40]
                                    [--loss-steps 200] [--data build/demo/train.h5]

A small GPT-2 (bench/scaling.json: 4 layers, d_model 64, seq_len 64, byte vocabulary) on the demo
data set (make demo-data), one thread per rank, each run an llmpi-train under mpiexec with its own
run directory (OUT/runs/NAME). At 1, 2 and 4 ranks (--ranks; by default also every power of two up
to the cores the machine has):

  dp-strong   data-parallel, fixed train.global_batch 16: the same training at every world size
  dp-weak     data-parallel, train.batch_per_rank 8: the global batch grows with the ranks; run
              twice at each size above 1, with train.lr_scaling none and linear (lr × ranks, with
              a warm-up), for --loss-steps steps, to compare the loss curves
  pp-strong   pipelined, parallel.pp_stages = ranks, global batch 16 in 4 micro-batches (1f1b)
  pp-weak     pipelined, 2 layers per stage: the model grows with the stages (the batch is fixed)

For each run: the median step time (after the first --skip steps), tokens/s over all ranks, the
time per epoch (steps per epoch of the data at that global batch × the median step) and where the
step goes (medians of metrics.jsonl's data, forward, backward, exposed communication, optimizer and
pipeline-wait milliseconds). Efficiency against ideal: strong scaling tokens/s(W) / (W ×
tokens/s(1)); dp-weak the same (ideal: tokens/s grows with W); pp-weak step time(1) / step time(W)
(ideal: the step time stays). More ranks than cores share the cores: those points are marked
oversubscribed, and their ideal is the line up to the core count.

Writes OUT/scaling.json (every run's figures and every plotted series) and, with matplotlib
(Debian's python3-matplotlib; `make scaling` installs it), four PNG files, each with the JSON of
what it shows beside it: scaling_throughput, scaling_epoch, scaling_breakdown (tools/plot_metrics.py's
breakdown) and scaling_weak_loss (tools/plot_metrics.py's loss curves). Timings on a shared machine
are noisy. Not needed by make run / make test.
"""
import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import plot_metrics  # noqa: E402  (loss curves and the step-time breakdown)
from comm_bench import have_matplotlib  # noqa: E402

STRONG_BATCH = 16
PER_RANK = 8
MICROBATCHES = 4
LAYERS_PER_STAGE = 2
PARTS = ["data_ms", "forward_ms", "backward_ms", "exposed_comm_ms", "optim_ms", "pipeline_wait_ms"]


def log(msg):
    print(msg, flush=True)


def fail(msg):
    print(f"scaling: error: {msg}", file=sys.stderr)
    sys.exit(2)


class Bench:
    def __init__(self, a):
        self.a = a
        self.build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
        self.out = a.out or os.path.join(self.build, "bench", "scaling")
        self.runs_dir = os.path.join(self.out, "runs")
        os.makedirs(self.runs_dir, exist_ok=True)
        self.logf = os.path.join(self.out, "scaling.log")
        open(self.logf, "w").close()
        self.train_bin = os.path.join(self.build, "llmpi-train")
        if not os.access(self.train_bin, os.X_OK):
            fail(f"{self.train_bin} not found: run `make` (or `make scaling`) first")
        self.data = a.data or os.path.join(self.build, "demo", "train.h5")
        if not os.path.exists(self.data):
            fail(f"the training file {self.data} does not exist: run `make demo-data` (or give --data)")
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        self.config = json.load(open(os.path.join(ROOT, "bench", "scaling.json")))

    def train(self, name, world, steps, sets):
        """One llmpi-train run; its metrics rows, start-up text and wall time."""
        run_dir = os.path.join(self.runs_dir, name)
        shutil.rmtree(run_dir, ignore_errors=True)
        cmd = ["mpiexec", "-n", str(world), self.train_bin, "--config", os.path.join(ROOT, "bench", "scaling.json"),
               "--set", f"data.train={self.data}", "--set", "data.val=", "--set", f"run.dir={run_dir}",
               "--set", f"train.steps={steps}", "--set", "train.log_every=1", "--set", "runtime.trace_steps=0"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=self.a.timeout)
        except subprocess.TimeoutExpired:
            fail(f"{name}: no end after {self.a.timeout} s: {' '.join(cmd)}")
        wall = time.time() - t0
        with open(self.logf, "a") as f:
            f.write(f"$ {' '.join(cmd)}   # {wall:.1f}s\n{p.stdout}\n")
        if p.returncode != 0:
            fail(f"{name}: llmpi-train failed (exit {p.returncode}): {' '.join(cmd)}\n{p.stdout[-3000:]}")
        rows = plot_metrics.read_jsonl(os.path.join(run_dir, "metrics.jsonl"), required=True)
        if len(rows) != steps:
            fail(f"{run_dir}/metrics.jsonl has {len(rows)} rows, expected {steps}")
        return run_dir, rows, p.stdout, wall


def steps_per_epoch(startup):
    """From llmpi-train's data line: '(N steps/epoch at global batch G = B per rank'."""
    import re
    m = re.search(r"\((\d+) steps/epoch at global batch (\d+)", startup)
    if not m:
        fail("llmpi-train's start-up lines name no steps per epoch")
    return int(m.group(1)), int(m.group(2))


def summarize(name, kind, world, run_dir, rows, startup, wall, skip, seq_len, extra):
    timed = [r for r in rows if r["step"] >= skip] or rows
    step_ms = statistics.median(r["step_ms"] for r in timed)
    spe, gb = steps_per_epoch(startup)
    parts = {k: statistics.median(r.get(k, 0.0) for r in timed) for k in PARTS}
    return dict(name=name, kind=kind, world=world, run_dir=os.path.relpath(run_dir, ROOT), global_batch=gb,
                steps_timed=len(timed), step_ms_median=step_ms, tokens_per_s=gb * seq_len / (step_ms / 1000),
                steps_per_epoch=spe, epoch_s=spe * step_ms / 1000, parts_ms_median=parts,
                compute_ms_median=parts["forward_ms"] + parts["backward_ms"], wall_s=wall,
                first_losses=[r["loss"] for r in rows[:5]], last_loss=rows[-1]["loss"], **extra)


def efficiency(series, cores, weak_model=False):
    """Efficiency against ideal for each run of one series (world 1 first)."""
    base = series[0]
    for e in series:
        w = e["world"]
        if weak_model:  # the work per rank is fixed: ideal is the same step time
            e["efficiency"] = base["step_ms_median"] / e["step_ms_median"]
        else:           # ideal tokens/s grows with the ranks
            e["efficiency"] = e["tokens_per_s"] / (w * base["tokens_per_s"])
        e["oversubscribed"] = w > cores
        # Against what the cores allow: more ranks than cores cannot run faster than the cores.
        e["efficiency_vs_cores"] = e["efficiency"] * w / min(w, cores)


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--out", default=None, help="output directory (default BUILD/bench/scaling)")
    p.add_argument("--data", default=None, help="token file to train on (default BUILD/demo/train.h5)")
    p.add_argument("--ranks", default=None, help="world sizes, comma-separated, starting at 1 (default 1,2,4 and "
                                                 "powers of two up to the cores)")
    p.add_argument("--steps", type=int, default=40, help="steps of each timing run (default 40)")
    p.add_argument("--loss-steps", type=int, default=200, help="steps of the weak-scaling loss runs (default 200)")
    p.add_argument("--skip", type=int, default=3, help="first steps left out of the medians (default 3)")
    p.add_argument("--timeout", type=int, default=600, help="seconds one run may take (default 600)")
    a = p.parse_args()
    cores = os.cpu_count() or 1
    if a.ranks:
        try:
            ranks = [int(x) for x in a.ranks.split(",")]
        except ValueError:
            fail(f"--ranks takes comma-separated integers, got '{a.ranks}'")
    else:
        ranks = [1, 2, 4]
        while ranks[-1] * 2 <= cores:
            ranks.append(ranks[-1] * 2)
    if ranks[0] != 1 or any(w < 1 for w in ranks) or sorted(set(ranks)) != ranks:
        fail(f"--ranks must rise from 1 (the baseline), got {ranks}")
    if a.steps <= a.skip or a.loss_steps <= a.skip:
        fail("--steps and --loss-steps must exceed --skip")
    b = Bench(a)
    m = b.config["model"]
    T = m["seq_len"]
    t_start = time.time()
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
           "cores": cores, "load_before": os.getloadavg()[0],
           "cpu": next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?"),
           "config": b.config, "data": b.data, "ranks": ranks, "steps": a.steps, "loss_steps": a.loss_steps,
           "skip": a.skip, "runs": []}

    def run(name, kind, world, steps, sets, extra=None):
        log(f"  {name}: {world} rank{'s' if world > 1 else ''}, {steps} steps ...")
        run_dir, rows, text, wall = b.train(name, world, steps, sets)
        e = summarize(name, kind, world, run_dir, rows, text, wall, a.skip, T, dict(extra or {}, sets=sets))
        log(f"    median {e['step_ms_median']:.1f} ms/step, {e['tokens_per_s']:,.0f} tok/s, global batch "
            f"{e['global_batch']}, epoch {e['epoch_s']:.0f} s, {wall:.0f} s wall")
        res["runs"].append(e)
        return e

    log(f"scaling: ranks {ranks} on {cores} cores; runs in {b.runs_dir}")
    # Interleaved by world size, so that a change in the machine's load spreads over every series.
    for w in ranks:
        run(f"dp-strong-w{w}", "dp-strong", w, a.steps, {"train.global_batch": STRONG_BATCH})
        for rule in (["none"] if w == 1 else ["none", "linear"]):
            run(f"dp-weak-w{w}-{rule}", "dp-weak", w, a.loss_steps,
                {"train.batch_per_rank": PER_RANK, "train.lr_scaling": rule}, {"lr_scaling": rule})
        if w > 1:
            if m["n_layer"] >= w:
                run(f"pp-strong-w{w}", "pp-strong", w, a.steps,
                    {"train.global_batch": STRONG_BATCH, "parallel.pp_stages": w, "parallel.microbatches": MICROBATCHES})
            else:
                log(f"  pp-strong-w{w}: skipped ({m['n_layer']} layers cannot fill {w} stages)")
        run(f"pp-weak-w{w}", "pp-weak", w, a.steps,
            {"train.global_batch": STRONG_BATCH, "parallel.pp_stages": w, "parallel.microbatches": MICROBATCHES,
             "model.n_layer": LAYERS_PER_STAGE * w}, {"n_layer": LAYERS_PER_STAGE * w})
    res["wall_s"] = time.time() - t_start
    res["load_after"] = os.getloadavg()[0]

    by = lambda kind, extra=lambda e: True: [e for e in res["runs"] if e["kind"] == kind and extra(e)]
    dp1 = by("dp-strong", lambda e: e["world"] == 1)
    series = {"dp-strong": by("dp-strong"),
              "dp-weak": by("dp-weak", lambda e: e["lr_scaling"] == "none"),
              # a pipeline of one stage is the data-parallel run at one rank
              "pp-strong": dp1 + by("pp-strong"),
              "pp-weak": by("pp-weak")}
    for k, s in series.items():
        efficiency(s, cores, weak_model=(k == "pp-weak"))
    res["series"] = {k: [e["name"] for e in s] for k, s in series.items()}
    res["figures"] = figures(res, series)
    report(res, series)
    os.makedirs(b.out, exist_ok=True)
    out_json = os.path.join(b.out, "scaling.json")
    with open(out_json + ".tmp", "w") as f:
        json.dump(res, f, indent=1)
    os.replace(out_json + ".tmp", out_json)
    plot(res, series, b.out)
    log(f"scaling: {out_json} ({res['wall_s']:.0f} s in all)")


def figures(res, series):
    """The data behind each PNG, keyed by its file name."""
    pts = lambda s, key: [[e["world"], e[key]] for e in s]
    weak = [e for e in res["runs"] if e["kind"] == "dp-weak"]
    return {
        "scaling_throughput.png": {k: {"tokens_per_s": pts(s, "tokens_per_s"), "efficiency": pts(s, "efficiency")}
                                   for k, s in series.items()},
        "scaling_epoch.png": {k: pts(s, "epoch_s") for k, s in series.items() if k != "pp-weak"},
        "scaling_breakdown.png": {e["name"]: dict(e["parts_ms_median"], step_ms=e["step_ms_median"])
                                  for s in series.values() for e in s},
        "scaling_weak_loss.png": {e["name"]: {"lr_scaling": e["lr_scaling"], "global_batch": e["global_batch"],
                                              "run_dir": e["run_dir"]} for e in weak},
    }


def report(res, series):
    log("")
    log("| series | ranks | global batch | ms/step | tokens/s | efficiency | time/epoch (s) | compute | exposed comm | "
        "pipeline wait | data |")
    log("|---|---|---|---|---|---|---|---|---|---|---|")
    for k, s in series.items():
        for e in s:
            pm = e["parts_ms_median"]
            log(f"| {k} | {e['world']}{' (over)' if e['oversubscribed'] else ''} | {e['global_batch']} | "
                f"{e['step_ms_median']:.1f} | {e['tokens_per_s']:,.0f} | {e['efficiency'] * 100:.0f}% | "
                f"{e['epoch_s'] if k != 'pp-weak' else float('nan'):.0f} | {e['compute_ms_median']:.1f} | "
                f"{pm['exposed_comm_ms']:.1f} | {pm['pipeline_wait_ms']:.1f} | {pm['data_ms']:.2f} |")
    log("")
    log("weak scaling, loss after the last step (lr_scaling none / linear):")
    for e in [e for e in res["runs"] if e["kind"] == "dp-weak"]:
        log(f"  {e['name']}: global batch {e['global_batch']}, loss {e['first_losses'][0]:.4f} -> {e['last_loss']:.4f}")


def plot(res, series, out):
    if not have_matplotlib():
        log("plots skipped: matplotlib is not importable by this Python (apt-get install python3-matplotlib as "
            "root); the JSON is complete without them")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = res["config"]["model"]
    title = (f"GPT-2 {m['n_layer']}L d{m['d_model']} T{m['seq_len']}, 1 thread per rank, {res['cores']} cores "
             f"({res['cpu']})")
    colours = {"dp-strong": "C0", "dp-weak": "C1", "pp-strong": "C2", "pp-weak": "C3"}
    labels = {"dp-strong": f"data-parallel, strong (global batch {STRONG_BATCH})",
              "dp-weak": f"data-parallel, weak ({PER_RANK} per rank)",
              "pp-strong": f"pipeline, strong (batch {STRONG_BATCH}, {MICROBATCHES} micro-batches)",
              "pp-weak": f"pipeline, weak ({LAYERS_PER_STAGE} layers per stage)"}
    made = []

    def save(fig, name):
        fig.tight_layout()
        fig.savefig(os.path.join(out, name), dpi=110)
        plt.close(fig)
        with open(os.path.join(out, name.replace(".png", ".json")), "w") as f:
            json.dump(res["figures"][name], f, indent=1)
        made.append(name)

    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 4.6))
    cores = res["cores"]
    for k, s in series.items():
        ws = [e["world"] for e in s]
        if k != "pp-weak":
            a1.plot(ws, [e["tokens_per_s"] for e in s], "o-", color=colours[k], label=labels[k])
        a2.plot(ws, [e["efficiency"] * 100 for e in s], "o-", color=colours[k], label=labels[k])
    dp = series["dp-strong"]
    ws = [e["world"] for e in dp]
    a1.plot(ws, [dp[0]["tokens_per_s"] * w for w in ws], ":", color="gray", label="ideal (× ranks)")
    a1.plot(ws, [dp[0]["tokens_per_s"] * min(w, cores) for w in ws], "--", color="gray",
            label=f"ideal up to {cores} cores")
    a2.axhline(100, ls=":", color="gray")
    if ws[-1] > cores:
        for ax in (a1, a2):
            ax.axvspan(cores + 0.5, ws[-1] + 0.5, color="red", alpha=0.06, label="oversubscribed" if ax is a1 else None)
    for ax in (a1, a2):
        ax.set_xscale("log", base=2)
        ax.set_xticks(ws)
        ax.set_xticklabels([str(w) for w in ws])
        ax.set_xlabel("MPI ranks")
        ax.grid(True, alpha=0.3)
    a1.set_ylabel("tokens/s (all ranks, median step)")
    a1.set_title("throughput", fontsize=10)
    a1.legend(fontsize=7)
    a2.set_ylabel("efficiency against ideal (%)")
    a2.set_title("strong: tok/s(W) / (W·tok/s(1)); pipeline weak: t(1)/t(W)", fontsize=9)
    a2.set_ylim(bottom=0)
    a2.legend(fontsize=7)
    fig.suptitle(title, fontsize=9)
    save(fig, "scaling_throughput.png")

    fig, ax = plt.subplots(figsize=(6.5, 4.5))
    for k, s in series.items():
        if k == "pp-weak":
            continue
        ax.plot([e["world"] for e in s], [e["epoch_s"] / 60 for e in s], "o-", color=colours[k], label=labels[k])
    ax.set_xscale("log", base=2)
    ax.set_xticks(ws)
    ax.set_xticklabels([str(w) for w in ws])
    ax.set_xlabel("MPI ranks")
    ax.set_ylabel("minutes per epoch (steps per epoch × median step)")
    ax.set_title(f"time per epoch of {os.path.basename(res['data'])}\n{title}", fontsize=8)
    ax.set_ylim(bottom=0)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7)
    save(fig, "scaling_epoch.png")

    class Args:  # tools/plot_metrics.py's plotting options
        dpi, skip_first, smooth, logy = 110, res["skip"], 5, False

    runs = []
    for s in series.values():
        for e in s:
            if all(e["name"] != r.label for r in runs):
                r = plot_metrics.Run(os.path.join(ROOT, e["run_dir"]))
                r.label = e["name"]
                runs.append(r)
    plot_metrics.plot_breakdown(plt, runs, os.path.join(out, "scaling_breakdown.png"), Args)
    made.append("scaling_breakdown.png")
    with open(os.path.join(out, "scaling_breakdown.json"), "w") as f:
        json.dump(res["figures"]["scaling_breakdown.png"], f, indent=1)

    weak = []
    for e in [e for e in res["runs"] if e["kind"] == "dp-weak"]:
        r = plot_metrics.Run(os.path.join(ROOT, e["run_dir"]))
        r.label = f"{e['world']} rank{'s' if e['world'] > 1 else ''}, batch {e['global_batch']}, lr {e['lr_scaling']}"
        weak.append(r)
    plot_metrics.plot_loss(plt, weak, os.path.join(out, "scaling_weak_loss.png"), Args)
    made.append("scaling_weak_loss.png")
    with open(os.path.join(out, "scaling_weak_loss.json"), "w") as f:
        json.dump(res["figures"]["scaling_weak_loss.png"], f, indent=1)
    log("plots: " + ", ".join(os.path.join(out, f) for f in made))


if __name__ == "__main__":
    main()
