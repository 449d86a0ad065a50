"""The model part of tools/make_hf_fixtures.py: tiny random Hugging Face models and what
transformers computes with them, recorded for llmpi's tests (tests/test_hf_import.cpp).

Needs (pip): torch, transformers, safetensors, numpy.

For each family under OUT/<family>/:
  config.json, model.safetensors   the model, saved by transformers' save_pretrained
  expected.safetensors             what transformers computes for the inputs in fixture.json
                                   (float32): "logits" (gpt2, llama: [B, T, V]; bert: [B, labels]),
                                   "last_hidden" ([B, T, C]; bert only)
  fixture.json                     inputs (input_ids, and for bert token_type_ids and
                                   attention_mask), greedy generations (gpt2, llama), the
                                   smallest top-1/top-2 logit margin met while generating (how
                                   safe an exact comparison is), and versions
Weights are drawn N(0, 0.2) (norm weights 1 + N(0, 0.1)) rather than the usual 0.02, so logits
are spread out and an exact greedy comparison does not hinge on near-ties.
"""
import json
import os

import numpy as np
import torch
from safetensors.torch import save_file

VOCAB = 320  # > 257, so byte-tokenized data (llmpi-prep --tokenizer byte) fits: tests/cli/hf_weights.sh
SEQ = 16
BATCH = 2


def _randomise(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name.lower() or name.endswith(("ln_1.weight", "ln_2.weight", "ln_f.weight")):
                if name.endswith("weight"):
                    p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))
                    continue
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return model


def build_gpt2(seed=1):
    from transformers import GPT2Config, GPT2LMHeadModel
    cfg = GPT2Config(vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=4, n_inner=None,
                     activation_function="gelu_new", resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
                     layer_norm_epsilon=1e-5, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                     pad_token_id=None)
    torch.manual_seed(seed)
    return _randomise(GPT2LMHeadModel(cfg), seed).eval()


def build_llama(seed=2):
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                      rms_norm_eps=1e-5, rope_theta=10000.0, tie_word_embeddings=False, hidden_act="silu",
                      attention_bias=False, mlp_bias=False, bos_token_id=None, eos_token_id=None,
                      pad_token_id=None)
    torch.manual_seed(seed)
    return _randomise(LlamaForCausalLM(cfg), seed).eval()


def build_bert(seed=3):
    from transformers import BertConfig, BertForSequenceClassification
    cfg = BertConfig(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                     intermediate_size=64, hidden_act="gelu", max_position_embeddings=64, type_vocab_size=2,
                     layer_norm_eps=1e-12, num_labels=3, hidden_dropout_prob=0.0,
                     attention_probs_dropout_prob=0.0, pad_token_id=0)
    torch.manual_seed(seed)
    return _randomise(BertForSequenceClassification(cfg), seed).eval()


BUILDERS = {"gpt2": build_gpt2, "llama": build_llama, "bert": build_bert}


def fixed_inputs(family, seed=7):
    """Token ids [B, T] (and for bert, token types and an attention mask with padding)."""
    rng = np.random.default_rng(seed)
    ids = rng.integers(1, VOCAB, size=(BATCH, SEQ)).tolist()
    out = {"input_ids": ids}
    if family == "bert":
        lengths = [SEQ, SEQ - 5]  # the second sequence is padded
        types, mask = [], []
        for b, n in enumerate(lengths):
            first = n // 2
            types.append([0] * first + [1] * (n - first) + [0] * (SEQ - n))
            mask.append([1] * n + [0] * (SEQ - n))
            for t in range(n, SEQ):
                ids[b][t] = 0
        out["token_type_ids"] = types
        out["attention_mask"] = mask
    return out


def compute(model, family, inputs):
    """What transformers computes: {"logits": ..., ["last_hidden": ...]} as float32 tensors."""
    with torch.no_grad():
        ids = torch.tensor(inputs["input_ids"])
        if family == "bert":
            out = model(input_ids=ids, token_type_ids=torch.tensor(inputs["token_type_ids"]),
                        attention_mask=torch.tensor(inputs["attention_mask"]), output_hidden_states=True)
            return {"logits": out.logits.float().contiguous(),
                    "last_hidden": out.hidden_states[-1].float().contiguous()}
        out = model(input_ids=ids)
        return {"logits": out.logits.float().contiguous()}


def greedy(model, prompt, n_new=20):
    """Greedy continuation (argmax at every step, full recompute), and the smallest gap between
    the best and second-best logit along the way."""
    ids = list(prompt)
    margin = float("inf")
    with torch.no_grad():
        for _ in range(n_new):
            logits = model(input_ids=torch.tensor([ids])).logits[0, -1]
            top2 = torch.topk(logits, 2).values
            margin = min(margin, float(top2[0] - top2[1]))
            ids.append(int(torch.argmax(logits)))
    return ids[len(prompt):], margin


def generate_with_transformers(model, prompt, n_new=20):
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=n_new, do_sample=False, num_beams=1,
                             pad_token_id=0)
    return out[0, len(prompt):].tolist()


def write_family(family, out_root):
    import transformers
    model = BUILDERS[family]()
    d = os.path.join(out_root, family)
    os.makedirs(d, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    inputs = fixed_inputs(family)
    expected = compute(model, family, inputs)
    save_file(expected, os.path.join(d, "expected.safetensors"))
    fixture = {"family": family, "architecture": type(model).__name__, "inputs": inputs,
               "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    if family in ("gpt2", "llama"):
        gens = []
        for prompt in ([1, 2, 3, 4], [200, 17, 99, 5, 42, 7, 123, 250]):
            ours, margin = greedy(model, prompt)
            theirs = generate_with_transformers(model, prompt)
            assert ours == theirs, f"{family}: the greedy loop and generate() disagree: {ours} vs {theirs}"
            gens.append({"prompt": prompt, "greedy_20": theirs, "min_top2_margin": margin})
        fixture["generations"] = gens
    with open(os.path.join(d, "fixture.json"), "w") as f:
        json.dump(fixture, f, indent=1)
    return model, inputs, expected


def load_and_compare(export_dir, family, inputs, expected):
    """Load an llmpi export with transformers, capturing every warning, and compare its outputs.
    Returns a dict for roundtrip.json."""
    import logging
    import warnings

    import transformers
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    records = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Keep()
    tlog = transformers.logging.get_logger("transformers")
    tlog.addHandler(handler)
    transformers.logging.set_verbosity_warning()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            cls = AutoModelForSequenceClassification if family == "bert" else AutoModelForCausalLM
            model, info = cls.from_pretrained(export_dir, output_loading_info=True)
    finally:
        tlog.removeHandler(handler)
    model.eval()
    got = compute(model, family, inputs)
    rel = {}
    for k, v in expected.items():
        rel[k] = float((got[k] - v).abs().max() / v.abs().max())
    problems = {k: [str(x) for x in v] for k, v in info.items() if v}
    return {"family": family, "architecture": type(model).__name__,
            "loading_problems": problems,
            "warnings": records + [str(w.message) for w in caught],
            "max_rel_diff": rel,
            "ok": not problems and not records and not caught and all(r <= 1e-5 for r in rel.values())}
