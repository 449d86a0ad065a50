#!/usr/bin/env python3
"""zero_measure.py — what ZeRO-1/2/3 (parallel.zero 1-3) save, send and cost, measured.

  python3 tools/zero_measure.py [--build build] [--data build/demo] [--out bench/results/zero-DATE.json]
                                [--parts memory,traffic,time,link,largest,accumulation] [--worlds 1,2,4]
                                [--zeros 0,1,2,3]

memory   For each world size W and zero stage: llmpi-train runs 3 steps of a GPT-2-shaped model
         (8 layers, d_model 512, seq 64, byte vocabulary: 25.4M parameters, so the AdamW moments
         are 203 MB unsharded) at global batch 4, one thread per rank, and writes summary.json:
         every rank's peak RSS (VmHWM), the RSS before the model was allocated, the estimate
         and the AdamW floats this rank holds. Printed: AdamW MB per rank, peak RSS, and the
         estimate (less its checkpoint staging: no checkpoint is written) + the pre-model RSS
         against rank 0's peak.
time     The same model, 8 steps with parallel.overlap on, at W = 2 and 4, each zero stage in
         turn: the median step time (steps 2-7), the time inside collectives and the share of it
         hidden behind compute (1 - exposed/comm, the overlap figure metrics.jsonl reports).
link     The same at 2 ranks across a veth pair limited to 1 Gbit/s (tools/netns_link.sh; root).
largest  The largest GPT-2 shape (d_model 1024, 16 heads, seq 64; n_layer searched) whose
         memory estimate the start-up check accepts on 4 ranks of this node (llmpi-train
         --dry-run), for ZeRO-1 and ZeRO-3, each then trained for 2 steps to show it runs:
         parameters, peak RSS per rank and step time.
accumulation
         Gradient accumulation (parallel.microbatches 4, global batch 16) under ZeRO-1, and ZeRO-2
         and 3 with each parallel.zero_reduce ("micro_batch": each micro-batch's gradient
         reduce-scattered as its backward finishes it; "step": the whole gradient once, after the
         last), 8 steps with overlap and 4 MB buckets at each W > 1, and at 2 ranks across the
         1 Gbit/s veth (root): the peak RSS per rank, the median step time and the share of the
         collectives hidden behind compute.
traffic  Two ranks across a bare veth pair in two network namespaces (tools/netns_link.sh
         --rate none; needs root): the bytes rank 0's interface sent per step, as the
         difference between a 6-step and a 2-step run (start-up traffic cancels), for
         allreduce and gather_scatter with zero 0 and 1, next to llmpi's own count
         (metrics.jsonl bytes_sent).

Needs only the Python standard library, the built programs (make) and the demo data (make demo-data).
"""
import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile

from llmpi_runs import run_command, write_json_atomic

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ["model.family=gpt2", "model.n_layer=8", "model.n_head=8", "model.d_model=512", "model.seq_len=64",
         "model.vocab_size=0", "train.global_batch=4", "train.log_every=1", "train.eval_every=0", "data.val=",
         "runtime.threads=1", "runtime.trace_steps=0", "parallel.bucket_mb=25"]


def say(msg):
    print("zero_measure: " + msg, file=sys.stderr, flush=True)


def die(msg):
    say("error: " + msg)
    sys.exit(2)


