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
  ... bf16             each of the four with runtime.precision bf16 (its bf16 GEMMs on oneDNN where
                       the CPU has bf16 instructions, else emulated; the trainer's banner says which,
                       recorded as "bf16_gemm"); --no-bf16 leaves them out
  gpt2 (previous rel.) with --baseline-train PATH: that llmpi-train binary on the gpt2 row's config
  PyTorch DDP          the gpt2 model in PyTorch (gloo, 2 processes x 1 thread) when --torch-python
                       (default Debian's /usr/bin/python3 with python3-torch) imports torch and
                       --no-torch is not given; with the bf16 rows also under
                       torch.autocast("cpu", torch.bfloat16), eager and (PyTorch 2.x) torch.compile,
                       at 2 ranks x 1 thread and 1 rank x 2 threads

Each round first measures the single-core GEMM rates under mpiexec -n 2 (both cores busy, as in
training; bench-sgemm_rate) on each family's own dense-layer GEMM shapes: OpenBLAS sgemm, and where
oneDNN's bf16 matmul can run, oneDNN bf16 (the bf16 rows' ceiling) and oneDNN fp32; then it runs
every row; the order of the rows is reversed every other round, so that a
slow phase of a shared machine hits all rows alike. Figures are medians over all timed steps of all
rounds (the first --skip steps of every run are discarded).

