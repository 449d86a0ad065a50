#!/usr/bin/python3
"""What a checkpoint costs the training steps, with checkpoint.async on and off (`make bench-checkpoint-stall`).

Runs build/llmpi-train under mpiexec three ways on the same model and data (random tokens):
without a checkpoint before the last step (`none`), and with one every --every steps written
asynchronously (`async`) and synchronously (`sync`); every run also saves at its last step, which
is not counted. The stall is what the counted saves (after steps --every, 2·--every, ... before
the last) added to the loop, per save:

  stall = ( sum over counted saves of what that save's step waited (its `checkpoint:` line)
          + sum over counted saves of what the next save waited for its write, if still running
          + sum over the steps after the first of (step_ms - the same step's median without) ) / saves

The first save writes into an empty page cache and later ones at the disk's pace, so counting them
all measures the steady state, and a write that outlasts --every steps shows as the next save's
wait. so a write that slows the steps it runs behind (a core taken by its checksums, the file system)
counts as much as one the step waits for. hidden = 1 - median async stall / median sync stall.
Medians of --reps, the three ways interleaved. Prints a table and writes JSON (default
BUILD/bench/checkpoint_stall.json) with the machine, the date and the commit.
"""
import argparse
import datetime
import json
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile

from run_reference import cpu_description, write_record  # (bench/run_reference.py, beside this file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(a, exe, data, work, mode, rep):
    d = os.path.join(work, f"{mode}-{rep}")
    shutil.rmtree(d, ignore_errors=True)
    sets = {"data.train": data, "data.val": "", "run.dir": d, "model.n_layer": a.layers, "model.d_model": a.d_model,
            "model.n_head": a.heads, "model.seq_len": a.seq_len, "model.vocab_size": a.vocab,
            "train.global_batch": a.batch, "train.steps": a.steps, "train.log_every": 1, "train.eval_every": 0,
            "train.warmup_steps": 1, "checkpoint.every": a.every if mode != "none" else a.steps,
            "checkpoint.async": "false" if mode == "sync" else "true", "checkpoint.keep": 2,
            "runtime.cpu_fp32_gemm": "openblas", "runtime.trace_steps": 0}
    cmd = ["mpiexec", "-n", str(a.ranks), exe, "--config", os.path.join(ROOT, "data/demo.json")]
    for k, v in sets.items():
        cmd += ["--set", f"{k}={v}"]
    cmd += [x for s in a.set for x in ("--set", s)]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        sys.exit(f"checkpoint_stall: {' '.join(cmd)} failed:\n{out.stdout[-3000:]}{out.stderr[-3000:]}")
    step_ms = {}
    for line in open(os.path.join(d, "metrics.jsonl")):
        m = json.loads(line)
        step_ms[m["step"]] = m["step_ms"]
    waited, previous = [], []
    for k in counted_saves(a):
        name = re.escape(f"step-{k:08d}.h5")
        w = re.search(r"checkpoint: \S*" + name + r" \(training waited ([0-9.]+) s", out.stdout)
        p = re.search(r"checkpoint: \S*" + name + r" was still being written: training waited ([0-9.]+) s", out.stdout)
        if mode != "none" and not w:
            sys.exit(f"checkpoint_stall: no checkpoint line for step {k} in:\n{out.stdout[-3000:]}")
        waited.append(float(w.group(1)) if w else 0.0)
        previous.append(float(p.group(1)) if p else 0.0)
    shutil.rmtree(d, ignore_errors=True)
    return {"step_ms": [step_ms[i] for i in range(a.steps)], "waited_s": waited, "previous_s": previous}


