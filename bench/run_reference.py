#!/usr/bin/python3
"""The reference-configuration throughput benchmark (`make bench`).

Model (bench/reference.json): n_layer 4, n_head 4, d_model 256, vocab 4096, seq_len 256, global
batch 16 (8 sequences per rank on 2 ranks), fp32, AdamW. Rows, each a llmpi-train run:
  gpt2                 the reference: GPT-2 family, 2 ranks x 1 thread
  gpt2, 1 rank x 2 thr the same model and global batch on one rank with runtime.threads 2 (the
                       "one rank per socket, many threads" layout), same 2 cores
  llama                model.family llama at the same depth/width (RMSNorm, RoPE, SwiGLU with
                       model.ffn_dim 704 = 2/3 of 4 d_model rounded up to 64, untied lm_head),
                       2 ranks x 1 thread, on the same random tokens
  bert                 model.family bert at the same depth/width (post-LN, bidirectional, erf GELU,
                       its default dropout 0.1, classifier with 2 labels), 2 ranks x 1 thread, on
                       a classification file of random full-length examples (bench-random_examples);
                       tokens = B x T per step, as for the language models
  gpt2 (previous rel.) with --baseline-train PATH: that llmpi-train binary on the gpt2 row's config
  PyTorch DDP          the gpt2 model in PyTorch (gloo, 2 processes x 1 thread) when Debian's
                       python3-torch is installed and --no-torch is not given

Each round first measures the single-core OpenBLAS sgemm rate under mpiexec -n 2 (both cores busy,
as in training; bench-sgemm_rate) on each family's own dense-layer GEMM shapes, then runs every
row; the order of the rows is reversed every other round, so that a slow phase of a shared
machine hits all rows alike. Figures are medians over all timed steps of all rounds (the first
--skip steps of every run are discarded).

FLOPs/token is the trainer's (model/model_desc.cpp flops_per_token): 6 x parameters + 12 x
layers x seq_len x d_model, with the parameter count the run itself records (comm_plan.json
total_floats). Utilisation = tokens/s x FLOPs/token / (2 cores x the family's sgemm GFLOP/s per
core measured in the same rounds). Because 6 x parameters also counts embedding tables that are
looked up, not multiplied (gpt2's wpe; llama's untied embed_tokens; bert's word, position and
token-type embeddings), a second utilisation uses the FLOPs the dense layers really execute:
6 x (parameters - those tables) + the same attention term.

Prints a table and writes JSON (default BUILD/bench/reference.json).
"""
import argparse
import datetime
import json
import os
import platform
import re
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CORES = 2  # every row uses 2 cores: 2 ranks x 1 thread, or 1 rank x 2 threads

# Embedding tables whose parameters no GEMM multiplies (gpt2's wte is also the tied LM head).
LOOKUP_ONLY_TABLES = re.compile(r"(^|\.)(wpe\.weight|embed_tokens\.weight|word_embeddings\.weight|"
                                r"position_embeddings\.weight|token_type_embeddings\.weight)$")


def run(cmd, env=None, log=None):
    r = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if log:
        with open(log, "a") as f:
            f.write("$ " + " ".join(cmd) + "\n" + r.stdout)
    if r.returncode != 0:
        sys.exit(f"bench: command failed ({r.returncode}): {' '.join(cmd)}\n{r.stdout[-3000:]}")
    return r.stdout


