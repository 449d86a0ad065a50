#!/usr/bin/python3
"""The reference-configuration throughput benchmark (`make bench`).

Configuration (bench/reference.json): GPT-2 family, n_layer 4, n_head 4, d_model 256,
vocab 4096, seq_len 256, 8 sequences per rank, 2 ranks x 1 thread, fp32, AdamW.

Each round runs, one after the other on the same machine:
  1. bench-sgemm_rate under mpiexec -n 2 (both cores busy, as in training): the single-core
     OpenBLAS sgemm rate on the model's GEMM shapes, the ceiling we compare against;
  2. llmpi-train under mpiexec -n 2 for --steps steps, step times from metrics.jsonl;
  3. the same model in PyTorch DDP (gloo, 2 processes x 1 thread), bench/pytorch_ddp_reference.py,
     when Debian's python3-torch is installed (otherwise reported as skipped).
Rounds interleave the three so that slow phases of a shared machine hit all of them; the
figures are medians over all timed steps of all rounds (the first --skip steps of every run are
discarded). Utilisation = tokens/s x FLOPs/token / (ranks x sgemm GFLOP/s per rank).

Prints a table and writes JSON (default build/bench/reference.json).
"""
import argparse
import datetime
import json
import os
import platform
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(cmd, env=None, log=None):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        sys.exit(f"bench: command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    return r.stdout


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--skip", type=int, default=3, help="steps discarded at the start of each run")
    p.add_argument("--ranks", type=int, default=2)
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    a = p.parse_args()
    build = os.path.join(ROOT, a.build) if not os.path.isabs(a.build) else a.build
    out = a.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "reference.log")
    open(log, "w").close()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    with open(os.path.join(ROOT, "bench/reference.json")) as f:
        ref = json.load(f)
    m = ref["model"]
    batch_per_rank = ref["train"]["global_batch"] // a.ranks

    data = os.path.join(out, "reference_tokens.h5")
    if not os.path.exists(data):
        run([f"{build}/bench-random_tokens", "--out", data, "--vocab", str(m["vocab_size"]),
             "--tokens", str(4 << 20)], env, log)

    have_torch = not a.no_torch and subprocess.run(
        ["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    sgemm, llmpi_ms, torch_ms, torch_meta, flops_per_token, n_params = [], [], [], None, None, None
    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}: sgemm", end="", flush=True)
        sj = os.path.join(out, f"sgemm-{r}.json")
        run(["mpiexec", "-n", str(a.ranks), f"{build}/bench-sgemm_rate", "--json", sj], env, log)
        sgemm.append(json.load(open(sj))["gflops_per_rank_median"])

        print(", llmpi", end="", flush=True)
        run_dir = os.path.join(out, f"llmpi-run-{r}")
        run(["mpiexec", "-n", str(a.ranks), f"{build}/llmpi-train", "--config",
             os.path.join(ROOT, "bench/reference.json"), "--set", f"data.train={data}",
             "--set", f"run.dir={run_dir}", "--set", f"train.steps={a.steps}"], env, log)
        rows = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
        llmpi_ms += [row["step_ms"] for row in rows if row["step"] >= a.skip]

        if have_torch:
            print(", pytorch", end="", flush=True)
            tj = os.path.join(out, f"torch-{r}.json")
            run(["/usr/bin/python3", os.path.join(ROOT, "bench/pytorch_ddp_reference.py"),
                 "--world-size", str(a.ranks), "--threads", "1", "--steps", str(a.steps - a.skip),
                 "--warmup", str(a.skip), "--n-layer", str(m["n_layer"]), "--n-head", str(m["n_head"]),
                 "--d-model", str(m["d_model"]), "--vocab", str(m["vocab_size"]),
                 "--seq-len", str(m["seq_len"]), "--batch-per-rank", str(batch_per_rank),
                 "--json", tj], env, log)
            tj = json.load(open(tj))
            torch_meta = tj
            torch_ms += tj.get("step_ms_all") or [tj["step_ms_median"]]
        print(" done", flush=True)

    # FLOPs/token and parameter count, from llmpi's own start-up line via the formula.
    C, L, T, V = m["d_model"], m["n_layer"], m["seq_len"], m["vocab_size"]
    n_params = 2 * C + L * (12 * C * C + 13 * C) + T * C + V * C
    flops_per_token = 6 * n_params + 12 * L * T * C
    tokens_per_step = batch_per_rank * a.ranks * T
    sg = statistics.median(sgemm)
    ceiling = a.ranks * sg * 1e9 / flops_per_token

    def summary(ms):
        med = statistics.median(ms)
        tps = tokens_per_step / (med / 1000)
        return {"step_ms_median": med, "step_ms_mean": statistics.mean(ms), "steps_timed": len(ms),
                "tokens_per_s": tps, "utilisation": tps / ceiling}

    res = {"tool": "bench/run_reference.py", "date": datetime.date.today().isoformat(),
           "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "config": {"n_layer": L, "n_head": m["n_head"], "d_model": C, "seq_len": T, "vocab": V,
                      "batch_per_rank": batch_per_rank, "ranks": a.ranks, "threads_per_rank": 1},
           "params": n_params, "flops_per_token": flops_per_token, "rounds": a.rounds,
           "sgemm_gflops_per_rank": {"median": sg, "per_round": sgemm},
           "ceiling_tokens_per_s": ceiling, "llmpi": summary(llmpi_ms)}
    if have_torch:
        res["pytorch_ddp"] = summary(torch_ms)
        res["pytorch_ddp"]["torch_version"] = torch_meta.get("torch_version")
        res["speedup_vs_pytorch"] = res["llmpi"]["tokens_per_s"] / res["pytorch_ddp"]["tokens_per_s"]

    print()
    print(f"reference config: {L} layers, d_model {C}, seq_len {T}, vocab {V}, {batch_per_rank} seq/rank, "
          f"{a.ranks} ranks x 1 thread; {n_params / 1e6:.2f}M params, {flops_per_token / 1e6:.1f} MFLOP/token")
    print(f"sgemm (per rank, both cores busy): {sg:.1f} GFLOP/s  ->  ceiling {ceiling:.0f} tokens/s")
    print(f"{'':14} {'ms/step':>9} {'tokens/s':>9} {'utilisation':>12}")
    for name, key in (("llmpi", "llmpi"), ("PyTorch DDP", "pytorch_ddp")):
        if key in res:
            s = res[key]
            print(f"{name:14} {s['step_ms_median']:9.1f} {s['tokens_per_s']:9.0f} {100 * s['utilisation']:11.1f}%")
    if have_torch:
        print(f"llmpi / PyTorch DDP: {res['speedup_vs_pytorch']:.2f}x")
    else:
        print("PyTorch DDP: skipped (install Debian's python3-torch to compare: apt-get install python3-torch)")
    path = os.path.join(out, "reference.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
