#!/usr/bin/python3
"""Gradient sync over a slower network, simulated: overlap and bandwidth on a rate-limited link.

Run as root, from the repository root (6-10 minutes with the defaults, depending on the load):

    /usr/bin/python3 tools/netns_overlap_bench.py [--rates 1gbit,10gbit] [--steps 15] [--skip 3]
        [--variants REGEX] [--build build] [--out build/bench]

Every run goes through tools/netns_link.sh, which makes two network namespaces joined by a veth
pair rate-limited by tbf in both directions, and puts rank 0 in one and rank 1 in the other, so
all gradient traffic crosses the limited link (UCX over TCP; no shared memory). One training run
of the reference model (bench/reference.json: 4 layers, d_model 256, vocab 4096, seq_len 256,
8 sequences per rank, 4,273,664 parameters = 17,094,656 bytes of fp32 gradient) is, e.g.:

    tools/netns_link.sh --quiet --rate 1gbit --latency 1ms --stats RUN/link.json mpi -- \\
        build/llmpi-train --config bench/reference.json --set data.train=build/bench/netns-tokens.h5 \\
        --set run.dir=RUN --set train.steps=15 --set runtime.trace_steps=15 \\
        --set parallel.sync=allreduce --set parallel.overlap=true --set parallel.bucket_mb=4 \\
        --set parallel.poll_us=50

which netns_link.sh launches as

    mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 \\
        -n 1 -env UCX_NET_DEVICES llmN-a ip netns exec llmN-a build/llmpi-train ARGS : \\
        -n 1 -env UCX_NET_DEVICES llmN-b ip netns exec llmN-b build/llmpi-train ARGS

and the bare all-reduce yardstick, on the same kind of link, is

    tools/netns_link.sh --quiet --rate 1gbit --latency 1ms mpi -- build/bench-allreduce_bw \\
        --bytes 1048576,4194304,17094656 --iters 20 --json OUT.json

Variants, per rate:
    allreduce            parallel.sync allreduce, no overlap, bucket_mb 25 (the default)
    allreduce-one        no overlap, bucket_mb = first_bucket_mb = 1e6: one collective of 17.1 MB
                         (first_bucket_mb applies even without overlap, so bucket_mb alone is not
                         enough for one collective)
    ovl-bB-pP            overlap, bucket_mb B in {1, 4, 25}, poll_us P in {0, 20, 50, 200}
    gather_scatter       no overlap, bucket_mb 25
Schedule (a shared machine's load drifts, so what is compared runs close together in time):
bare all-reduce, allreduce-one, bare all-reduce (per rate); then the grid, each variant on every
rate before the next variant; then bare, allreduce-one, bare again. Repeated runs are pooled.

Per variant: medians over the steps after the first --skip of step_ms, backward_ms, comm_ms,
exposed_comm_ms (rank 0's metrics.jsonl), and from both ranks' traces the "transfer" time: for
each collective the shorter of the two ranks' spans (the rank that arrived last waited for no
one, so its span is the transfer; rank 0's comm_ms also holds the time it waited for rank 1 to
finish its backward); plus the bytes the veth carried per step (must be >= the gradient size).

Targets checked (printed, and in the JSON):
  (a) on the slowest link: exposed_comm_ms(overlap) <= 0.5 x comm_ms(allreduce, no overlap)
  (b) allreduce moves the gradient at >= 90% of a bare MPI_Allreduce's bandwidth for the same
      bytes: bare_ms(17094656) / comm_ms(allreduce-one) >= 0.9 (also given with transfer time)

Writes OUT/netns-overlap.json, the table in OUT/netns-overlap.txt, and the runs (metrics,
traces, link counters) under OUT/netns-overlap/.
"""
import argparse
import datetime
import json
import os
import platform
import re
import signal
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GRAD_BYTES = 17094656  # reference model: 4,273,664 fp32 parameters


def variants():
    v = [("allreduce", {"sync": "allreduce", "overlap": "false", "bucket_mb": "25"}),
         ("allreduce-one", {"sync": "allreduce", "overlap": "false", "bucket_mb": "1e6", "first_bucket_mb": "1e6"})]
    for b in ("1", "4", "25"):
        for p in ("0", "20", "50", "200"):
            v.append((f"ovl-b{b}-p{p}", {"sync": "allreduce", "overlap": "true", "bucket_mb": b, "poll_us": p}))
    v.append(("gather_scatter", {"sync": "gather_scatter", "overlap": "false", "bucket_mb": "25"}))
    return v