def openblas_of(binary):
    """The libopenblas.so.0 the dynamic loader picks for `binary` (ldd), or '?'."""
    r = subprocess.run(["ldd", binary], capture_output=True, text=True)
    m = re.search(r"libopenblas\S*\s+=>\s+(\S+)", r.stdout)
    return m.group(1) if m else "?"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--steps", type=int, default=30, help="training steps per run")
    p.add_argument("--skip", type=int, default=3, help="steps discarded at the start of each run")
    p.add_argument("--no-torch", action="store_true", help="skip the PyTorch comparison")
    p.add_argument("--baseline-train", metavar="PATH",
                   help="an llmpi-train binary of a previous release: adds a 'gpt2 (previous release)' row, "
                        "run interleaved with the others in every round")
    p.add_argument("--only", default="", help="comma-separated row keys to run (default: all); "
                   "keys: gpt2, gpt2_1rank_2threads, llama, bert, gpt2_previous_release")
    a = p.parse_args()
    if a.steps <= a.skip:
        sys.exit("bench: --steps must be larger than --skip")
    build = os.path.join(ROOT, a.build) if not os.path.isabs(a.build) else a.build
    train_bin = f"{build}/llmpi-train"
    if a.baseline_train and not os.access(a.baseline_train, os.X_OK):
        sys.exit(f"bench: --baseline-train '{a.baseline_train}' is not an executable file")
    out = a.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "reference.log")
    open(log, "w").close()
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    config = os.path.join(ROOT, "bench/reference.json")
    with open(config) as f:
        ref = json.load(f)
    m = ref["model"]
    C, L, T, V = m["d_model"], m["n_layer"], m["seq_len"], m["vocab_size"]
    global_batch = ref["train"]["global_batch"]
    tokens_per_step = global_batch * T
    llama_ffn = (8 * C // 3 + 63) // 64 * 64  # model/families/llama.cpp's default, set explicitly below

    tokens = os.path.join(out, "reference_tokens.h5")
    if not os.path.exists(tokens):
        run([f"{build}/bench-random_tokens", "--out", tokens, "--vocab", str(V), "--tokens", str(4 << 20)], env, log)
    examples = os.path.join(out, f"reference_examples_T{T}.h5")
    if not os.path.exists(examples):
        run([f"{build}/bench-random_examples", "--out", examples, "--vocab", str(V), "--seq-len", str(T),
             "--examples", "4096", "--labels", "2"], env, log)

    # GEMM shape sets for bench-sgemm_rate: each family's dense layers at this width.
    shape_args = {"gpt2": ["--ffn-dim", str(4 * C), "--vocab", str(V)],
                  "llama": ["--ffn-dim", str(llama_ffn), "--gated", "--vocab", str(V)],
                  "bert": ["--ffn-dim", str(4 * C), "--vocab", "0"]}
    rows = [
        {"key": "gpt2", "name": "gpt2", "bin": train_bin, "ranks": 2, "threads": 1, "shapes": "gpt2",
         "data": tokens, "sets": []},
        {"key": "gpt2_1rank_2threads", "name": "gpt2, 1 rank x 2 threads", "bin": train_bin, "ranks": 1,
         "threads": 2, "shapes": "gpt2", "data": tokens, "sets": ["runtime.threads=2"]},
        {"key": "llama", "name": "llama", "bin": train_bin, "ranks": 2, "threads": 1, "shapes": "llama",
         "data": tokens, "sets": ["model.family=llama", f"model.ffn_dim={llama_ffn}"]},
        {"key": "bert", "name": "bert", "bin": train_bin, "ranks": 2, "threads": 1, "shapes": "bert",
         "data": examples, "sets": ["model.family=bert", "model.num_labels=2"]},
    ]
    if a.baseline_train:
        rows.insert(1, {"key": "gpt2_previous_release", "name": "gpt2 (previous release)",
                        "bin": os.path.abspath(a.baseline_train), "ranks": 2, "threads": 1, "shapes": "gpt2",
                        "data": tokens, "sets": []})
    if a.only:
        keep = set(a.only.split(","))
        unknown = keep - {r["key"] for r in rows}
        if unknown:
            sys.exit(f"bench: --only: unknown row key(s) {sorted(unknown)}")
        rows = [r for r in rows if r["key"] in keep]
    shape_sets = sorted({r["shapes"] for r in rows}, key=list(shape_args).index)

    have_torch = not a.no_torch and any(r["key"] == "gpt2" for r in rows) and subprocess.run(
        ["/usr/bin/python3", "-c", "import torch"], capture_output=True).returncode == 0
    sgemm = {s: [] for s in shape_sets}
    sgemm_info = {}
    for row in rows:
        row.update(ms=[], round_ms=[], n_params=None, lookup_params=None, printed_mflop=None)
    torch_ms, torch_round_ms, torch_meta = [], [], None

    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}: sgemm", end="", flush=True)
        for s in shape_sets:
            sj = os.path.join(out, f"sgemm-{s}-{r}.json")
            run(["mpiexec", "-n", str(CORES), f"{build}/bench-sgemm_rate", "--json", sj, "--d-model", str(C),
                 "--n-layer", str(L), "--rows", str(global_batch // CORES * T)] + shape_args[s], env, log)
            sj = json.load(open(sj))
            sgemm[s].append(sj["gflops_per_rank_median"])
            sgemm_info = {k: sj.get(k) for k in ("openblas_config", "openblas_parallel", "openblas_library")}
        order = rows if r % 2 == 0 else rows[::-1]
        for row in order:
            print(f", {row['key']}", end="", flush=True)
            run_dir = os.path.join(out, f"run-{row['key']}-{r}")
            cmd = ["mpiexec", "-n", str(row["ranks"]), row["bin"], "--config", config,
                   "--set", f"data.train={row['data']}", "--set", f"run.dir={run_dir}",
                   "--set", f"train.steps={a.steps}"]
            for s in row["sets"]:
                cmd += ["--set", s]
            stdout = run(cmd, env, log)
            steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            ms = [x["step_ms"] for x in steps if x["step"] >= a.skip]
            row["ms"] += ms
            row["round_ms"].append(statistics.median(ms))
            plan = json.load(open(os.path.join(run_dir, "comm_plan.json")))
            row["n_params"] = plan["total_floats"]
            row["lookup_params"] = sum(
                t_["shape"][0] * t_["shape"][1] for b in plan["buckets"] for t_ in b["tensors"]
                if LOOKUP_ONLY_TABLES.search(t_["name"]) and len(t_["shape"]) == 2)
            mf = re.search(r"([\d.]+) MFLOP/token", stdout)
            row["printed_mflop"] = float(mf.group(1)) if mf else None
        if have_torch:
            print(", pytorch", end="", flush=True)
            tj = os.path.join(out, f"torch-{r}.json")
            run(["/usr/bin/python3", os.path.join(ROOT, "bench/pytorch_ddp_reference.py"),
                 "--world-size", str(CORES), "--threads", "1", "--steps", str(a.steps - a.skip),
                 "--warmup", str(a.skip), "--n-layer", str(L), "--n-head", str(m["n_head"]),
                 "--d-model", str(C), "--vocab", str(V), "--seq-len", str(T),
                 "--batch-per-rank", str(global_batch // CORES), "--json", tj], env, log)
            tj = json.load(open(tj))
            torch_meta = tj
            torch_ms += tj.get("step_ms_all") or [tj["step_ms_median"]]
            torch_round_ms.append(tj["step_ms_median"])
        print(" done", flush=True)

    attention_flops = 12 * L * T * C
    sg = {s: statistics.median(v) for s, v in sgemm.items()}

    def summary(ms, round_ms, shapes, n_params, lookup_params):
        flops = 6 * n_params + attention_flops  # = flops_per_token() of model/model_desc.cpp
        executed = 6 * (n_params - lookup_params) + attention_flops
        ceiling = CORES * sg[shapes] * 1e9 / flops
        med = statistics.median(ms)
        tps = tokens_per_step / (med / 1000)
        return {"step_ms_median": med, "step_ms_mean": statistics.mean(ms), "steps_timed": len(ms),
                "step_ms_median_per_round": round_ms, "tokens_per_s": tps, "params": n_params,
                "lookup_only_params": lookup_params,
                "flops_per_token": flops, "executed_gemm_flops_per_token": executed,
                "sgemm_shapes": shapes, "ceiling_tokens_per_s": ceiling, "utilisation": tps / ceiling,
                "utilisation_executed_flops": tps * executed / (CORES * sg[shapes] * 1e9)}

    res = {"tool": "bench/run_reference.py", "date": datetime.date.today().isoformat(),
           "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
           "config": {"n_layer": L, "n_head": m["n_head"], "d_model": C, "seq_len": T, "vocab": V,
                      "global_batch": global_batch, "cores": CORES, "llama_ffn_dim": llama_ffn},
           "rounds": a.rounds, "steps": a.steps, "skip": a.skip,
           "sgemm_gflops_per_rank": {s: {"median": sg[s], "per_round": sgemm[s]} for s in shape_sets},
           "openblas": dict(sgemm_info, trainer_library=openblas_of(train_bin)),
           "rows": {}}
    if a.baseline_train:
        res["openblas"]["baseline_trainer_library"] = openblas_of(a.baseline_train)
    for row in rows:
        s = summary(row["ms"], row["round_ms"], row["shapes"], row["n_params"], row["lookup_params"])
        s.update(name=row["name"], binary=row["bin"], ranks=row["ranks"], threads_per_rank=row["threads"],
                 sets=row["sets"], trainer_printed_mflop_per_token=row["printed_mflop"])
        res["rows"][row["key"]] = s
    if have_torch:
        g = res["rows"]["gpt2"]
        s = summary(torch_ms, torch_round_ms, "gpt2", g["params"], g["lookup_only_params"])
        s.update(name="PyTorch DDP", torch_version=torch_meta.get("torch_version"), ranks=CORES, threads_per_rank=1)
        res["rows"]["pytorch_ddp"] = s

    # Ratios: of the medians, and per round (each round's rows ran back to back).
    def ratio(num, den):
        if num not in res["rows"] or den not in res["rows"]:
            return None
        n, d = res["rows"][num], res["rows"][den]
        per_round = [dm / nm for nm, dm in zip(n["step_ms_median_per_round"], d["step_ms_median_per_round"])]
        return {"tokens_per_s_ratio": n["tokens_per_s"] / d["tokens_per_s"], "per_round": per_round}

    res["ratios"] = {k: v for k, v in {
        "gpt2 / gpt2 (previous release)": ratio("gpt2", "gpt2_previous_release"),
        "gpt2 1 rank x 2 threads / gpt2 2 ranks x 1 thread": ratio("gpt2_1rank_2threads", "gpt2"),
        "gpt2 / PyTorch DDP": ratio("gpt2", "pytorch_ddp"),
    }.items() if v is not None}

    print()
    print(f"model: {L} layers, {m['n_head']} heads, d_model {C}, seq_len {T}, vocab {V}, global batch {global_batch}, "
          f"{CORES} cores; llama ffn_dim {llama_ffn}")
    print("sgemm per core, both cores busy: " + ", ".join(f"{s} shapes {sg[s]:.1f} GFLOP/s" for s in shape_sets))
    print(f"OpenBLAS: {sgemm_info.get('openblas_parallel')} build, trainer loads {res['openblas']['trainer_library']}")
    print(f"{'':28} {'ranks x thr':>11} {'ms/step':>9} {'tokens/s':>9} {'MFLOP/tok':>9} {'ceiling':>8} "
          f"{'util.':>6} {'util. exec.':>11}")
    for key, s in res["rows"].items():
        print(f"{s['name']:28} {s['ranks']:>7} x {s['threads_per_rank']} {s['step_ms_median']:9.1f} "
              f"{s['tokens_per_s']:9.0f} {s['flops_per_token'] / 1e6:9.2f} {s['ceiling_tokens_per_s']:8.0f} "
              f"{100 * s['utilisation']:5.1f}% {100 * s['utilisation_executed_flops']:10.1f}%")
    for name, rr in res["ratios"].items():
        print(f"{name}: {rr['tokens_per_s_ratio']:.3f}  (per round: "
              + ", ".join(f"{x:.3f}" for x in rr["per_round"]) + ")")
    if not have_torch:
        print("PyTorch DDP: skipped (install Debian's python3-torch to compare: apt-get install python3-torch)")
    path = os.path.join(out, "reference.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
