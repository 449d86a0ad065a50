#!/usr/bin/env python3
"""llmpi-prep at corpus scale: memory per rank, ranks, and tokenizer speed per core.

  python3 bench/prep_scaling.py [--build build] [--gpt2 ../shared/data/gpt2] [--sizes 250,2000]
                                [--distinct-mb 50] [--work /tmp] [--sample-mb 100] [--repeats 1]
                                [--parts rss,ranks,speed] [--out FILE.json]

Needs a build (llmpi-prep, llmpi-demo-corpus), mpiexec, GPT-2's encoder.json and vocab.bpe, and for
part 3 `pip install tiktoken tokenizers`. Not needed by make run / make test.

  1. Peak RSS per rank against input size: llmpi-demo-corpus corpora of --sizes MB (plain text,
     blank-line separated stories) prepared with --tokenizer gpt2 --shard-tokens 100M on one rank,
     and --distinct-mb MB of random words (nearly every word new: the worst case for the BPE
     cache); llmpi-prep reports the largest peak RSS over its ranks (getrusage).
  2. 2 ranks against 1 on the largest corpus (mpiexec -n 2 / -n 1, interleaved --repeats times):
     wall time of the whole run and the tokenizing phase, the speed-up, and whether the two data
     sets are the same (manifest.json byte for byte: every shard's token count and content hash).
  3. Tokenizing speed of one core, MB of text per second, in the same run on the same text (the
     first --sample-mb MB of the generated corpus, and the real TinyStories and Tiny Shakespeare
     texts of the shared data folder when they are there, as documents): llmpi-prep on one rank
     (its tokenizing phase: reading, GPT-2 BPE, writing the work files), tiktoken
     (encode_ordinary_batch, one thread) and Hugging Face tokenizers (a byte-level BPE from the
     same files, encode_batch with RAYON_NUM_THREADS=1), each after a warm-up call, --repeats times
     interleaved (median). tiktoken and tokenizers give the same ids, and llmpi-prep the same
     number of tokens (its ids are checked against GPT-2's elsewhere).

Timings from a shared machine are noisy; --repeats > 1 interleaves the runs and reports medians.
Writes a JSON record (--out, default build/bench/prep_scaling.json) and prints a Markdown table.
"""
import argparse
import datetime
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("RAYON_NUM_THREADS", "1")  # before tokenizers is imported
os.environ.setdefault("OMP_NUM_THREADS", "1")


def run(cmd, **kw):
    t0 = time.perf_counter()
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    wall = time.perf_counter() - t0
    if p.returncode != 0:
        sys.exit(f"prep_scaling: {' '.join(cmd)} failed (exit {p.returncode}):\n{p.stderr[-2000:]}")
    return p.stdout, wall


def summary_of(text):
    """Figures from llmpi-prep's summary lines."""
    m = re.search(r"tokenized in ([0-9.]+) s \(([0-9.]+) MB/s, ([0-9.]+) MB/s per rank.*?shards written in ([0-9.]+) s; "
                  r"([0-9.]+) s in all; peak RSS ([0-9.]+) MB \(rank (\d+)\)", text)
    docs = re.search(r"MB read, ([0-9,]+) documents", text)
    tokens = [int(t.replace(",", "")) for t in re.findall(r"documents +([0-9,]+) tokens", text)]
    if not m:
        sys.exit("prep_scaling: no summary in llmpi-prep's output:\n" + text)
    return {"tokenize_s": float(m[1]), "mb_per_s": float(m[2]), "mb_per_s_per_rank": float(m[3]),
            "write_s": float(m[4]), "total_s": float(m[5]), "peak_rss_mb": float(m[6]), "peak_rss_rank": int(m[7]),
            "documents": int(docs[1].replace(",", "")) if docs else None, "tokens": sum(tokens)}


def prep(build, gpt2, corpus, out, ranks):
    shutil.rmtree(out, ignore_errors=True)
    cmd = ["mpiexec", "-n", str(ranks), f"{build}/llmpi-prep", "--tokenizer", "gpt2",
           "--gpt2-encoder", f"{gpt2}/encoder.json", "--gpt2-merges", f"{gpt2}/vocab.bpe",
           "--input", corpus, "--out", out, "--val-fraction", "0.01", "--shard-tokens", "100M"]
    text, wall = run(cmd)
    s = summary_of(text)
    s["wall_s"] = wall
    s["ranks"] = ranks
    with open(os.path.join(out, "manifest.json")) as f:
        s["manifest"] = f.read()
    return s


