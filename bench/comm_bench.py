#!/usr/bin/python3
"""Gradient-synchronisation benchmark: backends, bytes on the wire, epoch traffic, world-size scaling.

  /usr/bin/python3 bench/comm_bench.py [--tcp] [--quick] [--n-layer L --d-model C ...]

Model: bench/reference.json (4 layers, d_model 256, seq_len 256, vocab 4096, global batch 16,
1 thread per rank) unless changed with the options below. Four parts, each llmpi-train run under
mpiexec with its own run directory (OUT/comm-runs/NAME) and train.log_every=1:

  1. backends (--ranks, default 2): gather_scatter; allreduce per tensor (bucket_mb 0); allreduce
     bucketed (bucket_mb 25); allreduce one bucket (bucket_mb 1e9); allreduce bucketed + overlap;
     weights (average_every 1). --iters iterations each (default 40), the first --skip (1)
     discarded: mean and median step_ms, tokens/s, first 5 losses, comm/exposed ms (--rounds R
     repeats all variants R times, interleaved, and pools the timed iterations);
  2. bytes per iteration: expected from the parameter count P (fp32, S = 4P bytes) and the
     algorithm (allreduce 2(n-1)/n*S each way per rank; gather/scatter (n-1)*S each way at the
     root, S at the others; weights 2(n-1)/n*S/average_every) against llmpi's own accounting
     (metrics.jsonl bytes_sent / bytes_received, rank 0) and, with --tcp, against the loopback
     interface's /proc/net/dev counters read before and after each run;
  3. one epoch at global batch 64, 32, 16 on a small model and a random-token file of exactly
     --epoch-steps x 64 windows: per-iteration bytes are the same for every batch size, bytes
     per epoch = iterations x per-iteration bytes;
  4. throughput against world size 1, 2, 4 (allreduce, bucketed; fixed global batch), 4 ranks
     oversubscribing a 2-core machine.

--tcp runs every job with UCX_TLS=tcp,self UCX_NET_DEVICES=lo MPIR_CVAR_NOLOCAL=1, so all MPI
traffic between the ranks goes through TCP over loopback, where the kernel counts it. On lo a
byte sent by one rank to another is counted once in TX and once in RX of the same interface, so
for one iteration both counters grow by the sum over ranks of the bytes each rank sends (plus
TCP/IP and UCX headers, ACKs and the 4-byte loss all-reduce); for n ranks that is n*2(n-1)/n*S =
2(n-1)*S for all-reduce and (n-1)*S + (n-1)*S = 2(n-1)*S for gather+scatter, i.e. 2*S for 2
ranks, not the 4*S that "sent + received on both ranks" would suggest. Other programs using
loopback TCP at the same time inflate the count; the script samples lo while idle and warns.

Writes OUT/comm.json (default build/bench/comm.json) and, when matplotlib is available
(Debian's python3-matplotlib), OUT/comm_iter_time.png, OUT/comm_scaling.png, OUT/comm_epoch.png.
Not needed by make run / make test.
"""
import argparse
import datetime
import importlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TCP_ENV = {"UCX_TLS": "tcp,self", "UCX_NET_DEVICES": "lo", "MPIR_CVAR_NOLOCAL": "1"}

# name, label, --set overrides
VARIANTS = [
    ("gather_scatter", "gather_scatter (25 MB buckets)", {"parallel.sync": "gather_scatter"}),
    ("allreduce_per_tensor", "allreduce per tensor (bucket_mb 0)", {"parallel.sync": "allreduce", "parallel.bucket_mb": 0}),
    ("allreduce_bucketed", "allreduce bucketed (25 MB)", {"parallel.sync": "allreduce", "parallel.bucket_mb": 25}),
    # first_bucket_mb too: the first bucket is capped at min(first_bucket_mb, bucket_mb) (default 1 MB)
    ("allreduce_one_bucket", "allreduce one bucket (1e9 MB)",
     {"parallel.sync": "allreduce", "parallel.bucket_mb": 1e9, "parallel.first_bucket_mb": 1e9}),
    ("allreduce_overlap", "allreduce bucketed + overlap", {"parallel.sync": "allreduce", "parallel.bucket_mb": 25, "parallel.overlap": "true"}),
    ("weights", "weights (average_every 1)", {"parallel.sync": "weights", "parallel.average_every": 1}),
]


def log(msg, end="\n"):
    print(msg, end=end, flush=True)


