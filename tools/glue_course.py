#!/usr/bin/env python3
"""Fine-tuning a Hugging Face BERT on GLUE RTE with llmpi, in one command (`make glue`).

  tools/glue_course.py [--build build] [--out build/glue-course] [--parts train,timing,traffic,reference]
                       [--glue-dir DIR] [--model DIR] [--np 2] [--timing-iters 40] [--timing-batch 16]
                       [--rates loopback,1gbit] [--reference-python PY] [--epochs 3] [--bf16-epochs 1]
                       [--bf16-steps N]

Parts (all by default; each writes its own JSON under --out and adds to summary.json/summary.md):

  train      Fine-tunes all-MiniLM-L6-v2 (`make pretrained`) on GLUE RTE on --np ranks for 3 epochs
             (max length 128, seed 42), twice: the reference settings (global batch 64, lr 2e-5) and
             the settings chosen for this smaller model (global batch 16, lr 5e-5; docs/GLUE.md says
             why). Prints the loss of the first five minibatches and the dev accuracy after every
             epoch, from each run's own output and eval.jsonl.
  timing     Times --timing-iters iterations (default 40, the first discarded) of each sync method
             at global batch --timing-batch (16, the chosen settings'; a smaller batch shows the
             communication more, since its bytes do not depend on the batch): gather_scatter,
             allreduce per tensor, allreduce bucketed, allreduce bucketed + overlap. Prints the mean time per iteration and the share
             of it that was exposed communication, on each of --rates: "loopback" is plain mpiexec
             on this machine (MPICH: shared memory), a tc rate such as 1gbit runs rank 0 and rank 1
             in two network namespaces joined by that link (tools/netns_link.sh; needs root).
  traffic    Bytes per iteration at global batch 64, 32 and 16: expected (comm_plan.json), measured
             by llmpi (metrics.jsonl bytes_sent + bytes_received of rank 0) and counted by the link
             (the veth's tx bytes of rank 0 on an unlimited netns link, taken as the difference of a
             5-step and a 1-step run so start-up traffic cancels); and per epoch.
  reference  The same fine-tune in PyTorch (transformers' BertForSequenceClassification, DDP over
             gloo, --np processes x 1 thread; tools/glue_reference.py), side by side: --timing-iters
             iterations of PyTorch and of llmpi's overlapped all-reduce, alternated twice, and the
             3-epoch accuracy with both settings. Needs a Python with torch, transformers,
             safetensors and h5py (--reference-python, or $REF_PYTHON); skipped with a message
             without one.
  bf16       (not in the default parts) The same comparison in bf16: llmpi with runtime.precision
             bf16 against the reference under torch.autocast("cpu", torch.bfloat16) (glue_reference.py
             --autocast bf16), the chosen settings: --pairs timing pairs of --timing-iters iterations
             (the order swapped every pair), then a --bf16-epochs fine-tune of each, one after the
             other (with --bf16-steps N instead: N iterations, the linear schedule spanning them,
             then one evaluation); examples/s
             (global batch / median iteration) and the dev accuracy after each epoch (or those N
             iterations). Needs the reference Python as above.

RTE comes from ../shared/data/glue/RTE or $GLUE_DIR (train.tsv, dev.tsv as GLUE distributes them).
Everything runs the binaries of --build; the data is prepared into OUT/rte with llmpi-prep glue.
Takes long on a small machine (on a 2-core VM: train ~30 min, timing ~20 min per
rate, traffic ~5 min, reference ~40 min); each part can be run alone with --parts.
Needs only Python's standard library (the reference part excepted).
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time

PROG = "glue_course"
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

SETTINGS = {
    # name: (global batch, lr, warm-up steps); linear decay to 0, weight decay 0.01, dropout 0.1
    "course": (64, 2e-5, 0),
    "chosen": (16, 5e-5, 0),
}
METHODS = [  # (name, --set overrides)
    ("gather_scatter", ["parallel.sync=gather_scatter"]),
    ("allreduce per tensor", ["parallel.sync=allreduce", "parallel.bucket_mb=0"]),
    ("allreduce bucketed", ["parallel.sync=allreduce", "parallel.bucket_mb=25"]),
    ("allreduce bucketed + overlap", ["parallel.sync=allreduce", "parallel.bucket_mb=25", "parallel.overlap=true"]),
]


def say(msg):
    print(f"{PROG}: {msg}", flush=True)


def die(msg):
    print(f"{PROG}: error: {msg}", file=sys.stderr, flush=True)
    sys.exit(2)


def read_jsonl(path):
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                line = line.strip()
                if line:
                    out.append(json.loads(line))
    return out


def write_json(path, obj):
    with open(path + ".tmp", "w") as f:
        json.dump(obj, f, indent=1)
    os.replace(path + ".tmp", path)


class Course:
    def __init__(self, a):
        self.a = a
        self.build = os.path.abspath(a.build)
        self.out = os.path.abspath(a.out)
        self.train_bin = os.path.join(self.build, "llmpi-train")
        self.data = os.path.join(self.out, "rte")
        os.makedirs(self.out, exist_ok=True)
        self.summary_path = os.path.join(self.out, "summary.json")
        self.summary = json.load(open(self.summary_path)) if os.path.exists(self.summary_path) else {}

    def save(self):
        self.summary["machine"] = {"nproc": os.cpu_count(), "uname": " ".join(os.uname()),
                                   "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
        write_json(self.summary_path, self.summary)
        with open(os.path.join(self.out, "summary.md"), "w") as f:
            f.write(markdown(self.summary))

    # ---- data ----------------------------------------------------------------------------------
    def prep(self):
        if os.path.exists(os.path.join(self.data, "manifest.json")):
            return
        cmd = [os.path.join(self.build, "llmpi-prep"), "glue", "--task", "rte", "--data-dir", self.a.glue_dir,
               "--tokenizer", "hf:" + os.path.join(self.a.model, "tokenizer.json"), "--max-seq-len", "128",
               "--out", self.data]
        say("preparing RTE: " + " ".join(cmd))
        subprocess.run(cmd, check=True)

    # ---- one llmpi run ---------------------------------------------------------------------------
    def llmpi(self, run_dir, sets, rate="loopback", stats=None, capture=True, init=True):
        shutil.rmtree(run_dir, ignore_errors=True)
        args = [self.train_bin, "--config", os.path.join(ROOT, "data", "minilm-rte.json"),
                "--set", "data.train=" + os.path.join(self.data, "train.h5"),
                "--set", "data.val=" + os.path.join(self.data, "dev.h5"), "--set", "run.dir=" + run_dir,
                "--set", "runtime.threads=1"]
        if init:
            args += ["--init-from", self.a.model]
        for s in sets:
            args += ["--set", s]
        if rate == "loopback":
            cmd = ["mpiexec", "-n", str(self.a.np)] + args
        else:
            if self.a.np != 2:
                die("a simulated link joins exactly 2 ranks: use --np 2 or --rates loopback")
            cmd = [os.path.join(ROOT, "tools", "netns_link.sh"), "--quiet", "--rate", rate]
            if stats:
                cmd += ["--stats", stats]
            cmd += ["mpi", "--"] + args
        say("run: " + " ".join(cmd))
        p = subprocess.run(cmd, stdout=subprocess.PIPE if capture else None, stderr=subprocess.STDOUT, text=True)
        if p.returncode != 0:
            if capture:
                sys.stdout.write(p.stdout[-4000:])
            die(f"llmpi-train failed (exit {p.returncode}) in {run_dir}")
        return p.stdout if capture else ""

    # ---- parts ---------------------------------------------------------------------------------
    def part_train(self):
        res = {}
        for name, (batch, lr, warm) in SETTINGS.items():
            run = os.path.join(self.out, "train-" + name)
            sets = ["train.steps=0", f"train.epochs={self.a.epochs}", f"train.global_batch={batch}",
                    f"train.lr={lr}", f"train.warmup_steps={warm}", "train.log_every=10"]
            t0 = time.time()
            out = self.llmpi(run, sets)
            wall = time.time() - t0
            metrics = read_jsonl(os.path.join(run, "metrics.jsonl"))
            evals = read_jsonl(os.path.join(run, "eval.jsonl"))
            first = [m["loss"] for m in metrics if m["step"] < 5]
            per_epoch = [e for e in evals if e["step"] > 0]
            res[name] = {"global_batch": batch, "lr": lr, "warmup_steps": warm, "epochs": self.a.epochs,
                         "steps": metrics[-1]["step"] + 1 if metrics else 0, "first_losses": first,
                         "accuracy_per_epoch": [e["accuracy"] for e in per_epoch],
                         "val_loss_per_epoch": [e["val_loss"] for e in per_epoch],
                         "accuracy_at_start": evals[0]["accuracy"] if evals else None,
                         "dev_examples": per_epoch[-1]["examples"] if per_epoch else 0,
                         "loss_curve": [[m["step"], m["loss"]] for m in metrics], "wall_s": wall}
            say(f"{name} (global batch {batch}, lr {lr:g}): first five losses " +
                ", ".join(f"{x:.4f}" for x in first))
            for i, e in enumerate(per_epoch):
                say(f"{name}: epoch {i + 1}: dev accuracy {e['accuracy']:.4f} ({e['examples']} examples), "
                    f"val loss {e['val_loss']:.4f}")
            self.summary["train"] = {**self.summary.get("train", {}), name: res[name]}
            self.save()
        plot_svg(self.summary.get("train", {}), os.path.join(self.out, "glue-rte.svg"))

    def time_method(self, tag, sets, rate, iters, batch):
        run = os.path.join(self.out, "timing", f"{tag}-{rate}")
        self.llmpi(run, sets + ["train.epochs=0", f"train.steps={iters}", f"train.global_batch={batch}", "train.log_every=1",
                                "train.eval_every=0", "data.val="], rate=rate)
        m = read_jsonl(os.path.join(run, "metrics.jsonl"))[1:]  # the first iteration is discarded
        step = statistics.mean(x["step_ms"] for x in m)
        exposed = statistics.mean(x["exposed_comm_ms"] for x in m)
        comm = statistics.mean(x["comm_ms"] for x in m)
        return {"iterations": len(m), "mean_step_ms": step, "median_step_ms": statistics.median(x["step_ms"] for x in m),
                "mean_exposed_comm_ms": exposed, "mean_comm_ms": comm, "exposed_share": exposed / step,
                "mean_bytes": statistics.mean(x["bytes_communicated"] for x in m),
                "collectives": m[-1]["collectives"]}

    def part_timing(self):
        out = self.summary.get("timing", {})
        for rate in self.a.rates:
            if rate != "loopback" and os.geteuid() != 0:
                say(f"timing on {rate}: skipped (the simulated link needs root)")
                continue
            rows = {}
            for name, sets in METHODS:
                r = self.time_method(name.replace(" ", "_").replace("+", "plus"), sets, rate, self.a.timing_iters,
                                     self.a.timing_batch)
                rows[name] = r
                say(f"timing {rate} {name}: {r['mean_step_ms']:.0f} ms/iteration, exposed communication "
                    f"{r['mean_exposed_comm_ms']:.0f} ms ({100 * r['exposed_share']:.1f}%)")
            out[rate] = {"global_batch": self.a.timing_batch, "iterations": self.a.timing_iters, "methods": rows}
            self.summary["timing"] = out
            self.save()

    def part_traffic(self):
        have_link = os.geteuid() == 0
        rows = {}
        for batch in (64, 32, 16):
            per = {}
            for steps in (1, 5):
                run = os.path.join(self.out, "traffic", f"b{batch}-s{steps}")
                stats = run + "-link.json"
                sets = ["parallel.sync=allreduce", f"train.global_batch={batch}", "train.epochs=0", f"train.steps={steps}",
                        "train.log_every=1", "train.eval_every=0", "data.val="]
                if have_link:
                    self.llmpi(run, sets, rate="none", stats=stats)
                    per[steps] = json.load(open(stats))["a"]["tx_bytes"]
                else:
                    self.llmpi(run, sets)
            plan = json.load(open(os.path.join(run, "comm_plan.json")))
            m = read_jsonl(os.path.join(run, "metrics.jsonl"))
            measured = statistics.median(x["bytes_sent"] for x in m)
            manifest = json.load(open(os.path.join(self.data, "manifest.json")))
            n_train = manifest_examples(manifest, "train")
            steps_per_epoch = -(-n_train // batch)  # drop_last false: ceil
            row = {"expected_sent_per_iteration": plan["expected_bytes_sent_per_pass_rank0"],
                   "measured_sent_per_iteration": measured,
                   "measured_sent_plus_received_per_iteration": statistics.median(x["bytes_communicated"] for x in m),
                   "steps_per_epoch": steps_per_epoch}
            if have_link:
                row["link_tx_per_iteration"] = (per[5] - per[1]) / 4
            row["per_epoch_sent"] = measured * steps_per_epoch
            rows[str(batch)] = row
            say(f"traffic at global batch {batch}: expected {row['expected_sent_per_iteration'] / 1e6:.2f} MB sent "
                f"per iteration, measured {measured / 1e6:.2f} MB" +
                (f", link {row['link_tx_per_iteration'] / 1e6:.2f} MB" if have_link else "") +
                f"; {steps_per_epoch} iterations per epoch: {row['per_epoch_sent'] / 1e9:.2f} GB per epoch")
        self.summary["traffic"] = rows
        self.save()

    def part_reference(self):
        py = self.a.reference_python
        if not py:
            say("reference: skipped (no --reference-python / $REF_PYTHON with torch, transformers, h5py)")
            return
        ref = os.path.join(ROOT, "tools", "glue_reference.py")
        base = [py, ref, "--model", self.a.model, "--data", self.data, "--world", str(self.a.np), "--threads", "1",
                "--seed", "42"]
        out = self.summary.get("reference", {})
        # Side by side, alternated: PyTorch DDP, llmpi (overlapped buckets, as DDP does), --pairs times.
        pt, ll = [], []
        batch, iters = self.a.timing_batch, self.a.timing_iters
        for rep in range(self.a.pairs):
            j = os.path.join(self.out, f"reference-timing-{rep}.json")
            subprocess.run(base + ["--batch", str(batch), "--iters", str(iters), "--json", j], check=True)
            pt.append(json.load(open(j))["mean_iter_s"] * 1e3)
            r = self.time_method(f"llmpi-vs-pytorch-{rep}", METHODS[3][1], "loopback", iters, batch)
            ll.append(r["mean_step_ms"])
            say(f"side by side {rep + 1}/{self.a.pairs}: PyTorch DDP {pt[-1]:.0f} ms/iteration, "
                f"llmpi {ll[-1]:.0f} ms/iteration")
        out["timing"] = {"global_batch": batch, "iterations": iters, "pytorch_ms": pt, "llmpi_ms": ll,
                         "ratio_llmpi_over_pytorch": statistics.median(ll) / statistics.median(pt),
                         "ratio_per_pair": [l / p for l, p in zip(ll, pt)]}
        self.summary["reference"] = out
        self.save()
        for name, (b, lr, warm) in SETTINGS.items():
            j = os.path.join(self.out, f"reference-{name}.json")
            if self.a.reference_settings and name not in self.a.reference_settings:
                if os.path.exists(j):  # an earlier run's result
                    out[name] = json.load(open(j))
                    self.summary["reference"] = out
                    self.save()
                continue
            t0 = time.time()
            subprocess.run(base + ["--batch", str(b), "--lr", str(lr), "--warmup", str(warm), "--epochs",
                                   str(self.a.epochs), "--json", j], check=True)
            r = json.load(open(j))
            r["wall_s"] = time.time() - t0
            out[name] = r
            self.summary["reference"] = out
            self.save()

    def part_bf16(self):
        py = self.a.reference_python
        if not py:
            say("bf16: skipped (no --reference-python / $REF_PYTHON with torch, transformers, h5py)")
            return
        batch, lr, warm = SETTINGS["chosen"]
        base = [py, os.path.join(ROOT, "tools", "glue_reference.py"), "--model", self.a.model, "--data", self.data,
                "--world", str(self.a.np), "--threads", "1", "--seed", "42", "--autocast", "bf16",
                "--batch", str(batch)]
        bf16 = ["runtime.precision=bf16"]
        iters = self.a.timing_iters
        res = {"global_batch": batch, "lr": lr, "timing_iterations": iters, "pytorch_ms": [], "llmpi_ms": []}
        for rep in range(self.a.pairs):  # alternated: PyTorch first in even pairs, llmpi first in odd ones
            for who in (("pytorch", "llmpi") if rep % 2 == 0 else ("llmpi", "pytorch")):
                if who == "pytorch":
                    j = os.path.join(self.out, f"bf16-timing-pytorch-{rep}.json")
                    subprocess.run(base + ["--iters", str(iters), "--json", j], check=True)
                    res["pytorch_ms"].append(json.load(open(j))["median_iter_s"] * 1e3)
                else:
                    r = self.time_method(f"bf16-llmpi-{rep}", METHODS[3][1] + bf16, "loopback", iters, batch)
                    res["llmpi_ms"].append(r["median_step_ms"])
            say(f"bf16 side by side {rep + 1}/{self.a.pairs}: PyTorch autocast {res['pytorch_ms'][-1]:.0f} ms/iteration, "
                f"llmpi bf16 {res['llmpi_ms'][-1]:.0f} ms/iteration (medians)")
        pt, ll = statistics.median(res["pytorch_ms"]), statistics.median(res["llmpi_ms"])
        res.update(pytorch_examples_per_s=batch / pt * 1e3, llmpi_examples_per_s=batch / ll * 1e3,
                   speedup_llmpi_over_pytorch=pt / ll, speedup_per_pair=[p / l for p, l in
                                                                         zip(res["pytorch_ms"], res["llmpi_ms"])])
        # The fine-tunes: llmpi's banner says which bf16 GEMM engine ran.
        epochs, steps = self.a.bf16_epochs, self.a.bf16_steps
        run = os.path.join(self.out, "train-chosen-bf16")
        t0 = time.time()
        # A short fine-tune: N steps, the schedule spanning them (the reference's --max-steps), one
        # evaluation at the end.
        length = ([f"train.steps={steps}", "train.epochs=0", f"train.eval_every={steps}"] if steps else
                  ["train.steps=0", f"train.epochs={epochs}"])
        out = self.llmpi(run, length + [f"train.global_batch={batch}", f"train.lr={lr}",
                                        f"train.warmup_steps={warm}", "train.log_every=10"] + bf16)
        wall = time.time() - t0
        metrics = read_jsonl(os.path.join(run, "metrics.jsonl"))
        evals = [e for e in read_jsonl(os.path.join(run, "eval.jsonl")) if e["step"] > 0]
        engine = next((l[len("bf16 GEMMs: "):] for l in out.splitlines() if l.startswith("bf16 GEMMs: ")), "")
        res["llmpi"] = {"epochs": epochs, "max_steps": steps, "steps": metrics[-1]["step"] + 1 if metrics else 0,
                        "first_losses": [m["loss"] for m in metrics if m["step"] < 5],
                        "accuracy_per_epoch": [e["accuracy"] for e in evals], "wall_s": wall,
                        "median_step_ms": statistics.median(m["step_ms"] for m in metrics[1:]),
                        "bf16_gemm": engine}
        j = os.path.join(self.out, "bf16-pytorch-train.json")
        t0 = time.time()
        subprocess.run(base + ["--lr", str(lr), "--warmup", str(warm), "--epochs", str(epochs), "--json", j]
                       + (["--max-steps", str(steps)] if steps else []), check=True)
        res["pytorch"] = dict(json.load(open(j)), wall_s=time.time() - t0)
        for who in ("llmpi", "pytorch"):
            say(f"bf16 {who}: dev accuracy per epoch " +
                ", ".join(f"{x:.4f}" for x in res[who]["accuracy_per_epoch"]))
        self.summary["bf16"] = res
        self.save()


def manifest_examples(manifest, split):
    """The example count of a split (train, dev) in llmpi-prep glue's manifest.json (version 2:
    "splits"; version 1, older builds: "files" by name)."""
    e = manifest.get("splits", {}).get(split) or manifest.get("files", {}).get(split + ".h5")
    if not isinstance(e, dict) or "size" not in e:
        die(f"manifest.json names no {split}.h5 with a size: remake the data with llmpi-prep glue")
    return int(e["size"])


def markdown(s):
    lines = [f"# GLUE RTE with llmpi (tools/glue_course.py), {s.get('machine', {}).get('date', '')}", ""]
    if "train" in s:
        lines += ["| settings | global batch | lr | steps | first five losses | dev accuracy per epoch |",
                  "|---|---|---|---|---|---|"]
        for name, r in s["train"].items():
            lines.append(f"| {name} | {r['global_batch']} | {r['lr']:g} | {r['steps']} | "
                         + ", ".join(f"{x:.4f}" for x in r["first_losses"]) + " | "
                         + ", ".join(f"{x:.4f}" for x in r["accuracy_per_epoch"]) + " |")
        lines.append("")
    for rate, t in s.get("timing", {}).items():
        lines += [f"Time per iteration on {rate} (global batch {t['global_batch']}, mean of "
                  f"{t['iterations'] - 1} iterations after the first):", "",
                  "| method | ms / iteration | exposed communication ms | share |", "|---|---|---|---|"]
        for name, r in t["methods"].items():
            lines.append(f"| {name} | {r['mean_step_ms']:.0f} | {r['mean_exposed_comm_ms']:.0f} | "
                         f"{100 * r['exposed_share']:.1f}% |")
        lines.append("")
    if "traffic" in s:
        lines += ["| global batch | expected sent / iteration | measured sent / iteration | link tx / iteration | "
                  "iterations / epoch | sent / epoch |", "|---|---|---|---|---|---|"]
        for b, r in s["traffic"].items():
            link = f"{r['link_tx_per_iteration'] / 1e6:.2f} MB" if "link_tx_per_iteration" in r else "n/a"
            lines.append(f"| {b} | {r['expected_sent_per_iteration'] / 1e6:.2f} MB | "
                         f"{r['measured_sent_per_iteration'] / 1e6:.2f} MB | {link} | {r['steps_per_epoch']} | "
                         f"{r['per_epoch_sent'] / 1e9:.2f} GB |")
        lines.append("")
    ref = s.get("reference", {})
    if "timing" in ref:
        t = ref["timing"]
        lines += [f"Side by side (global batch {t['global_batch']}, {t['iterations']} iterations, mean after the "
                  f"first): PyTorch DDP " + ", ".join(f"{x:.0f}" for x in t["pytorch_ms"]) + " ms; llmpi "
                  + ", ".join(f"{x:.0f}" for x in t["llmpi_ms"]) + f" ms; llmpi / PyTorch = "
                  f"{t['ratio_llmpi_over_pytorch']:.3f}", ""]
    for name in SETTINGS:
        if name in ref:
            r = ref[name]
            lines.append(f"PyTorch {name}: first five losses " + ", ".join(f"{x:.4f}" for x in r["first_losses"])
                         + "; dev accuracy per epoch " + ", ".join(f"{x:.4f}" for x in r["accuracy_per_epoch"]))
    b = s.get("bf16")
    if b and "llmpi" in b:
        lines += ["", f"bf16 (global batch {b['global_batch']}, lr {b['lr']:g}; median ms / iteration of "
                      f"{b['timing_iterations']} iterations, pairs alternated):", "",
                  "| program | ms / iteration per pair | examples/s | dev accuracy per epoch |", "|---|---|---|---|",
                  "| llmpi, runtime.precision bf16 | " + ", ".join(f"{x:.0f}" for x in b["llmpi_ms"]) +
                  f" | {b['llmpi_examples_per_s']:.1f} | " +
                  ", ".join(f"{x:.4f}" for x in b["llmpi"]["accuracy_per_epoch"]) + " |",
                  "| transformers, bf16 autocast | " + ", ".join(f"{x:.0f}" for x in b["pytorch_ms"]) +
                  f" | {b['pytorch_examples_per_s']:.1f} | " +
                  ", ".join(f"{x:.4f}" for x in b["pytorch"]["accuracy_per_epoch"]) + " |"]
    return "\n".join(lines) + "\n"


def plot_svg(train, path):
    """Dev accuracy per epoch and the training loss of each run, as a dependency-free SVG."""
    if not train:
        return
    W, H, pad = 760, 300, 50
    colours = {"course": "#4c72b0", "chosen": "#dd8452"}
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" '
             f'font-size="11"><rect width="100%" height="100%" fill="white"/>']

    def panel(x0, title, series, ylo, yhi, xlabel):
        pw, ph = W / 2 - pad - 10, H - 2 * pad
        parts.append(f'<text x="{x0 + pw / 2}" y="{pad - 15}" text-anchor="middle" font-size="13">{title}</text>')
        parts.append(f'<rect x="{x0}" y="{pad}" width="{pw}" height="{ph}" fill="none" stroke="#888"/>')
        xmax = max((max(x for x, _ in pts) for _, pts, _ in series if pts), default=1) or 1
        for i in range(5):
            y = ylo + (yhi - ylo) * i / 4
            py = pad + ph - ph * i / 4
            parts.append(f'<text x="{x0 - 5}" y="{py + 4}" text-anchor="end">{y:.2f}</text>')
            parts.append(f'<line x1="{x0}" y1="{py}" x2="{x0 + pw}" y2="{py}" stroke="#eee"/>')
        parts.append(f'<text x="{x0 + pw / 2}" y="{H - 12}" text-anchor="middle">{xlabel}</text>')
        for k, (name, pts, dots) in enumerate(series):
            if not pts:
                continue
            xy = [(x0 + pw * x / xmax, pad + ph - ph * (min(max(y, ylo), yhi) - ylo) / (yhi - ylo)) for x, y in pts]
            c = colours.get(name, "#555")
            parts.append('<polyline fill="none" stroke="%s" stroke-width="1.5" points="%s"/>'
                         % (c, " ".join(f"{x:.1f},{y:.1f}" for x, y in xy)))
            if dots:
                for x, y in xy:
                    parts.append(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="3" fill="{c}"/>')
            parts.append(f'<text x="{x0 + 8}" y="{pad + 14 + 14 * k}" fill="{c}">{name}</text>')

    acc = [(n, [(0, r["accuracy_at_start"] or 0.5)] + [(i + 1, a) for i, a in enumerate(r["accuracy_per_epoch"])], True)
           for n, r in train.items()]
    panel(pad, "RTE dev accuracy after each epoch", acc, 0.45, 0.65, "epoch")
    loss = []
    for n, r in train.items():
        spe = r["steps"] / max(1, r["epochs"])
        pts = [(s / spe, l) for s, l in r["loss_curve"]]
        loss.append((n, pts, False))
    panel(W / 2 + pad - 10, "training loss (logged steps)", loss, 0.4, 0.9, "epoch")
    parts.append("</svg>\n")
    with open(path, "w") as f:
        f.write("\n".join(parts))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--build", default=os.path.join(ROOT, "build"))
    p.add_argument("--out", default="")
    p.add_argument("--parts", default="train,timing,traffic,reference")
    p.add_argument("--glue-dir", default=os.environ.get("GLUE_DIR", os.path.join(ROOT, "..", "shared", "data", "glue", "RTE")))
    p.add_argument("--model", default=os.path.join(ROOT, "pretrained", "all-MiniLM-L6-v2"))
    p.add_argument("--np", type=int, default=2)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--timing-iters", type=int, default=40)
    p.add_argument("--timing-batch", type=int, default=16)
    p.add_argument("--rates", default="loopback,1gbit")
    p.add_argument("--reference-python", default=os.environ.get("REF_PYTHON", ""))
    p.add_argument("--bf16-epochs", type=int, default=1, help="epochs of each fine-tune of the bf16 part")
    p.add_argument("--bf16-steps", type=int, default=0,
                   help="the bf16 part's fine-tunes stop after this many iterations (0: all --bf16-epochs)")
    p.add_argument("--pairs", type=int, default=2,
                   help="side-by-side timing pairs (PyTorch DDP, then llmpi), alternated (default 2)")
    p.add_argument("--reference-settings", default="",
                   help="comma list of course,chosen: the 3-epoch PyTorch runs to make (default: both; 'none': "
                        "only the side-by-side timing, earlier results in OUT are kept)")
    a = p.parse_args()
    a.out = a.out or os.path.join(a.build, "glue-course")
    a.rates = [r for r in a.rates.split(",") if r]
    a.reference_settings = [r for r in a.reference_settings.split(",") if r]
    parts = [x for x in a.parts.split(",") if x]
    for x in parts:
        if x not in ("train", "timing", "traffic", "reference", "bf16"):
            die(f"unknown part '{x}': the parts are train, timing, traffic, reference, bf16")
    if a.pairs < 1:
        die("--pairs must be >= 1")
    if a.bf16_epochs < 1 or a.bf16_steps < 0:
        die("--bf16-epochs must be >= 1 and --bf16-steps >= 0")
    if a.timing_iters < 2:
        die("--timing-iters must be >= 2 (the first is discarded)")
    for f in ("train.tsv", "dev.tsv"):
        if not os.path.exists(os.path.join(a.glue_dir, f)):
            die(f"{a.glue_dir}/{f} is missing: give the GLUE RTE folder with --glue-dir or GLUE_DIR=")
    if not os.path.exists(os.path.join(a.model, "model.safetensors")):
        die(f"{a.model} has no model.safetensors: run `make pretrained` (or give --model DIR)")
    for b in ("llmpi-train", "llmpi-prep"):
        if not os.access(os.path.join(a.build, b), os.X_OK):
            die(f"{a.build}/{b} is missing: run `make` first (or give --build DIR)")
    c = Course(a)
    c.prep()
    for x in parts:
        t0 = time.time()
        getattr(c, "part_" + x)()
        say(f"part {x} done in {time.time() - t0:.0f} s; results in {c.out}/summary.md")
    print(open(os.path.join(c.out, "summary.md")).read())


if __name__ == "__main__":
    main()