FLOPs/token is the trainer's (model/model_desc.cpp flops_per_token): 6 x parameters + 12 x
layers x seq_len x d_model, with the parameter count the run itself records (comm_plan.json
total_floats). Utilisation = tokens/s x FLOPs/token / (2 cores x the family's GEMM GFLOP/s per
core measured in the same rounds: for fp32 rows the engine the trainer's banner names ("fp32 GEMMs:",
runtime.cpu_fp32_gemm; recorded as "fp32_gemm"), sgemm or oneDNN fp32; for bf16 rows oneDNN bf16
where the banner names it, sgemm where it names the emulation). bench-sgemm_rate runs on the
OpenBLAS kernels llmpi-train runs on (where OpenBLAS picks generic kernels on an unrecognised CPU,
both start again on fitting ones; each run's are recorded as "openblas_core").
Because 6 x parameters also counts embedding tables that are looked up, not multiplied (gpt2's wpe;
llama's untied embed_tokens; bert's word, position and token-type embeddings), a second utilisation
uses the FLOPs the dense layers really execute: 6 x (parameters - those tables) + the same
attention term. (Attention's own products stay fp32 in llmpi's bf16 mode: its ceiling is a bound,
not a target.)

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


def cpu_description():
    """The CPU as /proc/cpuinfo names it, with its family/model and the flags that pick kernels."""
    info = {}
    for line in open("/proc/cpuinfo"):
        k, _, v = line.partition(":")
        info.setdefault(k.strip(), v.strip())
    flags = set(info.get("flags", "").split())
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_tile", "amx_bf16") if f in flags]
    return (f"{info.get('model name', '?')} (family {info.get('cpu family', '?')}, model {info.get('model', '?')}; "
            f"{' '.join(isa) or 'no AVX2'})")


def write_record(path, record):
    """Writes a benchmark's JSON record to path (its folder made), and says so."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(record, f, indent=1)
    print("wrote", path)


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
    p.add_argument("--no-bf16", action="store_true", help="skip the runtime.precision bf16 rows (llmpi and PyTorch)")
    p.add_argument("--torch-python", default="/usr/bin/python3",
                   help="the Python whose torch runs the PyTorch rows (PyTorch 2.x adds the torch.compile rows)")
    p.add_argument("--baseline-train", metavar="PATH",
                   help="an llmpi-train binary of a previous release: adds a 'gpt2 (previous release)' row, "
                        "run interleaved with the others in every round")
    p.add_argument("--only", default="", help="comma-separated row keys to run (default: all); "
                   "keys: gpt2, gpt2_1rank_2threads, llama, bert, each with _bf16 appended, gpt2_previous_release, "
                   "pytorch_ddp, pytorch_bf16, pytorch_bf16_compile, each bf16 one with _1rank_2threads appended")
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
    for r in rows:
        r.update(kind="llmpi", precision="fp32")
    if not a.no_bf16:
        rows += [dict(r, key=r["key"].replace("gpt2", "gpt2_bf16") if r["key"].startswith("gpt2") else r["key"] + "_bf16",
                      name=r["name"].replace(r["key"].split("_")[0], r["key"].split("_")[0] + " bf16", 1),
                      precision="bf16", sets=r["sets"] + ["runtime.precision=bf16"]) for r in rows]
    if a.baseline_train:
        rows.insert(1, {"key": "gpt2_previous_release", "name": "gpt2 (previous release)", "kind": "llmpi",
                        "bin": os.path.abspath(a.baseline_train), "ranks": 2, "threads": 1, "shapes": "gpt2",
                        "precision": "fp32", "data": tokens, "sets": []})

    # PyTorch: the gpt2 model, fp32 DDP, and with the bf16 rows under bf16 autocast, eager and compiled
    torch_version = None
    if not a.no_torch:
        probe = subprocess.run([a.torch_python, "-c", "import torch; print(torch.__version__)"],
                               capture_output=True, text=True)
        torch_version = probe.stdout.strip() if probe.returncode == 0 else None
    if torch_version:
        torch_rows = [("pytorch_ddp", "PyTorch DDP", 2, 1, "off", False)]
        if not a.no_bf16:
            compiled = int(torch_version.split(".")[0]) >= 2
            for ranks, threads, tail in ((2, 1, ""), (1, 2, "_1rank_2threads")):
                for comp in (False, True) if compiled else (False,):
                    name = "PyTorch bf16 autocast" + (", compiled" if comp else "") + (
                        f", {ranks} rank x {threads} threads" if tail else "")
                    torch_rows.append(("pytorch_bf16" + ("_compile" if comp else "") + tail, name, ranks, threads,
                                       "bf16", comp))
        rows += [{"key": k, "name": n, "kind": "torch", "ranks": rk, "threads": th, "autocast": ac, "compile": cp,
                  "shapes": "gpt2", "precision": "fp32" if ac == "off" else "bf16"}
                 for k, n, rk, th, ac, cp in torch_rows]
    if a.only:
        keep = set(a.only.split(","))
        unknown = keep - {r["key"] for r in rows}
        if unknown:
            sys.exit(f"bench: --only: unknown row key(s) {sorted(unknown)} (not known, or left out by "
                     f"--no-bf16 / --no-torch / a Python without torch)")
        rows = [r for r in rows if r["key"] in keep]
    shape_sets = sorted({r["shapes"] for r in rows}, key=list(shape_args).index)

    # The GEMMs measured: sgemm always; oneDNN bf16 (the bf16 rows' ceiling) and fp32 where oneDNN's
    # bf16 matmul runs here (else the bf16 rows run the emulation, on sgemm).
    onednn = subprocess.run(["mpiexec", "-n", "1", f"{build}/bench-sgemm_rate", "--gemm", "onednn-bf16",
                             "--seconds", "0.01", "--rows", "16", "--d-model", "16", "--vocab", "16",
                             "--n-layer", "1"], env=env, capture_output=True, text=True)
    gemms = ["sgemm"] + (["onednn-bf16", "onednn-fp32"] if onednn.returncode == 0 else [])
    bf16_ceiling = "onednn-bf16" if "onednn-bf16" in gemms else "sgemm"
    for row in rows:
        row.update(gemm="sgemm" if row["precision"] == "fp32" else bf16_ceiling, ms=[], round_ms=[], n_params=None,
                   lookup_params=None, printed_mflop=None, bf16_gemm=None, fp32_gemm=None)
    rate = {(s, g): [] for s in shape_sets for g in gemms}
    sgemm_info = {}

    for r in range(a.rounds):
        print(f"round {r + 1}/{a.rounds}: gemm rates", end="", flush=True)
        for s in shape_sets:
            for g in gemms:
                sj = os.path.join(out, f"{g}-{s}-{r}.json")
                run(["mpiexec", "-n", str(CORES), f"{build}/bench-sgemm_rate", "--gemm", g, "--json", sj,
                     "--d-model", str(C), "--n-layer", str(L), "--rows", str(global_batch // CORES * T)]
                    + shape_args[s], env, log)
                sj = json.load(open(sj))
                rate[(s, g)].append(sj["gflops_per_rank_median"])
                if g == "sgemm":
                    sgemm_info = {k: sj.get(k) for k in ("openblas_config", "openblas_parallel", "openblas_library")}
        order = rows if r % 2 == 0 else rows[::-1]
        for row in order:
            print(f", {row['key']}", end="", flush=True)
            if row["kind"] == "torch":
                tj = os.path.join(out, f"torch-{row['key']}-{r}.json")
                cmd = [a.torch_python, os.path.join(ROOT, "bench/pytorch_ddp_reference.py"),
                       "--world-size", str(row["ranks"]), "--threads", str(row["threads"]),
                       "--steps", str(a.steps - a.skip), "--warmup", str(a.skip), "--n-layer", str(L),
                       "--n-head", str(m["n_head"]), "--d-model", str(C), "--vocab", str(V), "--seq-len", str(T),
                       "--batch-per-rank", str(global_batch // row["ranks"]), "--autocast", row["autocast"],
                       "--json", tj]
                run(cmd + (["--compile"] if row["compile"] else []), env, log)
                tj = json.load(open(tj))
                row["ms"] += tj.get("step_ms_all") or [tj["step_ms_median"]]
                row["round_ms"].append(tj["step_ms_median"])
                row["n_params"] = tj["params"]
                row["lookup_params"] = T * C  # gpt2's wpe
                row["torch_version"] = tj.get("torch_version")
                continue
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
            eng = re.search(r"^%s GEMMs: (.*)$" % row["precision"], stdout, re.M)
            row[row["precision"] + "_gemm"] = eng.group(1) if eng else "not reported by this llmpi-train"
            if row["precision"] == "fp32" and eng and eng.group(1).startswith("oneDNN") and "onednn-fp32" in gemms:
                row["gemm"] = "onednn-fp32"  # runtime.cpu_fp32_gemm chose oneDNN: its rate is the ceiling
            if row["precision"] == "bf16" and eng and eng.group(1).startswith("emulated"):
                row["gemm"] = "sgemm"  # runtime.cpu_bf16_gemm chose the emulation, which runs on sgemm
            summary_json = os.path.join(run_dir, "summary.json")
            if os.path.exists(summary_json):
                row["openblas_core"] = json.load(open(summary_json)).get("openblas_core")
        print(" done", flush=True)

    attention_flops = 12 * L * T * C
    rate_med = {k: statistics.median(v) for k, v in rate.items()}

    def summary(row):
        ms, n_params, lookup_params = row["ms"], row["n_params"], row["lookup_params"]
        gflops = rate_med[(row["shapes"], row["gemm"])]
        flops = 6 * n_params + attention_flops  # = flops_per_token() of model/model_desc.cpp
        executed = 6 * (n_params - lookup_params) + attention_flops
        ceiling = CORES * gflops * 1e9 / flops
        med = statistics.median(ms)
        tps = tokens_per_step / (med / 1000)
        return {"name": row["name"], "ranks": row["ranks"], "threads_per_rank": row["threads"],
                "precision": row["precision"], "step_ms_median": med, "step_ms_mean": statistics.mean(ms),
                "steps_timed": len(ms), "step_ms_median_per_round": row["round_ms"], "tokens_per_s": tps,
                "params": n_params, "lookup_only_params": lookup_params,
                "flops_per_token": flops, "executed_gemm_flops_per_token": executed,
                "gemm_shapes": row["shapes"], "gemm_ceiling": row["gemm"], "ceiling_tokens_per_s": ceiling,
                "openblas_core": row.get("openblas_core"),
                "utilisation": tps / ceiling, "utilisation_executed_flops": tps * executed / (CORES * gflops * 1e9)}

    res = {"tool": "bench/run_reference.py", "date": datetime.date.today().isoformat(),
           "machine": f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} cores",
           "cpu": cpu_description(),
           "commit": subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                                    text=True).stdout.strip(),
           "command": " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
           "config": {"n_layer": L, "n_head": m["n_head"], "d_model": C, "seq_len": T, "vocab": V,
                      "global_batch": global_batch, "cores": CORES, "llama_ffn_dim": llama_ffn},
           "rounds": a.rounds, "steps": a.steps, "skip": a.skip,
           "gemm_gflops_per_rank": {f"{s} {g}": {"median": rate_med[(s, g)], "per_round": rate[(s, g)]}
                                    for s, g in rate},
           "openblas": dict(sgemm_info, trainer_library=openblas_of(train_bin)),
           "rows": {}}
    if a.baseline_train:
        res["openblas"]["baseline_trainer_library"] = openblas_of(a.baseline_train)
    for row in rows:
        s = summary(row)
        if row["kind"] == "llmpi":
            s.update(binary=row["bin"], sets=row["sets"], trainer_printed_mflop_per_token=row["printed_mflop"])
            for key in ("bf16_gemm", "fp32_gemm"):
                if row[key]:
                    s[key] = row[key]
        else:
            s.update(torch_version=row.get("torch_version"), autocast=row["autocast"], compile=row["compile"])
        res["rows"][row["key"]] = s

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
        "gpt2 bf16 / gpt2 fp32": ratio("gpt2_bf16", "gpt2"),
        "gpt2 bf16 / gpt2 fp32, 1 rank x 2 threads": ratio("gpt2_bf16_1rank_2threads", "gpt2_1rank_2threads"),
        "llama bf16 / llama fp32": ratio("llama_bf16", "llama"),
        "bert bf16 / bert fp32": ratio("bert_bf16", "bert"),
        "gpt2 bf16 / PyTorch bf16 autocast": ratio("gpt2_bf16", "pytorch_bf16"),
        "gpt2 bf16 / PyTorch bf16 autocast, compiled": ratio("gpt2_bf16", "pytorch_bf16_compile"),
        "gpt2 bf16 / PyTorch bf16 autocast, 1 rank x 2 threads": ratio("gpt2_bf16_1rank_2threads",
                                                                     "pytorch_bf16_1rank_2threads"),
        "gpt2 bf16 / PyTorch bf16 autocast, compiled, 1 rank x 2 threads": ratio(
            "gpt2_bf16_1rank_2threads", "pytorch_bf16_compile_1rank_2threads"),
    }.items() if v is not None}

    print()
    print(f"model: {L} layers, {m['n_head']} heads, d_model {C}, seq_len {T}, vocab {V}, global batch {global_batch}, "
          f"{CORES} cores; llama ffn_dim {llama_ffn}")
    for g in gemms:
        print(f"{g} per core, both cores busy: " + ", ".join(f"{s} shapes {rate_med[(s, g)]:.1f} GFLOP/s"
                                                               for s in shape_sets))
    print(f"OpenBLAS: {sgemm_info.get('openblas_parallel')} build, trainer loads {res['openblas']['trainer_library']}")
    for p_ in ("fp32", "bf16"):
        engines = {r[p_ + "_gemm"] for r in rows if r.get(p_ + "_gemm")}
        if engines:
            print(f"llmpi {p_} GEMMs: " + "; ".join(sorted(engines)))
    if torch_version:
        print(f"PyTorch {torch_version} ({a.torch_python})")
    print(f"{'':54} {'ranks x thr':>11} {'ms/step':>9} {'tokens/s':>9} {'MFLOP/tok':>9} {'ceiling':>8} "
          f"{'util.':>6} {'util. exec.':>11}")
    for key, s in res["rows"].items():
        print(f"{s['name']:54} {s['ranks']:>7} x {s['threads_per_rank']} {s['step_ms_median']:9.1f} "
              f"{s['tokens_per_s']:9.0f} {s['flops_per_token'] / 1e6:9.2f} {s['ceiling_tokens_per_s']:8.0f} "
              f"{100 * s['utilisation']:5.1f}% {100 * s['utilisation_executed_flops']:10.1f}%")
    for name, rr in res["ratios"].items():
        print(f"{name}: {rr['tokens_per_s_ratio']:.3f}  (per round: "
              + ", ".join(f"{x:.3f}" for x in rr["per_round"]) + ")")
    if not torch_version and not a.no_torch:
        print(f"PyTorch: skipped ({a.torch_python} has no torch: install Debian's python3-torch, or give "
              f"--torch-python a Python with PyTorch 2.x)")
    path = os.path.join(out, "reference.json")
    with open(path, "w") as f:
        json.dump(res, f, indent=2)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