def documents(path, limit_mb):
    """The corpus's first documents (blank-line separated) up to limit_mb MB of text."""
    docs, size, cur = [], 0, []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip(" \t\r\f\v\n"):
                cur.append(line.rstrip("\n"))
                continue
            if cur:
                d = "\n".join(cur)
                docs.append(d)
                size += len(d.encode())
                cur = []
                if size >= limit_mb * 1e6:
                    break
    if cur and size < limit_mb * 1e6:
        docs.append("\n".join(cur))
    return docs


def distinct_words(path, mb):
    """Documents of 60 random words each: nearly every word is new to the tokenizer's cache."""
    import random
    rng = random.Random(1)
    alpha = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"
    size = 0
    with open(path, "w") as f:
        while size < mb * 1e6:
            doc = " ".join("".join(rng.choices(alpha, k=rng.randint(3, 12))) for _ in range(60)) + "\n\n"
            f.write(doc)
            size += len(doc)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.environ.get("BUILD", "build"))
    ap.add_argument("--gpt2", default=os.path.join(os.environ.get("LLMPI_SHARED_DATA", "../shared/data"), "gpt2"))
    ap.add_argument("--sizes", default="250,2000", help="corpus sizes in MB, comma-separated")
    ap.add_argument("--work", default=tempfile.gettempdir(), help="where corpora and outputs go")
    ap.add_argument("--sample-mb", type=float, default=100.0)
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--distinct-mb", type=float, default=50.0)
    ap.add_argument("--parts", default="rss,ranks,speed")
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    build = os.path.abspath(a.build)
    sizes = [float(s) for s in a.sizes.split(",")]
    work = tempfile.mkdtemp(prefix="llmpi-prep-bench-", dir=a.work)
    record = {"date": datetime.date.today().isoformat(), "host_cores": os.cpu_count(), "sizes_mb": sizes}
    try:
        corpora = {}
        for mb in sizes:
            corpora[mb] = os.path.join(work, f"corpus-{mb:g}MB.txt")
            run([f"{build}/llmpi-demo-corpus", "--out", corpora[mb], "--seed", "1234", "--megabytes", f"{mb:g}"])

        parts = a.parts.split(",")
        # 1. Peak RSS against the input size (one rank).
        record["rss"] = []
        rss_inputs = [(f"{mb:g} MB generated", corpora[mb]) for mb in sizes] if "rss" in parts else []
        if "rss" in parts and a.distinct_mb > 0:
            distinct_words(os.path.join(work, "distinct.txt"), a.distinct_mb)
            rss_inputs.append((f"{a.distinct_mb:g} MB random words", os.path.join(work, "distinct.txt")))
        for name, path in rss_inputs:
            s = prep(build, a.gpt2, path, os.path.join(work, "out-rss"), 1)
            s.pop("manifest")
            s["corpus"] = name
            record["rss"].append(s)
            print(f"[1] {name}: peak RSS {s['peak_rss_mb']:.0f} MB, {s['tokens']:,} tokens, "
                  f"{s['tokenize_s']:.1f} s tokenizing, {s['wall_s']:.1f} s in all", flush=True)

        # 2. 2 ranks against 1 on the largest corpus, interleaved.
        big = corpora[max(sizes)]
        runs = {1: [], 2: []}
        for r in range(a.repeats if "ranks" in parts else 0):
            for n in (1, 2):
                runs[n].append(prep(build, a.gpt2, big, os.path.join(work, f"out-{n}"), n))
                print(f"[2] repeat {r + 1}, {n} rank(s): {runs[n][-1]['wall_s']:.1f} s in all, "
                      f"{runs[n][-1]['tokenize_s']:.1f} s tokenizing", flush=True)
        if runs[1]:
            same = all(x["manifest"] == runs[1][0]["manifest"] for n in (1, 2) for x in runs[n])
            med = {n: {k: statistics.median(x[k] for x in runs[n])
                       for k in ("wall_s", "tokenize_s", "write_s", "peak_rss_mb")} for n in (1, 2)}
            record["ranks"] = {"corpus_mb": max(sizes), "repeats": a.repeats, "median": med,
                               "speedup_wall": med[1]["wall_s"] / med[2]["wall_s"],
                               "speedup_tokenize": med[1]["tokenize_s"] / med[2]["tokenize_s"],
                               "same_manifest": same,
                               "manifest_hashes": [json.loads(runs[1][0]["manifest"])["splits"][k]["content_fnv1a64"]
                                                   for k in ("train", "val")]}

        # 3. One core's tokenizing speed: llmpi-prep, tiktoken, Hugging Face tokenizers, on the
        # generated corpus and on the real texts of the shared data folder when it is there.
        try:
            import tiktoken
            from tiktoken.load import data_gym_to_mergeable_bpe_ranks
            import tokenizers
            from tokenizers import Tokenizer, models, pre_tokenizers
        except ImportError as e:
            sys.exit(f"prep_scaling: {e}; pip install tiktoken tokenizers")
        ranks = data_gym_to_mergeable_bpe_ranks(vocab_bpe_file=f"{a.gpt2}/vocab.bpe",
                                                encoder_json_file=f"{a.gpt2}/encoder.json")
        tt = tiktoken.Encoding(name="gpt2-local", mergeable_ranks=ranks, special_tokens={"<|endoftext|>": 50256},
                               pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""")
        hf = Tokenizer(models.BPE.from_file(f"{a.gpt2}/encoder.json", f"{a.gpt2}/vocab.bpe"))
        hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        shared = os.path.dirname(os.path.abspath(a.gpt2))
        texts = {"generated corpus": big,
                 "TinyStories sample": os.path.join(shared, "tinystories", "validation_sample.txt"),
                 "Tiny Shakespeare": os.path.join(shared, "tinyshakespeare", "input.txt")}
        record["speed"] = []
        for name, path in texts.items():
            if "speed" not in parts or not os.path.exists(path):
                continue
            docs = documents(path, a.sample_mb)
            text_mb = sum(len(d.encode()) for d in docs) / 1e6
            sample = os.path.join(work, "sample.txt")
            with open(sample, "w", encoding="utf-8") as f:
                f.write("\n\n".join(docs) + "\n")
            tt.encode_ordinary_batch(docs[:50], num_threads=1)  # warm-up calls
            hf.encode_batch(docs[:50], add_special_tokens=False)
            keys = ["llmpi-prep (1 rank)", f"tiktoken {tiktoken.__version__} (1 thread)",
                    f"tokenizers {tokenizers.__version__} (1 thread)"]
            rates = {k: [] for k in keys}
            for _ in range(a.repeats):
                s = prep(build, a.gpt2, sample, os.path.join(work, "out-sample"), 1)
                rates[keys[0]].append(s["mb_per_s"])
                t0 = time.perf_counter()
                tt_ids = tt.encode_ordinary_batch(docs, num_threads=1)
                rates[keys[1]].append(text_mb / (time.perf_counter() - t0))
                t0 = time.perf_counter()
                hf_ids = [e.ids for e in hf.encode_batch(docs, add_special_tokens=False)]
                rates[keys[2]].append(text_mb / (time.perf_counter() - t0))
            speeds = {k: statistics.median(v) for k, v in rates.items()}
            # llmpi-prep's two streams hold every document once, each after an eot_id but the
            # first of each split: its token count is the ids' count + documents - 2.
            record["speed"].append({"text": name, "mb": text_mb, "documents": len(docs), "mb_per_s": speeds,
                                    "tiktoken_equals_tokenizers": tt_ids == hf_ids,
                                    "llmpi_token_count_equals": s["tokens"] == sum(len(x) for x in tt_ids) + len(docs) - 2})
            print(f"[3] {name}: " + ", ".join(f"{k} {v:.1f} MB/s" for k, v in speeds.items()), flush=True)

        # Report.
        print("\n| input | ranks | peak RSS / rank | tokenizing | whole run |")
        print("|---|---|---|---|---|")
        for s in record["rss"]:
            print(f"| {s['corpus']} | 1 | {s['peak_rss_mb']:.0f} MB | {s['tokenize_s']:.1f} s | {s['wall_s']:.1f} s |")
        if runs[1]:
            for n in (1, 2):
                m = med[n]
                print(f"| {max(sizes):g} MB generated | {n} | {m['peak_rss_mb']:.0f} MB | {m['tokenize_s']:.1f} s | "
                      f"{m['wall_s']:.1f} s |")
            r = record["ranks"]
            print(f"\n2 ranks / 1 rank: {r['speedup_wall']:.2f}x whole run, {r['speedup_tokenize']:.2f}x tokenizing; "
                  f"same data set: {r['same_manifest']} (train/val hashes {', '.join(r['manifest_hashes'])})")
        if record["speed"]:
            print("\n| text (one core, MB/s) | " + " | ".join(record["speed"][0]["mb_per_s"].keys()) + " | same ids |")
            print("|---|" + "---|" * (len(record["speed"][0]["mb_per_s"]) + 1))
        for x in record["speed"]:
            print(f"| {x['text']}, {x['mb']:.1f} MB, {x['documents']:,} documents | " +
                  " | ".join(f"{v:.1f}" for v in x["mb_per_s"].values()) +
                  f" | {x['tiktoken_equals_tokenizers'] and x['llmpi_token_count_equals']} |")
        out = a.out or os.path.join(a.build, "bench", "prep_scaling.json")
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        for n in (1, 2):
            for x in runs[n]:
                x.pop("manifest", None)
        record["ranks"]["runs"] = runs
        with open(out, "w") as f:
            json.dump(record, f, indent=1)
        print(f"\nwrote {out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