class Stop(Exception):
    pass


def on_term(signum, frame):
    raise Stop(f"signal {signum}")


def run_cmd(cmd, log, timeout, done_files=(), grace=30):
    """Runs cmd in its own session; on timeout / Ctrl-C / SIGTERM it is sent SIGTERM, so that
    netns_link.sh stops MPI and deletes its namespaces, and the error is raised.
    done_files: the outputs the program writes just before MPI_Finalize. MPICH 4.0.2 over UCX
    1.13 TCP now and then never returns from MPI_Finalize (one rank spins in UCX endpoint
    close while the other waits in the PMI barrier); when every done file exists and the
    command has not exited grace seconds later, it is stopped and the run counts (a warning is
    returned)."""
    warn = None
    with open(log, "a") as f:
        f.write("$ " + " ".join(cmd) + "\n")
        f.flush()
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True, cwd=ROOT)
        t0, done_at = time.time(), None
        try:
            while True:
                try:
                    rc = p.wait(timeout=0.5)
                    break
                except subprocess.TimeoutExpired:
                    pass
                if done_files and done_at is None and all(os.path.exists(x) for x in done_files):
                    done_at = time.time()
                if done_at is not None and time.time() - done_at > grace:
                    warn = f"outputs complete but no exit after {grace} s (MPI_Finalize hang): stopped it"
                    raise subprocess.TimeoutExpired(cmd, grace)
                if time.time() - t0 > timeout:
                    raise subprocess.TimeoutExpired(cmd, timeout)
        except BaseException as e:
            p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
            if warn:
                f.write(f"netns_overlap_bench: warning: {warn}\n")
                return warn
            if isinstance(e, subprocess.TimeoutExpired):
                raise Stop(f"timed out after {timeout} s: {' '.join(cmd)}")
            raise
    if rc != 0:
        with open(log) as f:
            tail = f.read()[-3000:]
        raise Stop(f"command failed ({rc}): {' '.join(cmd)}\n{tail}")
    return None


def med(xs):
    return statistics.median(xs) if xs else float("nan")


def trace_spans(path):
    with open(path) as f:
        t = json.load(f)
    ev = t["traceEvents"] if isinstance(t, dict) else t
    return [e for e in ev if e.get("ph") == "X"]


def transfer_ms_per_step(run_dir, skip):
    """Per step: sum over collectives of min(rank 0 span, rank 1 span), matched by name and order."""
    try:
        r0, r1 = (trace_spans(os.path.join(run_dir, f"trace-rank{r}.json")) for r in (0, 1))
    except (OSError, ValueError):
        return []

    def per_step(spans):
        steps, cur = [], None
        for e in sorted(spans, key=lambda e: e["ts"]):
            if e["name"] == "backward":
                cur = []
                steps.append(cur)
            elif cur is not None and " bucket " in e["name"]:
                cur.append((e["name"], e["dur"] / 1000.0))
        return steps

    s0, s1 = per_step(r0), per_step(r1)
    out = []
    for a, b in zip(s0, s1):
        if len(a) != len(b) or not a:
            continue
        out.append(sum(min(x[1], y[1]) for x, y in zip(a, b)))
    return out[skip:]