def counted_saves(a):
    """The saves counted: after every --every steps, the one at the last step excepted."""
    return list(range(a.every, a.steps, a.every))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--dir", default=None, help="where to write (default: a new directory under /tmp)")
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--layers", type=int, default=16)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--vocab", type=int, default=50257)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--batch", type=int, default=4, help="train.global_batch")
    p.add_argument("--every", type=int, default=4, help="the counted checkpoint is saved after this many steps")
    p.add_argument("--steps", type=int, default=10, help="train.steps (after --every; the last save is not counted)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--set", action="append", default=[], help="KEY=VALUE for llmpi-train (e.g. parallel.tp=2)")
    p.add_argument("--out", default=None, help="JSON file (default BUILD/bench/checkpoint_stall.json)")
    a = p.parse_args()
    if not a.set:
        a.set = ["parallel.tp=2", "parallel.pp_stages=2"]
    if not 0 < a.every < a.steps:
        sys.exit("checkpoint_stall: --every must be between 0 and --steps")
    exe = os.path.join(a.build, "llmpi-train")
    tokens = os.path.join(a.build, "bench-random_tokens")
    for f in (exe, tokens):
        if not os.path.exists(f):
            sys.exit(f"checkpoint_stall: {f} is missing: build it with `make {f}`")
    work = a.dir or tempfile.mkdtemp(prefix="llmpi-ckpt-stall-")
    os.makedirs(work, exist_ok=True)
    data = os.path.join(work, "tokens.h5")
    if not os.path.exists(data):
        subprocess.run([tokens, "--out", data, "--vocab", str(a.vocab), "--tokens", str(a.steps * a.batch * a.seq_len * 2 + 1)],
                       check=True, capture_output=True)
    runs = {"none": [], "async": [], "sync": []}
    for rep in range(a.reps):
        for mode in runs:
            print(f"run {rep + 1}/{a.reps}: {mode}", flush=True)
            runs[mode].append(run(a, exe, data, work, mode, rep))
    base = [statistics.median(r["step_ms"][i] for r in runs["none"]) for i in range(a.steps)]
    after = range(a.every, a.steps)

    n = len(counted_saves(a))

    def stall(r):  # per counted save
        slower = sum(r["step_ms"][i] - base[i] for i in after) / 1e3 / n
        waited, previous = sum(r["waited_s"]) / n, sum(r["previous_s"]) / n
        return {"waited_s": waited, "previous_s": previous, "slower_steps_s": slower,
                "stall_s": waited + previous + slower}

    rows = {m: [stall(r) for r in runs[m]] for m in ("async", "sync")}
    med = {m: {k: statistics.median(x[k] for x in rows[m]) for k in rows[m][0]} for m in rows}
    hidden = 1 - med["async"]["stall_s"] / med["sync"]["stall_s"] if med["sync"]["stall_s"] > 0 else float("nan")
    print(f"\n{'mode':>6} {'waited s':>9} {'previous s':>10} {'slower steps s':>14} {'stall s':>8}")
    for m in ("async", "sync"):
        x = med[m]
        print(f"{m:>6} {x['waited_s']:>9.2f} {x['previous_s']:>10.2f} {x['slower_steps_s']:>14.2f} {x['stall_s']:>8.2f}")
    print(f"median step without the checkpoint: {statistics.median(base[i] for i in after):.0f} ms; "
          f"async hides {100 * hidden:.0f}% of the synchronous stall")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    record = {"benchmark": "checkpoint_stall", "date": datetime.date.today().isoformat(), "commit": commit,
              "cpu": cpu_description(), "machine": platform.node(), "ranks": a.ranks,
              "model": {"layers": a.layers, "d_model": a.d_model, "heads": a.heads, "vocab": a.vocab, "seq_len": a.seq_len},
              "global_batch": a.batch, "every": a.every, "steps": a.steps, "sets": a.set, "reps": a.reps,
              "counted_saves": counted_saves(a),
              "what": "stall_s, per counted save (every --every steps but the last step's): its step's wait + the "
                      "next save's wait for it + the steps after the first slower than without a checkpoint, "
                      "over the counted saves; hidden = 1 - async / sync (medians)",
              "base_step_ms": base, "runs": {m: [dict(r, **s) for r, s in zip(runs[m], rows[m])] for m in rows},
              "median": med, "hidden": hidden}
    write_record(a.out or os.path.join(a.build, "bench", "checkpoint_stall.json"), record)


if __name__ == "__main__":
    main()