def lo_counters():
    """(rx_bytes, tx_bytes) of the loopback interface, or None when /proc/net/dev has no lo."""
    try:
        with open("/proc/net/dev") as f:
            for line in f:
                if ":" in line and line.split(":", 1)[0].strip() == "lo":
                    v = line.split(":", 1)[1].split()
                    return int(v[0]), int(v[8])
    except OSError:
        pass
    return None


def n_params(m):
    C, L, T, V = m["d_model"], m["n_layer"], m["seq_len"], m["vocab_size"]
    return 2 * C + L * (12 * C * C + 13 * C) + T * C + V * C


def expected_per_rank(method, world, rank, size_bytes, average_every=1):
    """Bytes one rank sends (= receives) per iteration, as llmpi's accounting models it."""
    if world == 1:
        return 0.0
    if method == "gather_scatter":
        return (world - 1) * size_bytes if rank == 0 else size_bytes
    per_pass = 2.0 * (world - 1) / world * size_bytes
    return per_pass / average_every if method == "weights" else per_pass


def expected_wire_total(method, world, size_bytes, average_every=1):
    """Bytes that cross the wire per iteration, summed over all ranks' sends (what lo TX counts)."""
    return sum(expected_per_rank(method, world, r, size_bytes, average_every) for r in range(world))


