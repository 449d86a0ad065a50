#!/usr/bin/python3
"""Pipeline schedules measured: bubble fraction per stage from the per-rank traces against the
formulas, activation memory per stage, and time per step against the number of micro-batches.

Runs build/llmpi-train (BUILD env var to choose another build directory) on the demo-sized data
with parallel.pp_stages = S on S ranks, for each schedule and M, and reads run_dir/trace-rank*.json:
in each traced step after the first, a rank's "forward" span is the whole schedule (pipelined runs
record forwards and backwards inside it), and the F/B/BI spans inside it are its computation;
bubble = 1 - computation / schedule time, averaged over the traced steps and the ranks. The
activation memory per stage is what the run allocates (the "topology:" lines at start-up).

  bench/pipeline_bubble.py [--stages 2] [--micro 2,4,8] [--schedules gpipe,1f1b,interleaved,zb-h1]
                           [--steps 5] [--out docs/pipeline_bubble.json]

Formulas: GPipe and 1F1B (S-1)/(M+S-1), interleaved (S-1)/(v·M+S-1), zb-h1 (S-1)/(3M+S-1) (F = BI
= W; bench-pipeline_schedule_sim --measure gives it for the measured F, BI, W).

Needs only the Python standard library (matplotlib optional, for --plot PNG). Run on an idle
machine: with more ranks than cores the measured bubble includes time-sharing.
"""
import argparse
import glob
import json
import os
import re
import subprocess
import sys
import tempfile

BUILD = os.environ.get("BUILD", "build")


def make_data(dirpath):
    corpus = os.path.join(dirpath, "corpus.txt")
    subprocess.run([f"{BUILD}/llmpi-demo-corpus", "--out", corpus, "--seed", "1234", "--megabytes", "1"],
                   check=True, stdout=subprocess.DEVNULL)
    subprocess.run([f"{BUILD}/llmpi-prep", "--tokenizer", "byte", "--input", corpus, "--out", dirpath,
                    "--val-fraction", "0.05"], check=True, stdout=subprocess.DEVNULL)
    return os.path.join(dirpath, "train.h5")


def run(train, run_dir, S, M, schedule, v, n_layer, d_model, batch, steps):
    sets = [f"data.train={train}", "data.val=", f"run.dir={run_dir}", "runtime.device=cpu", "runtime.threads=1",
            f"model.n_layer={n_layer}", f"model.d_model={d_model}", "model.n_head=4", "model.seq_len=128",
            f"train.global_batch={batch}", f"train.steps={steps}", "train.log_every=1", "train.eval_every=0",
            f"runtime.trace_steps={steps}", f"parallel.pp_stages={S}", f"parallel.microbatches={M}",
            f"parallel.schedule={schedule}", f"parallel.virtual_stages={v}"]
    cmd = ["mpiexec", "-n", str(S), f"{BUILD}/llmpi-train", "--config", "data/demo.json"]
    for s in sets:
        cmd += ["--set", s]
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    act_mb = {}
    for line in out.splitlines():
        m = re.match(r"topology: rank (\d+): .*?stage (\d+)/", line)
        if m:
            act_mb[int(m.group(1))] = round(sum(float(x) for x in re.findall(r"\(([\d.]+) MB\)", line)), 2)
    per_rank = []
    step_ms = []
    for path in sorted(glob.glob(os.path.join(run_dir, "trace-rank*.json"))):
        ev = [e for e in json.load(open(path))["traceEvents"] if e.get("ph") == "X"]
        windows = [e for e in ev if e["name"] == "forward"][1:]  # skip the first step
        fracs = []
        for w in windows:
            t0, t1 = w["ts"], w["ts"] + w["dur"]
            busy = sum(e["dur"] for e in ev if re.match(r"^(F|B|BI|W)\d", e["name"]) and t0 <= e["ts"] < t1)
            fracs.append(1 - busy / w["dur"])
            step_ms.append(w["dur"] / 1e3)
        per_rank.append(sum(fracs) / len(fracs))
    return {"bubble_per_stage": per_rank, "bubble": sum(per_rank) / len(per_rank),
            "activation_mb_per_stage": [act_mb[r] for r in sorted(act_mb)],
            "schedule_ms_median": sorted(step_ms)[len(step_ms) // 2]}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--micro", default="2,4,8")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--schedules", default="gpipe,1f1b,interleaved,zb-h1")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    S = args.stages
    tmp = tempfile.mkdtemp(prefix="llmpi-pipe-bench-")
    train = make_data(tmp)
    rows = []
    for M in [int(x) for x in args.micro.split(",")]:
        for schedule in args.schedules.split(","):
            v = 2 if schedule == "interleaved" else 1
            if schedule == "interleaved" and M % S:
                continue
            r = run(train, os.path.join(tmp, f"{schedule}-{M}"), S, M, schedule, v, n_layer=4 * S // 2 * 2,
                    d_model=128, batch=2 * max(8, M), steps=args.steps)
            formula = (S - 1) / ((3 if schedule == "zb-h1" else v) * M + S - 1)
            r.update({"schedule": schedule, "S": S, "M": M, "v": v, "formula": formula})
            rows.append(r)
            print(f"S={S} M={M:2d} {schedule:12s} bubble measured {r['bubble']:.3f} "
                  f"(per stage {', '.join(f'{b:.3f}' for b in r['bubble_per_stage'])}) formula {formula:.3f}; "
                  f"activations per stage {r['activation_mb_per_stage']} MB; schedule {r['schedule_ms_median']:.1f} ms",
                  flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