def summarize_run(run_dir, stats_path, skip):
    rows = []
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        for line in f:
            if line.strip():
                rows.append(json.loads(line))
    rows = [r for r in rows if r["step"] >= skip]
    with open(stats_path) as f:
        link = json.load(f)
    steps_total = len(rows) + skip
    out = {k: med([r[k] for r in rows]) for k in
           ("step_ms", "forward_ms", "backward_ms", "comm_ms", "exposed_comm_ms", "optim_ms")}
    out["collectives"] = rows[0]["collectives"] if rows else 0
    out["bytes_sent_per_step"] = rows[0]["bytes_sent"] if rows else 0
    out["transfer_ms_all"] = transfer_ms_per_step(run_dir, skip)
    out["transfer_ms"] = med(out["transfer_ms_all"])
    out["link_tx_bytes_a"] = link["a"]["tx_bytes"]
    out["link_tx_bytes_b"] = link["b"]["tx_bytes"]
    out["link_tx_bytes_per_step"] = link["a"]["tx_bytes"] / max(steps_total, 1)
    out["tbf_overlimits"] = link["a"]["tbf_overlimits"] + link["b"]["tbf_overlimits"]
    out["steps_used"] = len(rows)
    out["step_ms_all"] = [r["step_ms"] for r in rows]
    out["comm_ms_all"] = [r["comm_ms"] for r in rows]
    out["exposed_comm_ms_all"] = [r["exposed_comm_ms"] for r in rows]
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rates", default="1gbit,10gbit", help="tc rates, comma-separated ('none' = bare veth)")
    ap.add_argument("--steps", type=int, default=15, help="training steps per run (default 15)")
    ap.add_argument("--skip", type=int, default=3, help="steps discarded at the start of each run")
    ap.add_argument("--variants", default="", help="regex: run only the variants it matches")
    ap.add_argument("--bare-iters", type=int, default=20, help="bare MPI_Allreduce iterations per invocation")
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    ap.add_argument("--latency", default="1ms", help="tbf queueing limit passed to netns_link.sh (default 1ms)")
    ap.add_argument("--run-timeout", type=int, default=240, help="seconds allowed per run")
    a = ap.parse_args()

    if os.geteuid() != 0:
        sys.exit("netns_overlap_bench: error: must run as root (network namespaces); try sudo")
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    train, bare, gen = (os.path.join(build, n) for n in ("llmpi-train", "bench-allreduce_bw", "bench-random_tokens"))
    for b in (train, bare, gen):
        if not os.access(b, os.X_OK):
            sys.exit(f"netns_overlap_bench: error: {b} is missing; build it with: make -j2 BUILD={a.build}")
    link = os.path.join(ROOT, "tools", "netns_link.sh")
    out = a.out or os.path.join(build, "bench")
    runs = os.path.join(out, "netns-overlap")
    os.makedirs(runs, exist_ok=True)
    log = os.path.join(out, "netns-overlap.log")
    open(log, "w").close()
    data = os.path.join(out, "netns-tokens.h5")
    rates = [r for r in a.rates.split(",") if r]
    var = [v for v in variants() if not a.variants or re.search(a.variants, v[0])]
    if not var:
        sys.exit(f"netns_overlap_bench: error: --variants '{a.variants}' matches none of: "
                 + ", ".join(n for n, _ in variants()))
    signal.signal(signal.SIGTERM, on_term)
    os.environ.update(OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")

    t_start = time.time()
    results = {r: {} for r in rates}
    runs_raw = {r: {} for r in rates}   # variant -> list of per-run summaries
    bare_raw = {r: {} for r in rates}
    warnings = []
    loads = []

    def run_bare(rate, tag):
        js = os.path.join(runs, f"bare-{rate}-{tag}.json")
        if os.path.exists(js):
            os.remove(js)
        w = run_cmd([link, "--quiet", "--rate", rate, "--latency", a.latency, "--stats", js + ".link", "mpi", "--", bare,
                     "--bytes", f"1048576,4194304,{GRAD_BYTES}", "--iters", str(a.bare_iters), "--json", js],
                    log, a.run_timeout, done_files=[js])
        if w:
            warnings.append(f"bare {rate} {tag}: {w}")
        with open(js) as f:
            for r in json.load(f)["results"]:
                bare_raw[rate].setdefault(int(r["bytes"]), []).extend(r["times_ms"])

    def run_train(rate, name, kv, tag):
        rd = os.path.join(runs, rate, name + tag)
        os.makedirs(rd, exist_ok=True)
        for fn in ("metrics.jsonl", "trace-rank0.json", "trace-rank1.json", "link.json"):
            if os.path.exists(os.path.join(rd, fn)):
                os.remove(os.path.join(rd, fn))
        stats = os.path.join(rd, "link.json")
        cmd = [link, "--quiet", "--rate", rate, "--latency", a.latency, "--stats", stats, "mpi", "--", train,
               "--config", os.path.join(ROOT, "bench/reference.json"),
               "--set", f"data.train={data}", "--set", f"run.dir={rd}",
               "--set", f"train.steps={a.steps}", "--set", f"runtime.trace_steps={a.steps}"]
        for k, v in kv.items():
            cmd += ["--set", f"parallel.{k}={v}"]
        w = run_cmd(cmd, log, a.run_timeout,
                    done_files=[os.path.join(rd, f"trace-rank{r}.json") for r in (0, 1)])
        if w:
            warnings.append(f"{rate} {name}{tag}: {w}")
        res = summarize_run(rd, stats, a.skip)
        res["config"], res["command"], res["run_dir"] = kv, cmd, rd
        runs_raw[rate].setdefault(name, []).append(res)

    # The schedule: the bare all-reduce right before and after the one-collective all-reduce
    # (target b compares them, so they share the machine's conditions), at the start and again
    # at the end; in between every variant, rates interleaved.
    one = dict(variants())["allreduce-one"]
    with_one = any(n == "allreduce-one" for n, _ in var)
    grid = [("train", r, n, kv, "") for n, kv in var if n != "allreduce-one" for r in rates]
    sched = []
    for tag in ("", "#2"):
        sched += [("bare", r, None, None, "a" + tag) for r in rates]
        if with_one:
            sched += [("train", r, "allreduce-one", one, tag) for r in rates]
            sched += [("bare", r, None, None, "b" + tag) for r in rates]
        if not tag:
            sched += grid
    try:
        if not os.path.exists(data):
            run_cmd([gen, "--out", data, "--vocab", "4096", "--tokens", "4000000"], log, 60)
        for i, (kind, rate, name, kv, tag) in enumerate(sched):
            l0 = os.getloadavg()[0]
            label = "bare MPI_Allreduce" if kind == "bare" else name + tag
            print(f"[{time.time() - t_start:5.0f}s] {i + 1}/{len(sched)} {rate:>7} {label:22} (load {l0:.1f})", flush=True)
            if kind == "bare":
                run_bare(rate, tag)
            else:
                run_train(rate, name, kv, tag)
            loads.append(l0)
    except (Stop, KeyboardInterrupt) as e:
        sys.exit(f"netns_overlap_bench: stopped: {e}")

    # pool repeated runs of a variant: medians over all their kept steps
    for rate in rates:
        for name, rl in runs_raw[rate].items():
            if len(rl) == 1:
                results[rate][name] = rl[0]
                continue
            m = dict(rl[0])
            for k in ("step_ms", "comm_ms", "exposed_comm_ms"):
                m[k] = med([x for r in rl for x in r[k + "_all"]])
                m[k + "_all"] = [x for r in rl for x in r[k + "_all"]]
            for k in ("forward_ms", "backward_ms", "optim_ms", "link_tx_bytes_per_step"):
                m[k] = med([r[k] for r in rl])
            m["transfer_ms"] = med([x for r in rl for x in r["transfer_ms_all"]])
            m["transfer_ms_all"] = [x for r in rl for x in r["transfer_ms_all"]]
            m["runs"] = [{k: r[k] for k in ("step_ms", "comm_ms", "exposed_comm_ms", "transfer_ms", "run_dir")}
                         for r in rl]
            m["steps_used"] = sum(r["steps_used"] for r in rl)
            results[rate][name] = m

    # ---- report -----------------------------------------------------------------------------
    lines = []
    bare_sum = {}
    for rate in rates:
        bare_sum[rate] = {}
        for nbytes, ts in sorted(bare_raw[rate].items()):
            m = med(ts)
            bare_sum[rate][str(nbytes)] = {"median_ms": m, "min_ms": min(ts), "n": len(ts),
                                           "busbw_Gbps": nbytes * 8 / (m * 1e6)}
    targets = {}
    for rate in rates:
        R = results[rate]
        lines.append(f"link {rate} (tbf both directions), {a.steps} steps/run, first {a.skip} discarded, medians")
        lines.append(f"{'variant':16} {'step_ms':>8} {'bwd_ms':>8} {'comm_ms':>8} {'exposed':>8} {'xfer_ms':>8}"
                     f" {'colls':>5} {'link MB/step':>12}")
        for name, _ in var:
            if name not in R:
                continue
            r = R[name]
            lines.append(f"{name:16} {r['step_ms']:8.1f} {r['backward_ms']:8.1f} {r['comm_ms']:8.1f}"
                         f" {r['exposed_comm_ms']:8.1f} {r['transfer_ms']:8.1f} {r['collectives']:5d}"
                         f" {r['link_tx_bytes_per_step'] / 1e6:12.2f}")
        for nbytes, b in bare_items(bare_sum[rate]):
            lines.append(f"bare MPI_Allreduce {int(nbytes):>9} B: median {b['median_ms']:7.2f} ms"
                         f" (min {b['min_ms']:.2f}, n {b['n']}), busbw {b['busbw_Gbps']:.3f} Gbit/s")
        t = {}
        base = R.get("allreduce")
        ovl = {n: r for n, r in R.items() if n.startswith("ovl-")}
        if base and ovl:
            best = min(ovl, key=lambda n: ovl[n]["exposed_comm_ms"])
            t["a"] = {"comm_ms_no_overlap": base["comm_ms"], "limit_ms": 0.5 * base["comm_ms"],
                      "best_variant": best, "best_exposed_ms": ovl[best]["exposed_comm_ms"],
                      "met": ovl[best]["exposed_comm_ms"] <= 0.5 * base["comm_ms"],
                      "per_variant": {n: {"exposed_ms": r["exposed_comm_ms"],
                                          "ratio": r["exposed_comm_ms"] / base["comm_ms"],
                                          "met": r["exposed_comm_ms"] <= 0.5 * base["comm_ms"]}
                                      for n, r in sorted(ovl.items())}}
            lines.append(f"target (a): best overlap {best}: exposed {ovl[best]['exposed_comm_ms']:.1f} ms vs"
                         f" 0.5 x {base['comm_ms']:.1f} = {0.5 * base['comm_ms']:.1f} ms -> "
                         + ("MET" if t["a"]["met"] else "MISSED")
                         + f"; met by {sum(v['met'] for v in t['a']['per_variant'].values())}/{len(ovl)} variants")
        one = R.get("allreduce-one")
        bb = bare_sum[rate].get(str(GRAD_BYTES))
        if one and bb:
            eff = bb["median_ms"] / one["comm_ms"]
            eff_x = bb["median_ms"] / one["transfer_ms"] if one["transfer_ms"] == one["transfer_ms"] else None
            t["b"] = {"bare_ms": bb["median_ms"], "comm_ms": one["comm_ms"], "transfer_ms": one["transfer_ms"],
                      "efficiency": eff, "efficiency_transfer": eff_x, "met": eff >= 0.9}
            lines.append(f"target (b): bare {bb['median_ms']:.1f} ms / allreduce-one comm {one['comm_ms']:.1f} ms"
                         f" = {eff:.2f}" + (f" (transfer {one['transfer_ms']:.1f} ms: {eff_x:.2f})" if eff_x else "")
                         + " -> " + ("MET" if eff >= 0.9 else "MISSED"))
        targets[rate] = t
        lines.append("")
    text = "\n".join(lines)
    print("\n" + text)
    doc = {
        "benchmark": "netns_overlap", "date": datetime.datetime.now().isoformat(timespec="seconds"),
        "machine": {"node": platform.node(), "kernel": platform.release(), "cpus": os.cpu_count(),
                    "loadavg_end": os.getloadavg()},
        "model": "bench/reference.json", "gradient_bytes": GRAD_BYTES, "steps": a.steps, "skip": a.skip,
        "rates": rates, "tbf_latency": a.latency,
        "env": {k: v for k, v in os.environ.items() if k.startswith(("UCX_", "MPIR_CVAR_"))},
        "wall_s": round(time.time() - t_start, 1),
        "launcher": "tools/netns_link.sh mpi: mpiexec -genv UCX_TLS tcp,self -genv MPIR_CVAR_NOLOCAL 1 "
                    "-n 1 -env UCX_NET_DEVICES <vethA> ip netns exec <nsA> PROG : -n 1 ... <nsB> PROG",
        "bare_allreduce": bare_sum, "results": results, "targets": targets, "warnings": warnings,
        "loadavg_1min_at_each_run": loads,
    }
    with open(os.path.join(out, "netns-overlap.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(out, "netns-overlap.txt"), "w") as f:
        f.write(text + "\n")
    print(f"wrote {os.path.join(out, 'netns-overlap.json')} ({time.time() - t_start:.0f} s)")


def bare_items(d):
    return sorted(d.items(), key=lambda kv: int(kv[0]))


if __name__ == "__main__":
    main()