class Bench:
    def __init__(self, a):
        self.a = a
        self.build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
        self.out = a.out or os.path.join(self.build, "bench")
        self.runs = os.path.join(self.out, "comm-runs")
        os.makedirs(self.runs, exist_ok=True)
        self.logf = os.path.join(self.out, "comm.log")
        open(self.logf, "w").close()
        self.env = dict(os.environ, OMP_NUM_THREADS=str(a.threads), OPENBLAS_NUM_THREADS=str(a.threads))
        if a.tcp:
            self.env.update(TCP_ENV)
        else:  # do not let a caller's UCX settings change what "default transport" means
            for k in TCP_ENV:
                self.env.pop(k, None)
        # Run private copies of the binaries, so that a rebuild of build/ during the benchmark (other
        # people work in the same tree) cannot mix two versions of the program in one comparison.
        self.bin = os.path.join(self.out, "comm-bin")
        os.makedirs(self.bin, exist_ok=True)
        self.binaries = {}
        for exe in ("llmpi-train", "bench-random_tokens"):
            src = os.path.join(self.build, exe)
            if not os.access(src, os.X_OK):
                sys.exit(f"comm_bench: {src} not found; run `make` first")
            shutil.copy2(src, os.path.join(self.bin, exe))
            self.binaries[exe] = {"copied_from": src, "mtime": datetime.datetime.fromtimestamp(
                os.path.getmtime(src)).isoformat(timespec="seconds")}

    def sh(self, cmd, timeout=None):
        t0 = time.time()
        try:
            r = subprocess.run(cmd, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout or self.a.timeout)
        except subprocess.TimeoutExpired as e:
            out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
            sys.exit(f"comm_bench: timed out after {timeout or self.a.timeout}s: {' '.join(cmd)}\n{out[-3000:]}")
        with open(self.logf, "a") as f:
            f.write(f"$ {' '.join(cmd)}   # {time.time() - t0:.1f}s\n{r.stdout}\n")
        if r.returncode != 0:
            sys.exit(f"comm_bench: command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
        return r.stdout

    def tokens(self, vocab, n_tokens, tag):
        path = os.path.join(self.out, f"comm-tokens-{tag}-v{vocab}-n{n_tokens}.h5")
        if not os.path.exists(path):
            self.sh([os.path.join(self.bin, "bench-random_tokens"), "--out", path, "--vocab", str(vocab),
                     "--tokens", str(n_tokens), "--seed", "7"])
        return path

    def train(self, name, model, data, world, steps, global_batch, sets):
        """One llmpi-train run; returns its metrics rows, comm plan, start-up text and lo deltas."""
        run_dir = os.path.join(self.runs, name)
        cmd = ["mpiexec", "-n", str(world), os.path.join(self.bin, "llmpi-train"),
               "--config", self.a.config, "--set", f"data.train={data}", "--set", "data.val=",
               "--set", f"run.dir={run_dir}", "--set", f"train.steps={steps}",
               "--set", f"train.global_batch={global_batch}", "--set", "train.log_every=1",
               "--set", "train.eval_every=0", "--set", f"runtime.threads={self.a.threads}",
               "--set", "runtime.device=cpu"]
        for k in ("n_layer", "n_head", "d_model", "seq_len", "vocab_size"):
            cmd += ["--set", f"model.{k}={model[k]}"]
        for k, v in sets.items():
            cmd += ["--set", f"{k}={v}"]
        for attempt in range(3):
            shutil.rmtree(run_dir, ignore_errors=True)
            before = lo_counters()
            t0 = time.time()
            text = self.sh(cmd)
            wall = time.time() - t0
            load = os.getloadavg()[0]
            after = lo_counters()
            # llmpi-train checkpoints and exits 0 on SIGTERM / SIGUSR1 (pre-emption); someone else's
            # signal must not pass for a short run.
            if "pre-empted" not in text:
                break
            log(f" [{name}: llmpi-train was pre-empted (SIGTERM/SIGUSR1 from outside); running it again]", end="")
        else:
            sys.exit(f"comm_bench: {name}: llmpi-train pre-empted three times; see {self.logf}")
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        plan = json.load(open(os.path.join(run_dir, "comm_plan.json")))
        if len(rows) != steps:
            sys.exit(f"comm_bench: {run_dir}/metrics.jsonl has {len(rows)} rows, expected {steps}")
        res = {"run_dir": os.path.relpath(run_dir, ROOT), "rows": rows, "plan": plan, "startup": text,
               "wall_s": wall, "load": load}
        if before and after:
            res["lo_rx"] = after[0] - before[0]
            res["lo_tx"] = after[1] - before[1]
        return res


def summarize_steps(rows, skip, tokens_per_step):
    """Step-time statistics over the rows with step >= skip (rows may pool several runs)."""
    rows = [r for r in rows if r["step"] >= skip]
    ms = [r["step_ms"] for r in rows]
    med = statistics.median(ms)

    def med_of(key):
        return statistics.median(r[key] for r in rows)

    return {"steps_timed": len(ms), "step_ms_median": med, "step_ms_mean": statistics.mean(ms),
            "step_ms_min": min(ms), "step_ms_max": max(ms), "tokens_per_s": tokens_per_step / (med / 1000),
            "forward_ms_median": med_of("forward_ms"), "backward_ms_median": med_of("backward_ms"),
            "comm_ms_median": med_of("comm_ms"), "exposed_comm_ms_median": med_of("exposed_comm_ms"),
            "optim_ms_median": med_of("optim_ms")}


def bytes_summary(rows):
    sent = [r["bytes_sent"] for r in rows]
    recv = [r["bytes_received"] for r in rows]
    return {"reported_sent_per_iter": statistics.mean(sent), "reported_received_per_iter": statistics.mean(recv),
            "reported_sent_min": min(sent), "reported_sent_max": max(sent),
            "reported_sent_total": sum(sent), "reported_received_total": sum(recv),
            "collectives_per_iter": statistics.mean(r["collectives"] for r in rows)}


def fmt_mb(b):
    return "-" if b is None else f"{b / 1e6:.3f}"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n\n", 1)[1])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    p.add_argument("--config", default=os.path.join(ROOT, "bench/reference.json"), help="base llmpi config")
    p.add_argument("--n-layer", type=int)
    p.add_argument("--n-head", type=int)
    p.add_argument("--d-model", type=int)
    p.add_argument("--seq-len", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--global-batch", type=int, help="backend and scaling runs (default: the config's)")
    p.add_argument("--threads", type=int, default=1, help="threads per rank (default 1)")
    p.add_argument("--ranks", type=int, default=2, help="world size of the backend runs (default 2)")
    p.add_argument("--iters", type=int, default=None, help="iterations per backend run (default 40; --quick 6)")
    p.add_argument("--rounds", type=int, default=1, help="repeat the backend runs, interleaved, and pool the "
                   "timed iterations (default 1)")
    p.add_argument("--skip", type=int, default=1, help="iterations discarded at the start of each run (default 1)")
    p.add_argument("--variants", default=None, help="comma list of backend variants (default all: "
                   + ",".join(v[0] for v in VARIANTS) + ")")
    p.add_argument("--tcp", action="store_true", help="UCX over loopback TCP; measure bytes with /proc/net/dev")
    p.add_argument("--epoch-steps", type=int, default=None, help="iterations per epoch at global batch 64 "
                   "(sizes the epoch data set; default 10, --quick 4)")
    p.add_argument("--epoch-batches", default="64,32,16")
    p.add_argument("--epoch-model", default="2,4,128,128",
                   help="n_layer,n_head,d_model,seq_len of the epoch runs (default 2,4,128,128; vocab as above)")
    p.add_argument("--worlds", default="1,2,4", help="world sizes of the scaling runs (default 1,2,4)")
    p.add_argument("--scaling-iters", type=int, default=None, help="iterations per scaling run (default 15; --quick 4)")
    p.add_argument("--skip-parts", default="", help="comma list of parts to leave out: backends,epoch,scaling")
    p.add_argument("--quick", action="store_true", help="smoke test: few iterations everywhere")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--replot", action="store_true", help="only redraw the PNGs from OUT/comm.json")
    p.add_argument("--timeout", type=int, default=900, help="seconds allowed per llmpi-train run")
    a = p.parse_args()
    if a.replot:
        build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
        out = a.out or os.path.join(build, "bench")
        plot(json.load(open(os.path.join(out, "comm.json"))), out)
        return
    a.iters = a.iters or (6 if a.quick else 40)
    a.scaling_iters = a.scaling_iters or (4 if a.quick else 15)
    a.epoch_steps = a.epoch_steps or (4 if a.quick else 10)
    if a.iters <= a.skip or a.scaling_iters <= a.skip:
        sys.exit("comm_bench: --iters and --scaling-iters must exceed --skip")
    a.config = os.path.abspath(a.config)
    skip_parts = {s for s in a.skip_parts.split(",") if s}
    if skip_parts - {"backends", "epoch", "scaling"}:
        sys.exit("comm_bench: --skip-parts takes backends, epoch, scaling")
    variants = VARIANTS
    if a.variants:
        names = a.variants.split(",")
        unknown = [n for n in names if n not in {v[0] for v in VARIANTS}]
        if unknown:
            sys.exit(f"comm_bench: unknown variant(s) {unknown}; valid: {[v[0] for v in VARIANTS]}")
        variants = [v for v in VARIANTS if v[0] in names]

    b = Bench(a)
    cfg = json.load(open(a.config))
    m = dict(cfg["model"])
    for opt, key in (("n_layer", "n_layer"), ("n_head", "n_head"), ("d_model", "d_model"), ("seq_len", "seq_len"),
                     ("vocab", "vocab_size")):
        if getattr(a, opt) is not None:
            m[key] = getattr(a, opt)
    gb = a.global_batch or cfg["train"]["global_batch"]
    P = n_params(m)
    S = 4 * P
    cores = len(os.sched_getaffinity(0))
    t_start = time.time()
    lo0 = lo_counters()
    if a.tcp and lo0 is None:
        sys.exit("comm_bench: --tcp needs /proc/net/dev with a 'lo' interface")

    res = {"tool": "bench/comm_bench.py", "argv": sys.argv[1:], "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {cores} cores available",
           "transport": "UCX tcp over loopback (" + " ".join(f"{k}={v}" for k, v in TCP_ENV.items()) + ")"
           if a.tcp else "MPICH/UCX default (shared memory between ranks on one node)",
           "model": {**m, "params": P, "grad_bytes_fp32": S, "global_batch": gb, "threads_per_rank": a.threads},
           "iters": a.iters, "skip": a.skip}
    try:
        res["commit"] = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                       text=True).stdout.strip()
    except OSError:
        pass

    # Loopback noise: other programs using TCP over lo while we measure.
    if a.tcp:
        s0 = lo_counters()
        time.sleep(2)
        s1 = lo_counters()
        res["lo_idle_bytes_per_s"] = (s1[1] - s0[1]) / 2
        if res["lo_idle_bytes_per_s"] > 0:
            log(f"warning: loopback carries {res['lo_idle_bytes_per_s'] / 1e3:.1f} kB/s with no benchmark running; "
                "lo measurements include that traffic")

    log(f"model: {m['n_layer']} layers, {m['n_head']} heads, d_model {m['d_model']}, seq_len {m['seq_len']}, "
        f"vocab {m['vocab_size']}: {P:,} params = {S / 1e6:.3f} MB fp32; global batch {gb}, {a.threads} thread/rank")
    log(f"transport: {res['transport']}")

    # ---------------------------------------------------------------- 1+2. backends and bytes
    if "backends" not in skip_parts:
        n = a.ranks
        data = b.tokens(m["vocab_size"], max(1 << 21, (a.iters + 1) * gb * m["seq_len"] + 1), "main")
        tps = gb * m["seq_len"]
        res["backends"] = []
        pooled = {name: {"rows": [], "lo": 0, "iters": 0, "wall": 0.0, "load": []} for name, _, _ in variants}
        first = {}
        for rnd in range(a.rounds):
            for name, label, sets in variants:
                log(f"backend {name}: mpiexec -n {n}, {a.iters} iterations"
                    + (f" (round {rnd + 1}/{a.rounds})" if a.rounds > 1 else "") + " ...", end="")
                r = b.train(f"backend-{name}" + (f"-r{rnd}" if a.rounds > 1 else ""), m, data, n, a.iters, gb, sets)
                if r["plan"]["total_floats"] != P:
                    log(f"\nwarning: comm_plan.json has {r['plan']['total_floats']} floats, formula says {P}")
                first.setdefault(name, r)
                q = pooled[name]
                q["rows"] += r["rows"]
                q["iters"] += a.iters
                q["wall"] += r["wall_s"]
                q["load"].append(r["load"])
                if "lo_tx" in r:
                    q["lo"] += r["lo_tx"]
                log(f" median {statistics.median(x['step_ms'] for x in r['rows'] if x['step'] >= a.skip):.1f} ms")
        for name, label, sets in variants:
            r, q = first[name], pooled[name]
            method = sets["parallel.sync"]
            k = sets.get("parallel.average_every", 1)
            e = {"name": name, "label": label, "settings": sets, "world": n, "rounds": a.rounds,
                 "run_dir": r["run_dir"], "buckets": len(r["plan"]["buckets"]), "wall_s": q["wall"],
                 "loadavg_1min": q["load"], **summarize_steps(q["rows"], a.skip, tps),
                 "first_losses": [row["loss"] for row in r["rows"][:5]],
                 "expected_sent_per_iter_rank0": expected_per_rank(method, n, 0, S, k),
                 "expected_wire_per_iter": expected_wire_total(method, n, S, k),
                 **bytes_summary(q["rows"])}
            if "lo_tx" in r:
                e["lo_tx_total"] = q["lo"]
                e["lo_per_iter"] = q["lo"] / q["iters"]
            res["backends"].append(e)

    # ---------------------------------------------------------------- 3. one epoch per batch size
    if "epoch" not in skip_parts:
        try:
            L, H, C, T = (int(x) for x in a.epoch_model.split(","))
        except ValueError:
            sys.exit("comm_bench: --epoch-model is n_layer,n_head,d_model,seq_len")
        em = {"n_layer": L, "n_head": H, "d_model": C, "seq_len": T, "vocab_size": m["vocab_size"]}
        eP = n_params(em)
        eS = 4 * eP
        n = a.ranks
        batches = [int(x) for x in a.epoch_batches.split(",")]
        windows = a.epoch_steps * max(batches)
        n_tokens = windows * T + 1
        data = b.tokens(m["vocab_size"], n_tokens, "epoch")
        res["epoch"] = {"model": {**em, "params": eP, "grad_bytes_fp32": eS}, "n_tokens": n_tokens,
                        "windows": windows, "world": n, "sync": "allreduce bucket_mb 25", "runs": []}
        for G in batches:
            steps = ((n_tokens - 1) // T) // G
            log(f"epoch at global batch {G}: {steps} iterations ...", end="")
            r = b.train(f"epoch-b{G}", em, data, n, steps, G, {"parallel.sync": "allreduce", "parallel.bucket_mb": 25})
            printed = None
            for line in r["startup"].splitlines():
                if "steps/epoch" in line:
                    printed = int(line.split("(")[1].split()[0])
            if printed is not None and printed != steps:
                sys.exit(f"comm_bench: llmpi-train says {printed} steps/epoch, the script computed {steps}")
            if any(row["epoch"] != 0 for row in r["rows"]):
                sys.exit("comm_bench: the epoch run went past epoch 0")
            per = expected_per_rank("allreduce", n, 0, eS)
            e = {"global_batch": G, "iters": steps, "steps_per_epoch_printed": printed, "run_dir": r["run_dir"],
                 "wall_s": r["wall_s"], "loadavg_1min": r["load"],
                 "step_ms_median": statistics.median(row["step_ms"] for row in r["rows"]),
                 "epoch_time_s": sum(row["step_ms"] for row in r["rows"]) / 1000,
                 "expected_sent_per_iter_rank0": per, "expected_sent_epoch_rank0": steps * per,
                 "expected_wire_epoch": steps * expected_wire_total("allreduce", n, eS),
                 **bytes_summary(r["rows"])}
            if "lo_tx" in r:
                e["lo_rx_total"], e["lo_tx_total"] = r["lo_rx"], r["lo_tx"]
                e["lo_per_iter"] = r["lo_tx"] / steps
            res["epoch"]["runs"].append(e)
            log(f" {e['epoch_time_s']:.1f} s")

    # ---------------------------------------------------------------- 4. world-size scaling
    if "scaling" not in skip_parts:
        worlds = [int(x) for x in a.worlds.split(",")]
        bad = [w for w in worlds if gb % w]
        if bad:
            sys.exit(f"comm_bench: global batch {gb} is not divisible by world size(s) {bad}")
        data = b.tokens(m["vocab_size"], max(1 << 21, (a.scaling_iters + 1) * gb * m["seq_len"] + 1), "main")
        tps = gb * m["seq_len"]
        res["scaling"] = {"sync": "allreduce bucket_mb 25", "global_batch": gb, "iters": a.scaling_iters,
                          "cores": cores, "runs": []}
        for w in worlds:
            log(f"scaling: mpiexec -n {w}, {a.scaling_iters} iterations ...", end="")
            r = b.train(f"scaling-n{w}", m, data, w, a.scaling_iters, gb,
                        {"parallel.sync": "allreduce", "parallel.bucket_mb": 25})
            e = {"world": w, "oversubscribed": w * a.threads > cores, "run_dir": r["run_dir"], "wall_s": r["wall_s"],
                 "loadavg_1min": r["load"], "first_losses": [row["loss"] for row in r["rows"][:5]],
                 **summarize_steps(r["rows"], a.skip, tps),
                 "expected_sent_per_iter_rank0": expected_per_rank("allreduce", w, 0, S),
                 "expected_wire_per_iter": expected_wire_total("allreduce", w, S), **bytes_summary(r["rows"])}
            if "lo_tx" in r:
                e["lo_per_iter"] = r["lo_tx"] / a.scaling_iters
            res["scaling"]["runs"].append(e)
            log(f" {e['tokens_per_s']:.0f} tokens/s")
        base = res["scaling"]["runs"][0]["tokens_per_s"]
        for e in res["scaling"]["runs"]:
            e["speedup_vs_first"] = e["tokens_per_s"] / base
    res["binaries"] = b.binaries
    res["total_wall_s"] = time.time() - t_start

    report(res, a)
    path = os.path.join(b.out, "comm.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=1)
    if not a.no_plots:
        plot(res, b.out)
    log(f"wrote {path} (log: {b.logf}; run dirs: {b.runs}); total {res['total_wall_s']:.0f} s")


def report(res, a):
    tcp = a.tcp
    if "backends" in res:
        n = res["backends"][0]["world"]
        log(f"\n== backends: mpiexec -n {n}, {a.rounds} x {a.iters} iterations, first {a.skip} of each run discarded; "
            f"tokens/s = global batch x seq_len / median step;\n   comm = time in collectives, exposed = time the "
            f"compute thread waited (ms, medians); load = 1-min load average after the run (2 = both cores busy)")
        log(f"{'variant':36} {'buckets':>7} {'median ms':>9} {'mean ms':>8} {'tokens/s':>8} {'comm ms':>8} "
            f"{'exposed':>8} {'load':>5}  first 5 losses")
        for e in res["backends"]:
            log(f"{e['label']:36} {e['buckets']:7d} {e['step_ms_median']:9.1f} {e['step_ms_mean']:8.1f} "
                f"{e['tokens_per_s']:8.0f} {e['comm_ms_median']:8.1f} {e['exposed_comm_ms_median']:8.1f} "
                f"{max(e['loadavg_1min']):5.1f}  "
                + " ".join(f"{x:.5f}" for x in e["first_losses"]))
        S = res["model"]["grad_bytes_fp32"]
        log(f"\n== bytes per iteration (MB; gradient/parameters = {S / 1e6:.3f} MB fp32). 'rank 0' columns: bytes "
            f"rank 0 sends (it receives the same);\n   'wire' = sum over all ranks of bytes sent = what lo TX (and "
            f"RX) should grow by; measured = lo delta / iterations (includes start-up, headers, ACKs)")
        hdr = f"{'variant':36} {'coll.':>5} {'expected r0':>11} {'reported r0':>11} {'expected wire':>13}"
        if tcp:
            hdr += f" {'lo measured':>11} {'lo/expected':>11}"
        log(hdr)
        for e in res["backends"]:
            line = (f"{e['label']:36} {e['collectives_per_iter']:5.0f} {fmt_mb(e['expected_sent_per_iter_rank0']):>11} "
                    f"{fmt_mb(e['reported_sent_per_iter']):>11} {fmt_mb(e['expected_wire_per_iter']):>13}")
            if tcp and "lo_per_iter" in e:
                ratio = e["lo_per_iter"] / e["expected_wire_per_iter"]
                line += f" {fmt_mb(e['lo_per_iter']):>11} {ratio:11.4f}"
                if not 0.99 <= ratio <= 1.05:
                    line += "  <- outside 0.99-1.05: other loopback traffic, or the ranks did not use TCP"
            log(line)
        if not tcp:
            log("(run with --tcp to measure the bytes on the loopback interface)")
    if "epoch" in res:
        ep = res["epoch"]
        em = ep["model"]
        log(f"\n== one epoch: {ep['n_tokens']:,} random tokens = {ep['windows']} windows of seq_len+1; model "
            f"{em['n_layer']} layers, d_model {em['d_model']}, seq_len {em['seq_len']}, vocab {em['vocab_size']}: "
            f"{em['params']:,} params = {em['grad_bytes_fp32'] / 1e6:.3f} MB; mpiexec -n {ep['world']}, allreduce")
        hdr = (f"{'batch':>5} {'iters':>5} {'per-iter exp r0':>15} {'per-iter rep r0':>15} {'epoch rep r0':>12} "
               f"{'iters x exp':>11} {'epoch s':>7}")
        if tcp:
            hdr += f" {'lo epoch':>9} {'lo/iter':>8} {'wire exp':>9}"
        log(hdr + "   (MB)")
        for e in ep["runs"]:
            line = (f"{e['global_batch']:5d} {e['iters']:5d} {fmt_mb(e['expected_sent_per_iter_rank0']):>15} "
                    f"{fmt_mb(e['reported_sent_per_iter']):>15} {e['reported_sent_total'] / 1e6:12.2f} "
                    f"{e['expected_sent_epoch_rank0'] / 1e6:11.2f} {e['epoch_time_s']:7.1f}")
            if tcp and "lo_tx_total" in e:
                line += f" {e['lo_tx_total'] / 1e6:9.2f} {e['lo_per_iter'] / 1e6:8.3f} {e['expected_wire_epoch'] / 1e6:9.2f}"
            log(line)
    if "scaling" in res:
        sc = res["scaling"]
        log(f"\n== throughput against world size: allreduce, global batch {sc['global_batch']} fixed, "
            f"{a.threads} thread/rank, {sc['iters']} iterations, first {a.skip} discarded; {sc['cores']} cores")
        hdr = f"{'ranks':>5} {'median ms':>9} {'mean ms':>8} {'tokens/s':>8} {'speedup':>7} {'comm ms':>8} {'r0 MB/iter':>10}"
        if tcp:
            hdr += f" {'lo MB/iter':>10} {'wire exp':>8}"
        log(hdr)
        for e in sc["runs"]:
            line = (f"{e['world']:5d} {e['step_ms_median']:9.1f} {e['step_ms_mean']:8.1f} {e['tokens_per_s']:8.0f} "
                    f"{e['speedup_vs_first']:6.2f}x {e['comm_ms_median']:8.1f} {e['reported_sent_per_iter'] / 1e6:10.3f}")
            if tcp and "lo_per_iter" in e:
                line += f" {e['lo_per_iter'] / 1e6:10.3f} {e['expected_wire_per_iter'] / 1e6:8.3f}"
            if e["oversubscribed"]:
                line += "  (oversubscribed)"
            log(line)


def have_matplotlib():
    def importable():
        importlib.invalidate_caches()
        try:
            importlib.import_module("matplotlib")
            return True
        except ImportError:
            return False

    if importable():
        return True
    if os.geteuid() == 0 and shutil.which("apt-get"):
        log("matplotlib missing: apt-get install -y --no-install-recommends python3-matplotlib ...")
        r = subprocess.run(["apt-get", "install", "-y", "--no-install-recommends", "python3-matplotlib"],
                           env=dict(os.environ, DEBIAN_FRONTEND="noninteractive"), capture_output=True, text=True)
        if r.returncode == 0 and importable():
            return True
        log(f"apt-get install python3-matplotlib failed ({r.returncode}): {(r.stdout + r.stderr)[-400:]}")
    return False


def plot(res, out):
    if not have_matplotlib():
        log("plots skipped: matplotlib is not importable by this Python (install Debian's python3-matplotlib "
            "as root: apt-get install python3-matplotlib); the JSON and tables are complete without them")
        return
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    m = res["model"]
    title = f"{m['n_layer']}L d{m['d_model']} T{m['seq_len']} V{m['vocab_size']} ({m['params'] / 1e6:.2f}M params)"
    made = []
    if "backends" in res:
        be = res["backends"]
        fig, ax = plt.subplots(figsize=(9, 4.8))
        x = range(len(be))
        w = 0.38
        ax.bar([i - w / 2 for i in x], [e["step_ms_median"] for e in be], w, label="median")
        ax.bar([i + w / 2 for i in x], [e["step_ms_mean"] for e in be], w, label="mean")
        for i, e in enumerate(be):
            ax.text(i - w / 2, e["step_ms_median"], f"{e['step_ms_median']:.0f}", ha="center", va="bottom", fontsize=8)
        ax.set_xticks(list(x))
        ax.set_xticklabels([e["label"].replace(" (", "\n(").replace(" + ", "\n+ ") for e in be], fontsize=7)
        ax.set_ylabel("iteration time (ms)")
        ax.set_title(f"gradient sync backends, {be[0]['world']} ranks, {title}\n{res['transport']}", fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "comm_iter_time.png"), dpi=110)
        plt.close(fig)
        made.append("comm_iter_time.png")
    if "scaling" in res:
        sc = res["scaling"]["runs"]
        fig, ax = plt.subplots(figsize=(6, 4.5))
        ws = [e["world"] for e in sc]
        ax.plot(ws, [e["tokens_per_s"] for e in sc], "o-", label="measured (median)")
        cores = res["scaling"]["cores"]
        ax.plot(ws, [sc[0]["tokens_per_s"] * min(w, cores) / min(ws[0], cores) for w in ws], "--", color="gray",
                label=f"linear up to {cores} cores")
        for e in sc:
            if e["oversubscribed"]:
                ax.annotate("oversubscribed", (e["world"], e["tokens_per_s"]), textcoords="offset points",
                            xytext=(-40, 10), fontsize=8, color="red")
        ax.set_xticks(ws)
        ax.set_xlabel("MPI ranks (1 thread each)")
        ax.set_ylabel("tokens/s")
        ax.set_title(f"allreduce, global batch {res['scaling']['global_batch']}, {res['scaling']['cores']} cores\n{title}",
                     fontsize=9)
        ax.legend()
        fig.tight_layout()
        fig.savefig(os.path.join(out, "comm_scaling.png"), dpi=110)
        plt.close(fig)
        made.append("comm_scaling.png")
    if "epoch" in res:
        runs = res["epoch"]["runs"]
        fig, (a1, a2) = plt.subplots(1, 2, figsize=(9, 4))
        labels = [str(e["global_batch"]) for e in runs]
        a1.bar(labels, [e["reported_sent_per_iter"] / 1e6 for e in runs])
        a1.set_title("per iteration (rank 0 sent)", fontsize=9)
        a1.set_xlabel("global batch")
        a1.set_ylabel("MB")
        a2.bar(labels, [e["reported_sent_total"] / 1e6 for e in runs], label="reported (rank 0 sent)")
        if all("lo_tx_total" in e for e in runs):
            a2.plot(labels, [e["lo_tx_total"] / 1e6 for e in runs], "o", color="red", label="loopback TX (all ranks)")
        for i, e in enumerate(runs):
            a2.text(i, e["reported_sent_total"] / 1e6, f"{e['iters']} iters", ha="center", va="bottom", fontsize=8)
        a2.set_title("per epoch", fontsize=9)
        a2.set_xlabel("global batch")
        a2.legend(fontsize=8)
        em = res["epoch"]["model"]
        fig.suptitle(f"traffic: one epoch of {res['epoch']['windows']} sequences, {em['params'] / 1e6:.2f}M params, "
                     f"{res['epoch']['world']} ranks", fontsize=9)
        fig.tight_layout()
        fig.savefig(os.path.join(out, "comm_epoch.png"), dpi=110)
        plt.close(fig)
        made.append("comm_epoch.png")
    if made:
        log("plots: " + ", ".join(os.path.join(out, f) for f in made))


if __name__ == "__main__":
    main()
