#!/usr/bin/env python3
"""Writes a byte-level BPE tokenizer.json (and tokenizer_config.json) with exactly 512 ids for the
tiny test models, so text prompts, streaming and stop strings can be tested end to end with them.

Ids 0-255 are the 256 byte symbols of the GPT-2 byte-to-unicode alphabet; ids 256-509 are merges
of frequent English letter pairs and of a space with each letter; 510 and 511 are the special
tokens <|endoftext|> and <|im_end|>. Deterministic: the output depends on nothing but this file.

    python3 tools/reference/make_tiny_tokenizer.py tests/data/models/tiny-qwen3
"""
import json
import os
import sys


def byte_alphabet():
    # GPT-2's reversible mapping of bytes to printable unicode characters.
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    chars = {}
    extra = 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def main(out_dir):
    alphabet = byte_alphabet()
    vocab = {alphabet[b]: b for b in range(256)}
    merges = []
    space = alphabet[ord(" ")]
    letters = "etaoinshrdlucmfwypvbgkjqxz"
    pairs = [(space, c) for c in letters]
    pairs += [(a, b) for a in "etaoinshrd" for b in "etaoinshrdlucm"]
    pairs += [(a, b) for a in "lucmfwypvbg" for b in "etaoinsh"]
    for a, b in pairs:
        if len(vocab) == 510:
            break
        merged = a + b
        if merged in vocab:
            continue
        vocab[merged] = len(vocab)
        merges.append(f"{a} {b}")
    assert len(vocab) == 510, len(vocab)
    specials = ["<|endoftext|>", "<|im_end|>"]
    added = [{"id": 510 + i, "content": s, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, s in enumerate(specials)]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                          "use_regex": True},
        "post_processor": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                           "use_regex": True},
        "decoder": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True,
                    "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None,
                  "continuing_subword_prefix": None, "end_of_word_suffix": None,
                  "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": vocab, "merges": merges},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "model_max_length": 512,
        "clean_up_tokenization_spaces": False,
        "chat_template": "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}<|im_end|>\n"
                         "{% endfor %}{% if add_generation_prompt %}assistant:{% endif %}",
    }
    with open(os.path.join(out_dir, "tokenizer.json"), "w") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
    with open(os.path.join(out_dir, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, ensure_ascii=False, indent=1)


if __name__ == "__main__":
    main(sys.argv[1])
