#!/usr/bin/python3
"""Does "auto" pick the faster CPU GEMM engine? (`make bench-gemm-choice`)

For each kernel setting (OPENBLAS_CORETYPE and ONEDNN_MAX_CPU_ISA standing for other CPUs, as in
tools/kernel_paths.sh), the reference configuration's gpt2 row (bench/reference.json: L4 D256 T256,
2 ranks x 1 thread) trains with each engine set by hand and with "auto":
  fp32: runtime.cpu_fp32_gemm openblas, onednn, auto
  bf16: runtime.cpu_bf16_gemm emulate, onednn, auto (where oneDNN has bf16 instructions)
The order of the runs is reversed every other round. Per setting it reports each engine's median
step time over all timed steps of all rounds, the engine "auto" chose (the trainer's banner), and
auto's time against the faster hand-set engine. Prints a table and writes JSON (default
BUILD/bench/gemm_choice.json).
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

from run_reference import cpu_description, run  # (bench/run_reference.py, beside this file)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# (name, OPENBLAS_CORETYPE or None for the CPU's own, ONEDNN_MAX_CPU_ISA or None)
SETTINGS = [
    ("this CPU's own kernels", None, None),
    ("OpenBLAS generic (Prescott)", "Prescott", None),
    ("AVX2 (Haswell, oneDNN AVX2)", "Haswell", "AVX2"),
    ("AVX-512 without bf16 (SkylakeX, oneDNN AVX512_CORE)", "SkylakeX", "AVX512_CORE"),
]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.environ.get("BUILD", "build"))
    p.add_argument("--out", default=None, help="output directory (default BUILD/bench)")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=16, help="training steps per run")
    p.add_argument("--skip", type=int, default=3, help="steps discarded at the start of each run")
    p.add_argument("--settings", default="", help="comma-separated indices into the settings (default all)")
    a = p.parse_args()
    build = a.build if os.path.isabs(a.build) else os.path.join(ROOT, a.build)
    out = a.out or os.path.join(build, "bench")
    os.makedirs(out, exist_ok=True)
    log = os.path.join(out, "gemm_choice.log")
    open(log, "w").close()
    base_env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1")
    for k in ("OPENBLAS_CORETYPE", "ONEDNN_MAX_CPU_ISA"):
        base_env.pop(k, None)
    config = os.path.join(ROOT, "bench/reference.json")
    ref = json.load(open(config))
    V = ref["model"]["vocab_size"]
    tokens = os.path.join(out, "reference_tokens.h5")
    if not os.path.exists(tokens):
        run([f"{build}/bench-random_tokens", "--out", tokens, "--vocab", str(V), "--tokens", str(4 << 20)],
            base_env, log)
    settings = SETTINGS if not a.settings else [SETTINGS[int(i)] for i in a.settings.split(",")]

    runs = []  # one per (setting, precision, engine)
    for name, core, isa in settings:
        env = dict(base_env)
        if core:
            env["OPENBLAS_CORETYPE"] = core
        if isa:
            env["ONEDNN_MAX_CPU_ISA"] = isa
        probe = subprocess.run(["mpiexec", "-n", "1", f"{build}/llmpi-train", "--config", config, "--set",
                                f"data.train={tokens}", "--set", f"run.dir={out}/gemm-probe", "--set",
                                "train.steps=1", "--set", "runtime.precision=bf16", "--set",
                                "runtime.cpu_bf16_gemm=onednn", "--overwrite"],
                               env=env, capture_output=True, text=True)
        bf16_onednn = probe.returncode == 0  # (refused where oneDNN has no bf16 instructions)
        for prec, engines in (("fp32", ("openblas", "onednn", "auto")),
                              ("bf16", ("emulate", "onednn", "auto") if bf16_onednn else ())):
            for e in engines:
                runs.append({"setting": name, "OPENBLAS_CORETYPE": core, "ONEDNN_MAX_CPU_ISA": isa,
                             "precision": prec, "engine": e, "env": env, "ms": [], "chosen": None,
                             "banner": None})

    for r in range(a.rounds):
        order = runs if r % 2 == 0 else runs[::-1]
        print(f"round {r + 1}/{a.rounds}: ", end="", flush=True)
        for x in order:
            run_dir = os.path.join(out, "gemm-run")
            key = "cpu_fp32_gemm" if x["precision"] == "fp32" else "cpu_bf16_gemm"
            stdout = run(["mpiexec", "-n", "2", f"{build}/llmpi-train", "--config", config,
                          "--set", f"data.train={tokens}", "--set", f"run.dir={run_dir}",
                          "--set", f"train.steps={a.steps}", "--set", f"runtime.precision={x['precision']}",
                          "--set", f"runtime.{key}={x['engine']}", "--overwrite"], x["env"], log)
            steps = [json.loads(l) for l in open(os.path.join(run_dir, "metrics.jsonl"))]
            x["ms"] += [s["step_ms"] for s in steps if s["step"] >= a.skip]
            resolved = json.load(open(os.path.join(run_dir, "config.json")))
            x["chosen"] = resolved["runtime"][key]
            m = re.search(r"^%s GEMMs: (.*)$" % x["precision"], stdout, re.M)
            x["banner"] = m.group(1) if m else None
            print(".", end="", flush=True)
        print(" done", flush=True)

    results = []
    for name, core, isa in settings:
        for prec in ("fp32", "bf16"):
            rs = [x for x in runs if x["setting"] == name and x["precision"] == prec]
            if not rs:
                continue
            med = {x["engine"]: statistics.median(x["ms"]) for x in rs}
            hand = {e: v for e, v in med.items() if e != "auto"}
            best = min(hand, key=hand.get)
            auto = next(x for x in rs if x["engine"] == "auto")
            results.append({"setting": name, "OPENBLAS_CORETYPE": core, "ONEDNN_MAX_CPU_ISA": isa,
                            "precision": prec, "step_ms_median": med, "fastest_by_hand": best,
                            "auto_chose": auto["chosen"], "auto_banner": auto["banner"],
                            "auto_over_fastest": med["auto"] / hand[best],
                            "chosen_engine_over_fastest": hand[auto["chosen"]] / hand[best]})

    print(f"\n{'setting':<52} {'prec':<5} {'engines by hand, ms/step':<34} {'auto':>9} {'chose':<9} "
          f"{'auto/fastest':>12} {'chosen/fastest':>14}")
    for r in results:
        hand = ", ".join(f"{e} {v:.0f}" for e, v in r["step_ms_median"].items() if e != "auto")
        print(f"{r['setting']:<52} {r['precision']:<5} {hand:<34} {r['step_ms_median']['auto']:>9.0f} "
              f"{r['auto_chose']:<9} {r['auto_over_fastest']:>12.3f} {r['chosen_engine_over_fastest']:>14.3f}")
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True).stdout.strip()
    doc = {"tool": "bench/gemm_choice.py", "date": datetime.date.today().isoformat(), "commit": commit,
           "machine": f"{platform.machine()}, {os.cpu_count()} cores", "cpu": cpu_description(),
           "command": " ".join(["bench/gemm_choice.py"] + sys.argv[1:]), "rounds": a.rounds, "steps": a.steps,
           "skip": a.skip, "config": "bench/reference.json, gpt2, 2 ranks x 1 thread", "results": results}
    path = os.path.join(out, "gemm_choice.json")
    with open(path, "w") as f:
        json.dump(doc, f, indent=1)
    print(f"\nJSON: {path}")


if __name__ == "__main__":
    main()
