"""Checks that BpeTokenizer (train_tokenizer.py) and the Rust `tokenizers` library agree.

Encodes the held-out text (whole, and document by document), some training documents and a set
of edge cases (digits, contractions, whitespace runs, non-ASCII, special-token markup) with the
Python encoder, then has check_tokenizer.js encode the same texts with the Rust library and compare
ids and decoded text. Exit status 0 only when every case is identical.
Run: .venv/bin/python tools/train/check_tokenizer.py --model models/NAME --corpus build/corpus
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from train_tokenizer import BpeTokenizer, read_documents  # noqa: E402

EDGE_CASES = [
    "",
    " ",
    "Hello, world!",
    "In the year 1611, 12345 copies; 3.14159 and -42.",
    "I'm sure you're right, he'll say they've done what we'd DON'T and I'LL.",
    "tabs\tand  double  spaces   and trailing   ",
    "line\n\nbreaks\r\nand\n   indented\n\n\n",
    "caf\u00e9 na\u0131\u0308ve \u00fcber \u2014 \u201cquoted\u201d \u2026 \u65e5\u672c\u8a9e \U0001F600",
    "e\u0301 (decomposed e-acute, NFC composes it)",
    "<|im_start|>user\nTell me a fortune.<|im_end|>\n<|im_start|>assistant\n",
    "text<|endoftext|>more<|im_end|><|im_start|>",
    "<|endoftext",
    "!!!??? ... --- ''' \"\"\" ```",
    "zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz qwxjk",
]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--node-modules", default="/work/main/tools/npm/node_modules")
    args = ap.parse_args()
    path = os.path.join(args.model, "tokenizer.json")
    tok = BpeTokenizer(path)

    with open(os.path.join(args.corpus, "heldout.txt"), encoding="utf-8") as f:
        texts = [f.read()]
    texts += read_documents(os.path.join(args.corpus, "heldout.jsonl"))
    texts += read_documents(os.path.join(args.corpus, "train.jsonl"))[::50]
    texts += EDGE_CASES
    cases = []
    for text in texts:
        ids = tok.encode(text)
        cases.append({"text": text, "ids": ids, "decoded": tok.decode(ids)})
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(cases, f)
    try:
        r = subprocess.run(["node", os.path.join(here, "check_tokenizer.js"), path, f.name,
                            args.node_modules])
    finally:
        os.unlink(f.name)
    sys.exit(r.returncode)


if __name__ == "__main__":
    main()
