#!/usr/bin/env python3
"""plan_check.py — llmpi-plan's projections against measured runs on this machine.

  python3 tools/plan_check.py [--build build] [--data build/demo] [--out bench/results/plan-check-DATE.json]
                              [--parts memory,time,tp,zero] [--steps 12] [--links none,1gbit,10gbit] [--rounds 3]

memory  Four configurations of a GPT-2-shaped model (8 layers, d_model 512, seq 64, byte
        vocabulary: 25.4M parameters) at global batch 4: 2 ranks, 2 ranks with ZeRO-1, 2 pipeline
        stages (2 micro-batches), 4 ranks with ZeRO-1. Each runs 3 steps and writes every rank's
        peak RSS (summary.json); llmpi-plan gives the rank's bytes (its stage's row). The plan is
        compared with the peak RSS after adding what no plan can know: the RSS the process had
        before the model was allocated (MPI, the libraries, the open data file; measured by the
        same run) and the host batch. Bound: 10%.
time    A GPT-2-shaped model of 3.3M parameters (4 layers, d_model 256, seq 128, global batch 8), one
        thread per rank, `--steps` steps; the measured median step (after the first) against the plan's
        step time, the plan's per-layer costs measured by `llmpi-plan --profile` at the same
        micro-batch just before. World 1, 2 and 4 on loopback (MPICH's shared memory), and 2 and 4
        ranks across a simulated 1 and 10 Gbit/s link (tools/netns_link.sh, needs root; with 4 ranks
        two in each namespace; the planner takes those links' measured fits at that world size,
        bench/results/links-*.json). 4 ranks share the 2 cores: the plan's compute is slowed by
        the ratio (--cores-per-node). Bound: 25%.
tp      Tensor parallelism (parallel.tp = T, one replica of T ranks) for T = 1, 2, 4 on the time
        part's model, and 2 data-parallel ranks as a control, interleaved over `--rounds` rounds:
        each run's median step and largest peak RSS against `llmpi-plan --tp T` (the costs
        `--profile`d once at the whole batch; the group's all-reduces, or the control's gradient
        sync, on the measured loopback link at that many ranks; 4 ranks share the 2 cores). The
        medians over the rounds are compared. Bounds: memory 10%, step time 25%.
zero    ZeRO-1, -2 and -3 (parallel.zero, overlap on) on the time part's model at 2 and 4 ranks on
        loopback, and at 2 ranks across the first simulated link of --links (root): the measured
        median step against the plan's row of that stage (reduce-scatters, the all-gathers after
        the update, ZeRO-3's gathers of each block before its forward and backward), the per-layer
        costs `--profile`d once per world size (the run's micro-batch) and shared by the three
        stages, so that their plans differ by what ZeRO changes only. Bound: 25%.

Needs the Python standard library, the built programs (make) and the demo data (make demo-data).
Exit status: 0 when every comparison is within its bound, 1 otherwise, 2 on errors.
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
MEM_MODEL = ["model.family=gpt2", "model.n_layer=8", "model.n_head=8", "model.d_model=512", "model.seq_len=64",
             "train.global_batch=4"]
TIME_MODEL = ["model.family=gpt2", "model.n_layer=4", "model.n_head=4", "model.d_model=256", "model.seq_len=128",
              "train.global_batch=8"]
COMMON = ["train.log_every=1", "train.eval_every=0", "data.val=", "runtime.threads=1", "runtime.trace_steps=0",
          "model.vocab_size=0"]
MEMORY_BOUND, TIME_BOUND = 0.10, 0.25


def say(msg):
    print("plan_check: " + msg, file=sys.stderr, flush=True)


def die(msg):
    say("error: " + msg)
    sys.exit(2)


class Check:
    def __init__(self, a):
        self.a = a
        self.train_bin = os.path.join(a.build, "llmpi-train")
        self.plan_bin = os.path.join(a.build, "llmpi-plan")
        for b in (self.train_bin, self.plan_bin):
            if not os.access(b, os.X_OK):
                die(f"{b} not found: run `make` first")
        self.train_file = os.path.join(a.data, "train.h5")
        if not os.path.exists(self.train_file):
            die(f"{self.train_file} not found: run `make demo-data` (or give --data)")
        self.tmp = tempfile.mkdtemp(prefix="llmpi-plan-check-")
        self.env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    def sets(self, model, extra):
        out = []
        for s in COMMON + model + ["data.train=" + self.train_file] + extra:
            out += ["--set", s]
        return out

    def run(self, cmd, done_file=None):
        try:
            return run_command(cmd, self.env, say, done_file)
        except RuntimeError as e:
            die(str(e))

    def train(self, world, model, extra, link=None):
        run_dir = os.path.join(self.tmp, f"run-{len(os.listdir(self.tmp))}")
        args = [self.train_bin, "--config", os.path.join(ROOT, "data", "demo.json"), "--set", "run.dir=" + run_dir]
        args += self.sets(model, extra)
        if link is None:
            cmd = ["mpiexec", "-n", str(world)] + args
        elif world == 2:
            cmd = [os.path.join(ROOT, "tools", "netns_link.sh"), "--quiet", "--rate", link, "--latency", "1ms",
                   "mpi", "--"] + args
        else:  # world/2 ranks in each namespace, the launch tools/netns_link.sh's `mpi` form makes
            h = world // 2
            q = " ".join("'" + x + "'" for x in args)
            inner = ('exec mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 '
                     f'-n {h} -env UCX_NET_DEVICES "$LLMPI_NETNS_DEV_A" ip netns exec "$LLMPI_NETNS_A" {q} : '
                     f'-n {h} -env UCX_NET_DEVICES "$LLMPI_NETNS_DEV_B" ip netns exec "$LLMPI_NETNS_B" {q}')
            cmd = [os.path.join(ROOT, "tools", "netns_link.sh"), "--quiet", "--rate", link, "--latency", "1ms",
                   "run", "--", "bash", "-c", inner]
        summary = os.path.join(run_dir, "summary.json")
        self.run(cmd, done_file=summary)
        return json.load(open(summary))

    def plan(self, world, model, extra, plan_args):
        out = os.path.join(self.tmp, f"plan-{len(os.listdir(self.tmp))}.json")
        self.run([self.plan_bin, "--config", os.path.join(ROOT, "data", "demo.json")] + self.sets(model, extra) +
                 ["--world", str(world), "--json", out] + plan_args)
        return json.load(open(out))

    def part_memory(self):
        rows = []
        configs = [("2 ranks", 2, ["parallel.zero=0"]), ("2 ranks, ZeRO-1", 2, ["parallel.zero=1"]),
                   ("2 pipeline stages (1F1B, 2 micro-batches)", 2,
                    ["parallel.pp_stages=2", "parallel.microbatches=2", "parallel.zero=0"]),
                   ("4 ranks, ZeRO-1", 4, ["parallel.zero=1"])]
        for name, world, extra in configs:
            s = self.train(world, MEM_MODEL, extra + ["train.steps=3"])
            p = self.plan(world, MEM_MODEL, extra, ["--profile-reps", "1"])
            zero = 1 if "parallel.zero=1" in extra else 0
            pp = 2 if "parallel.pp_stages=2" in extra else 1
            sched = "1f1b" if pp > 1 else "-"
            pre = s["rss_before_model_bytes_rank0"]
            batch = s["memory_estimate_rank0"]["data"]
            for rank, peak in enumerate(s["peak_rss_bytes_per_rank"]):
                stage = rank % pp if pp > 1 else 0
                row = next(m for m in p["memory"] if m["precision"] == "fp32" and m["schedule"] == sched and
                           m["zero"] == zero and m["stage"] == stage)
                predicted = row["total"] + batch + pre
                err = predicted / peak - 1
                rows.append({"config": name, "world": world, "rank": rank, "stage": stage, "plan_bytes": row["total"],
                             "host_batch_bytes": batch, "rss_before_model_bytes": pre, "predicted_bytes": predicted,
                             "peak_rss_bytes": peak, "error": err, "within_bound": abs(err) <= MEMORY_BOUND})
                say(f"memory {name}, rank {rank}: plan {row['total'] / 1e6:.1f} MB + pre-model {pre / 1e6:.1f} MB = "
                    f"{predicted / 1e6:.1f} MB vs peak RSS {peak / 1e6:.1f} MB ({100 * err:+.1f}%)")
        return rows

    def part_tp(self):
        """Tensor parallelism: T = 1, 2, 4 and, as a control, 2 data-parallel ranks, interleaved; the
        medians over the rounds compared with the plans."""
        configs = [(1, 1), (2, 2), (4, 4), (2, 1)]  # (world, tp)
        extra = ["parallel.zero=0", f"train.steps={self.a.steps}"]
        prof = os.path.join(self.tmp, "tp-profile.json")
        self.plan(1, TIME_MODEL, extra, ["--profile", "--profile-reps", "5", "--profile-out", prof])
        runs = {c: [] for c in configs}
        for rnd in range(self.a.rounds):
            for world, tp in configs:
                s = self.train(world, TIME_MODEL, extra + [f"parallel.tp={tp}"])
                runs[(world, tp)].append(s)
                say(f"world {world} tp {tp}, round {rnd + 1}: median step {s['median_step_ms']:.1f} ms, peak RSS "
                    f"{max(s['peak_rss_bytes_per_rank']) / 1e6:.1f} MB")
        rows = []
        for world, tp in configs:
            plan_args = ["--tp", str(tp), "--profile-in", prof, "--cores-per-node", str(os.cpu_count())]
            if world > 1:
                plan_args += ["--intra-link", "loopback", "--gpus-per-node", str(world)]
            p = self.plan(world, TIME_MODEL, extra, plan_args)
            t = next(x for x in p["time"] if x["schedule"] == "-" and x["zero"] == 0)
            m = next(x for x in p["memory"] if x["precision"] == "fp32" and x["schedule"] == "-" and x["zero"] == 0)
            done = runs[(world, tp)]
            measured = statistics.median(s["median_step_ms"] for s in done) / 1e3
            peak = statistics.median(max(s["peak_rss_bytes_per_rank"]) for s in done)
            pre = statistics.median(s["rss_before_model_bytes_rank0"] for s in done)
            batch = done[0]["memory_estimate_rank0"]["data"]
            predicted = m["total"] + batch + pre
            err_t, err_m = t["step_s"] / measured - 1, predicted / peak - 1
            rows.append({"world": world, "tp": tp, "measured_step_s": measured,
                         "measured_step_s_rounds": [s["median_step_ms"] / 1e3 for s in done],
                         "plan_step_s": t["step_s"], "plan_compute_s": t["compute_s"], "plan_tp_s": t["tp_s"],
                         "plan_tp_bytes_sent_per_rank": t["tp_bytes_sent_per_rank"],
                         "plan_exposed_sync_s": t["exposed_sync_s"],
                         "oversubscription": p.get("oversubscription", 1), "plan_bytes": m["total"],
                         "host_batch_bytes": batch, "rss_before_model_bytes": pre, "predicted_bytes": predicted,
                         "peak_rss_bytes": peak, "step_error": err_t, "memory_error": err_m,
                         "within_bound": abs(err_t) <= TIME_BOUND and abs(err_m) <= MEMORY_BOUND})
            say(f"world {world} tp {tp}: plan {1e3 * t['step_s']:.1f} ms (all-reduces {1e3 * t['tp_s']:.1f} ms, "
                f"{t['tp_bytes_sent_per_rank'] / 1e6:.1f} MB sent per rank) vs measured {1e3 * measured:.1f} ms "
                f"({100 * err_t:+.1f}%); memory plan {m['total'] / 1e6:.1f} MB + pre-model {pre / 1e6:.1f} MB = "
                f"{predicted / 1e6:.1f} MB vs peak RSS {peak / 1e6:.1f} MB ({100 * err_m:+.1f}%)")
        return rows

    def step_row(self, what, world, rate, zero, extra, costs):
        """One measured run against its plan: the median step of `world` ranks (on loopback, or across
        the simulated link `rate`) and the plan's row of ZeRO stage `zero`, its per-layer costs from
        `costs` (llmpi-plan arguments: --profile, or --profile-in FILE)."""
        s = self.train(world, TIME_MODEL, extra, rate)
        link = "loopback" if rate is None else "netns-" + rate
        # The whole run is one "node" for the planner: the measured link at that world size is the
        # layout that was measured (for netns: half the ranks in each namespace).
        plan_args = costs + ["--intra-link", link, "--gpus-per-node", str(world), "--cores-per-node", str(os.cpu_count())]
        p = self.plan(world, TIME_MODEL, extra, plan_args)
        t = next(x for x in p["time"] if x["schedule"] == "-" and x["zero"] == zero)
        measured = s["median_step_ms"] / 1e3
        err = t["step_s"] / measured - 1
        say(f"{what} W={world} {link}: plan {1e3 * t['step_s']:.1f} ms (compute {1e3 * t['compute_s']:.1f}, "
            f"exposed sync {1e3 * t['exposed_sync_s']:.1f}) vs measured {1e3 * measured:.1f} ms ({100 * err:+.1f}%)")
        return {"world": world, "link": link, "measured_step_s": measured, "plan_step_s": t["step_s"],
                "plan_compute_s": t["compute_s"], "plan_exposed_sync_s": t["exposed_sync_s"],
                "plan_optimizer_s": t["optimizer_s"], "oversubscription": p.get("oversubscription", 1),
                "error": err, "within_bound": abs(err) <= TIME_BOUND}

    def part_zero(self):
        rows = []
        runs = [(w, None, z) for w in (2, 4) for z in (1, 2, 3)]
        links = [x for x in self.a.links.split(",") if x and x != "none"]
        if links and os.geteuid() == 0:
            runs += [(2, links[0], z) for z in (1, 2, 3)]
        elif links:
            say("zero: the simulated link needs root; loopback only")
        profiles = {}  # one per micro-batch (world), shared by the stages: their plans differ by the sync only
        for world, rate, zero in runs:
            extra = [f"parallel.zero={zero}", "parallel.overlap=true", f"train.steps={self.a.steps}"]
            if world not in profiles:
                profiles[world] = os.path.join(self.tmp, f"zero-profile-w{world}.json")
                self.plan(world, TIME_MODEL, extra, ["--profile", "--profile-reps", "9", "--profile-out", profiles[world],
                                                     "--cores-per-node", str(os.cpu_count())])
            row = self.step_row(f"zero {zero}", world, rate, zero, extra, ["--profile-in", profiles[world]])
            rows.append(dict(row, zero=zero))
        return rows

    def part_time(self):
        rows = []
        links = [x for x in self.a.links.split(",") if x]
        runs = [(1, None), (2, None), (4, None)]
        if os.geteuid() == 0:
            for rate in links:
                if rate != "none":
                    runs += [(2, rate), (4, rate)]
        else:
            say("time: the simulated links need root; loopback only")
        for world, rate in runs:
            extra = ["parallel.zero=0", f"train.steps={self.a.steps}"]
            rows.append(self.step_row("time", world, rate, 0, extra, ["--profile", "--profile-reps", "5"]))
        return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--data", default=os.path.join(ROOT, "build", "demo"))
    p.add_argument("--out", default=os.path.join(ROOT, "bench", "results",
                                                 f"plan-check-{datetime.date.today().isoformat()}.json"))
    p.add_argument("--parts", default="memory,time")
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--links", default="1gbit,10gbit")
    p.add_argument("--rounds", type=int, default=3, help="tp: rounds of the interleaved runs")
    a = p.parse_args()
    c = Check(a)
    res = {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "machine": f"{platform.node()}, {os.cpu_count()} cores", "command": " ".join(sys.argv),
           "bounds": {"memory": MEMORY_BOUND, "time": TIME_BOUND}}
    with open("/proc/loadavg") as f:
        res["loadavg_before"] = f.read().split()[:3]
    parts = a.parts.split(",")
    if "memory" in parts:
        res["memory"] = c.part_memory()
    if "time" in parts:
        res["time"] = c.part_time()
    if "tp" in parts:
        res["tp"] = c.part_tp()
    if "zero" in parts:
        res["zero"] = c.part_zero()
    with open("/proc/loadavg") as f:
        res["loadavg_after"] = f.read().split()[:3]
    write_json_atomic(a.out, res)
    shutil.rmtree(c.tmp, ignore_errors=True)
    bad = [r for part in ("memory", "time", "tp", "zero") for r in res.get(part, []) if not r["within_bound"]]
    say(f"wrote {a.out}; {len(bad)} comparison(s) outside the bound")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