def read_jsonl(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


class Measure:
    def __init__(self, a):
        self.a = a
        self.train_bin = os.path.join(a.build, "llmpi-train")
        if not os.access(self.train_bin, os.X_OK):
            die(f"{self.train_bin} not found: run `make` first")
        self.train_file = os.path.join(a.data, "train.h5")
        if not os.path.exists(self.train_file):
            die(f"{self.train_file} not found: run `make demo-data` (or give --data)")
        self.tmp = tempfile.mkdtemp(prefix="llmpi-zero-")

    def args(self, run_dir, sets):
        args = [self.train_bin, "--config", os.path.join(ROOT, "data", "demo.json"), "--set",
                "data.train=" + self.train_file, "--set", "run.dir=" + run_dir]
        for s in MODEL + sets:
            args += ["--set", s]
        return args

    def run(self, cmd, run_dir, check=True, log=say):
        """Runs cmd into a fresh run_dir; a failure stops the measurement, or with check=False
        raises RuntimeError for the caller."""
        shutil.rmtree(run_dir, ignore_errors=True)
        env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
        try:
            return run_command(cmd, env, log)
        except RuntimeError as e:
            if not check:
                raise
            die(str(e))

    def part_memory(self):
        rows = []
        for w in self.a.worlds:
            for zero in self.a.zeros:
                run = os.path.join(self.tmp, f"mem-w{w}-z{zero}")
                sets = [f"parallel.zero={zero}", "train.steps=3"]
                self.run(["mpiexec", "-n", str(w)] + self.args(run, sets), run)
                s = json.load(open(os.path.join(run, "summary.json")))
                peak = max(s["peak_rss_bytes_per_rank"])
                # No checkpoint is written in 3 steps: its staging copies are never allocated.
                est = s["memory_estimate_bytes_rank0"] - s["memory_estimate_rank0"]["checkpoint_staging"]
                predicted = est + s["rss_before_model_bytes_rank0"]
                row = {"world": w, "zero": zero, "adamw_bytes_rank0": 4 * s["optimizer_state_floats_rank0"],
                       "peak_rss_bytes_max": peak, "peak_rss_bytes_per_rank": s["peak_rss_bytes_per_rank"],
                       "rss_before_model_bytes_rank0": s["rss_before_model_bytes_rank0"],
                       "estimate_bytes_rank0_without_checkpoint_staging": est,
                       "estimate_plus_pre_model_rss_error": predicted / s["peak_rss_bytes_per_rank"][0] - 1}
                rows.append(row)
                say(f"W={w} zero={zero}: AdamW {row['adamw_bytes_rank0'] / 1e6:.1f} MB/rank, peak RSS "
                    f"{peak / 1e6:.1f} MB, estimate + pre-model RSS {predicted / 1e6:.1f} MB "
                    f"({100 * row['estimate_plus_pre_model_rss_error']:+.1f}%)")
        return rows

    def steps_of(self, run):
        """Median step time, comm time and exposed comm time (ms) over steps 2.. of a run."""
        m = [x for x in read_jsonl(os.path.join(run, "metrics.jsonl")) if "step_ms" in x][1:]
        if not m:
            die(f"no step lines in {run}/metrics.jsonl")
        med = lambda k: statistics.median(x.get(k, 0.0) for x in m)
        return med("step_ms"), med("comm_ms"), med("exposed_comm_ms")

    def timed(self, prefix, launch, w, zero, extra=()):
        run = os.path.join(self.tmp, f"{prefix}-w{w}-z{zero}")
        sets = [f"parallel.zero={zero}", "train.steps=8", "parallel.overlap=true", "parallel.bucket_mb=4"] + list(extra)
        self.run(launch(run, sets), run)
        step, comm, exposed = self.steps_of(run)
        hidden = 1 - exposed / comm if comm > 0 else 0.0
        row = {"world": w, "zero": zero, "step_ms_median": step, "comm_ms_median": comm,
               "exposed_comm_ms_median": exposed, "comm_hidden_share": hidden}
        say(f"{prefix} W={w} zero={zero}: step {step:.0f} ms, comm {comm:.0f} ms, exposed {exposed:.0f} ms "
            f"({100 * hidden:.0f}% hidden)")
        return row

    def on_node(self, w):
        """The launch of w ranks on this node (shared memory), for timed()."""
        return lambda run, sets: ["mpiexec", "-n", str(w)] + self.args(run, sets)

    def over_link(self, part):
        """The launch of 2 ranks across a 1 Gbit/s veth pair (tools/netns_link.sh), for timed();
        None (said, naming the part) without root, which the network namespaces need."""
        if os.geteuid() != 0:
            say(f"{part}: the 1 Gbit/s link skipped (needs root for the network namespaces)")
            return None
        return lambda run, sets: [os.path.join(ROOT, "tools", "netns_link.sh"), "--quiet", "--rate", "1gbit", "mpi",
                                  "--"] + self.args(run, sets)

    def part_time(self):
        rows = []
        for w in [x for x in self.a.worlds if x > 1]:
            for zero in self.a.zeros:
                rows.append(self.timed("time", self.on_node(w), w, zero))
        return rows

    def part_link(self):
        launch = self.over_link("link")
        return [self.timed("link-1gbit", launch, 2, zero) for zero in self.a.zeros] if launch else []

    def part_accumulation(self):
        rows = []
        layouts = [(1, None), (2, "step"), (2, "micro_batch"), (3, "step"), (3, "micro_batch")]
        places = [("shared", w, self.on_node(w)) for w in self.a.worlds if w > 1]
        link = self.over_link("accumulation")
        if link:
            places.append(("link-1gbit", 2, link))
        for where, w, launch in places:
            for zero, reduce in layouts:
                extra = ["parallel.microbatches=4", "train.global_batch=16"]
                if reduce:
                    extra.append("parallel.zero_reduce=" + reduce)
                prefix = f"acc-{where}-{reduce or 'step'}"
                row = self.timed(prefix, launch, w, zero, extra)
                s = json.load(open(os.path.join(self.tmp, f"{prefix}-w{w}-z{zero}", "summary.json")))
                row.update(where=where, zero_reduce=reduce or "step", microbatches=4,
                           peak_rss_bytes_max=max(s["peak_rss_bytes_per_rank"]),
                           estimate_bytes_rank0=s["memory_estimate_bytes_rank0"],
                           grads_estimate_bytes_rank0=s["memory_estimate_rank0"]["grads"])
                say(f"  peak RSS {row['peak_rss_bytes_max'] / 1e6:.1f} MB (gradient estimate "
                    f"{row['grads_estimate_bytes_rank0'] / 1e6:.1f} MB)")
                rows.append(row)
        return rows

    def part_largest(self):
        base = ["model.n_head=16", "model.d_model=1024", "train.global_batch=4", "parallel.bucket_mb=25",
                "parallel.overlap=true", "checkpoint.every=0"]
        rows = []
        for zero in (1, 3):
            def fits(layers):
                run = os.path.join(self.tmp, f"fit-z{zero}-l{layers}")
                sets = base + [f"parallel.zero={zero}", f"model.n_layer={layers}"]
                try:
                    self.run(["mpiexec", "-n", "4"] + self.args(run, sets) + ["--dry-run"], run, False, lambda m: None)
                    return True
                except RuntimeError:
                    return False
            lo, hi = 1, 2
            while fits(hi):
                lo, hi = hi, hi * 2
            while hi - lo > 1:  # fits(lo), not fits(hi)
                mid = (lo + hi) // 2
                lo, hi = (mid, hi) if fits(mid) else (lo, mid)
            # The real run may find less memory available than the dry run did (the page cache of the
            # runs before it): a layer or two fewer, as its start-up check decides.
            for layers in range(lo, max(0, lo - 3), -1):
                run = os.path.join(self.tmp, f"largest-z{zero}")
                sets = base + [f"parallel.zero={zero}", f"model.n_layer={layers}", "train.steps=2"]
                try:
                    self.run(["mpiexec", "-n", "4"] + self.args(run, sets), run, False)
                    break
                except RuntimeError as e:
                    say(f"{layers} layers did not start ({str(e).splitlines()[0][:120]}): one fewer")
            else:
                die(f"zero {zero}: no model of {lo - 2} to {lo} layers started")
            lo = layers
            s = json.load(open(os.path.join(run, "summary.json")))
            m = [x for x in read_jsonl(os.path.join(run, "metrics.jsonl")) if "step_ms" in x]
            row = {"zero": zero, "n_layer": lo, "n_params": s.get("n_params"),
                   "peak_rss_bytes_per_rank": s["peak_rss_bytes_per_rank"],
                   "step_ms": [x["step_ms"] for x in m], "losses": [x.get("loss") for x in m]}
            rows.append(row)
            say(f"largest on 4 ranks, zero {zero}: {lo} layers, {row['n_params'] / 1e6:.0f}M parameters, peak RSS "
                f"{max(row['peak_rss_bytes_per_rank']) / 1e9:.2f} GB per rank")
        if len(rows) == 2 and rows[0]["n_params"]:
            say(f"ZeRO-3 / ZeRO-1 parameters: {rows[1]['n_params'] / rows[0]['n_params']:.2f}x")
        return rows

    def part_traffic(self):
        if os.geteuid() != 0:
            say("traffic: skipped (needs root for the network namespaces)")
            return []
        rows = []
        for sync in ("allreduce", "gather_scatter"):
            for zero in (0, 1):
                tx = {}
                for steps in (2, 6):
                    run = os.path.join(self.tmp, f"net-{sync}-z{zero}-s{steps}")
                    stats = run + "-link.json"
                    sets = [f"parallel.zero={zero}", f"parallel.sync={sync}", f"train.steps={steps}"]
                    cmd = [os.path.join(ROOT, "tools", "netns_link.sh"), "--quiet", "--rate", "none", "--stats", stats,
                           "mpi", "--"] + self.args(run, sets)
                    self.run(cmd, run)
                    link = json.load(open(stats))
                    tx[steps] = (link["a"]["tx_bytes"], link["b"]["tx_bytes"])
                    counted = statistics.median(x["bytes_sent"] for x in read_jsonl(os.path.join(run, "metrics.jsonl")))
                row = {"sync": sync, "zero": zero,
                       "measured_sent_per_step_rank0": (tx[6][0] - tx[2][0]) / 4,
                       "measured_sent_per_step_rank1": (tx[6][1] - tx[2][1]) / 4,
                       "llmpi_count_sent_per_step_rank0": counted}
                rows.append(row)
                say(f"{sync} zero={zero}: veth sent per step rank 0 {row['measured_sent_per_step_rank0'] / 1e6:.2f} MB, "
                    f"rank 1 {row['measured_sent_per_step_rank1'] / 1e6:.2f} MB; llmpi counts "
                    f"{counted / 1e6:.2f} MB (rank 0)")
        return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data", default=os.path.join(ROOT, "build", "demo"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                 f"zero-{datetime.date.today().isoformat()}.json"))
    p.add_argument("--parts", default="memory,traffic,time,link,largest")
    p.add_argument("--worlds", default="1,2,4")
    p.add_argument("--zeros", default="0,1,2,3")
    a = p.parse_args()
    a.worlds = [int(x) for x in a.worlds.split(",")]
    a.zeros = [int(x) for x in a.zeros.split(",")]
    m = Measure(a)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()}, {os.cpu_count()} cores", "model": MODEL,
           "command": " ".join(sys.argv)}
    parts = a.parts.split(",")
    for part in ("memory", "traffic", "time", "link", "largest", "accumulation"):
        if part in parts:
            res[part] = getattr(m, "part_" + part)()
            write_json_atomic(a.out, res)  # (each part kept as it completes)
    shutil.rmtree(m.tmp, ignore_errors=True)
    say("wrote " + a.out)


if __name__ == "__main__":
    main()
