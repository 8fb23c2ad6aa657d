"""Trains a byte-level BPE tokenizer and writes it in Hugging Face `tokenizers` format.

The format mirrors Qwen2/Qwen3's tokenizer.json:
  normalizer NFC; pre_tokenizer Sequence[Split(PATTERN, Isolated), ByteLevel(use_regex false)];
  model BPE over the GPT-2 byte-to-unicode alphabet (256 byte tokens, then one token per merge);
  post_processor and decoder ByteLevel; special tokens added after the BPE vocabulary.

Training is classic BPE: count the pre-tokenized words of the training documents (special-token
markup removed), then repeatedly merge the most frequent adjacent pair (ties: the smallest pair
in string order), updating only the words that contain it.

`BpeTokenizer` below is the encoder used by the training scripts; check_tokenizer.js compares its
ids with the Rust `tokenizers` library's.
Run: .venv/bin/python tools/train/train_tokenizer.py --corpus build/corpus --out models/NAME
"""

import argparse
import heapq
import json
import os
import unicodedata

import regex

# Qwen2's pre-tokenizer split: contractions, letter runs with one leading non-letter, single
# digits, punctuation runs, newline runs, and whitespace not followed by a non-space.
PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
           r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = ("{% for message in messages %}"
                 "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
                 "'<|im_end|>' + '\\n' }}"
                 "{% endfor %}"
                 "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")


def bytes_to_unicode():
    """GPT-2's reversible byte -> printable character map: printable Latin-1 bytes map to
    themselves, the other 68 bytes to U+0100 onwards in byte order."""
    keep = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) +
            list(range(ord("\u00ae"), ord("\u00ff") + 1)))
    mapping = {}
    extra = 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


BYTE_CHAR = bytes_to_unicode()
SPLIT_RE = regex.compile(PATTERN)
SPECIAL_RE = regex.compile("|".join(regex.escape(t) for t in SPECIAL_TOKENS))


def split_special(text):
    """Yields (is_special, piece) in order, as the added-token pass of `tokenizers` does."""
    pos = 0
    for m in SPECIAL_RE.finditer(text):
        if m.start() > pos:
            yield False, text[pos:m.start()]
        yield True, m.group(0)
        pos = m.end()
    if pos < len(text):
        yield False, text[pos:]


def pretokenize(text):
    """Normalized text -> byte-level words (strings over the BYTE_CHAR alphabet)."""
    for m in SPLIT_RE.finditer(text):
        yield "".join(BYTE_CHAR[b] for b in m.group(0).encode("utf-8"))


def train_bpe(word_counts, num_merges):
    """word_counts {word: count} -> list of merges [(a, b)] in creation order."""
    words = [list(w) for w in word_counts]
    counts = list(word_counts.values())
    pair_count = {}
    pair_where = {}
    for i, w in enumerate(words):
        for p in zip(w, w[1:]):
            pair_count[p] = pair_count.get(p, 0) + counts[i]
            pair_where.setdefault(p, set()).add(i)
    heap = [(-c, p) for p, c in pair_count.items()]
    heapq.heapify(heap)
    merges = []
    while len(merges) < num_merges and heap:
        neg, pair = heapq.heappop(heap)
        if pair_count.get(pair, 0) != -neg or neg == 0:
            continue  # stale entry; the current count was pushed again when it changed
        merges.append(pair)
        a, b = pair
        merged = a + b
        changed = set()
        for i in sorted(pair_where.pop(pair)):
            old = words[i]
            new = []
            j = 0
            while j < len(old):
                if j + 1 < len(old) and old[j] == a and old[j + 1] == b:
                    new.append(merged)
                    j += 2
                else:
                    new.append(old[j])
                    j += 1
            old_pairs = list(zip(old, old[1:]))
            new_pairs = list(zip(new, new[1:]))
            for p in old_pairs:
                pair_count[p] -= counts[i]
                changed.add(p)
            for p in new_pairs:
                pair_count[p] = pair_count.get(p, 0) + counts[i]
                changed.add(p)
            for p in set(old_pairs) - set(new_pairs):
                if p != pair:
                    pair_where[p].discard(i)
            for p in new_pairs:
                pair_where.setdefault(p, set()).add(i)
            words[i] = new
        pair_count.pop(pair, None)
        for p in changed:
            if p != pair and pair_count.get(p, 0) > 0:
                heapq.heappush(heap, (-pair_count[p], p))
    return merges


class BpeTokenizer:
    """Encodes like `tokenizers` does for the tokenizer.json written by this script."""

    def __init__(self, path):
        with open(path, encoding="utf-8") as f:
            tj = json.load(f)
        model = tj["model"]
        self.vocab = model["vocab"]
        merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m)
                  for m in model["merges"]]
        self.ranks = {p: r for r, p in enumerate(merges)}
        self.special = {t["content"]: t["id"] for t in tj["added_tokens"]}
        self.id_to_token = {i: t for t, i in self.vocab.items()}
        self.id_to_token.update({i: t for t, i in self.special.items()})
        self.char_byte = {c: b for b, c in BYTE_CHAR.items()}
        self.cache = {}

    def bpe(self, word):
        if word in self.cache:
            return self.cache[word]
        symbols = list(word)
        while len(symbols) > 1:
            best = min(zip(symbols, symbols[1:]), key=lambda p: self.ranks.get(p, 1 << 60))
            if best not in self.ranks:
                break
            out = []
            j = 0
            while j < len(symbols):
                if j + 1 < len(symbols) and (symbols[j], symbols[j + 1]) == best:
                    out.append(symbols[j] + symbols[j + 1])
                    j += 2
                else:
                    out.append(symbols[j])
                    j += 1
            symbols = out
        ids = [self.vocab[s] for s in symbols]
        self.cache[word] = ids
        return ids

    def encode(self, text):
        ids = []
        for is_special, piece in split_special(text):
            if is_special:
                ids.append(self.special[piece])
                continue
            for word in pretokenize(unicodedata.normalize("NFC", piece)):
                ids.extend(self.bpe(word))
        return ids

    def decode(self, ids):
        out = bytearray()
        text = []
        for i in ids:
            tok = self.id_to_token[i]
            if tok in self.special:
                text.append(out.decode("utf-8", errors="replace"))
                out = bytearray()
                text.append(tok)
            else:
                out.extend(self.char_byte[c] for c in tok)
        text.append(out.decode("utf-8", errors="replace"))
        return "".join(text)


def read_documents(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--corpus", default="build/corpus")
    ap.add_argument("--out", required=True)
    ap.add_argument("--vocab-size", type=int, default=4096)
    ap.add_argument("--model-max-length", type=int, default=256)
    args = ap.parse_args()

    word_counts = {}
    for doc in read_documents(os.path.join(args.corpus, "train.jsonl")):
        for is_special, piece in split_special(doc):
            if is_special:
                continue
            for word in pretokenize(unicodedata.normalize("NFC", piece)):
                word_counts[word] = word_counts.get(word, 0) + 1
    word_counts = dict(sorted(word_counts.items()))
    num_merges = args.vocab_size - 256 - len(SPECIAL_TOKENS)
    merges = train_bpe(word_counts, num_merges)
    assert len(merges) == num_merges, (len(merges), num_merges)

    vocab = {BYTE_CHAR[b]: b for b in range(256)}
    for a, b in merges:
        assert a + b not in vocab, (a, b)  # each merge makes a new token
        vocab[a + b] = len(vocab)
    added = [{
        "id": len(vocab) + k,
        "content": t,
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    } for k, t in enumerate(SPECIAL_TOKENS)]
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False,
                  "use_regex": False}
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": PATTERN}, "behavior": "Isolated",
                 "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": vocab,
            "merges": [f"{a} {b}" for a, b in merges],
        },
    }
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "tokenizer.json"), "w", encoding="utf-8") as f:
        json.dump(tokenizer, f, ensure_ascii=False, indent=1)
        f.write("\n")
    config = {
        "add_bos_token": False,
        "add_prefix_space": False,
        "added_tokens_decoder": {
            str(t["id"]): {k: v for k, v in t.items() if k not in ("id",)} for t in added
        },
        "additional_special_tokens": ["<|im_start|>", "<|im_end|>"],
        "bos_token": None,
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "eos_token": "<|endoftext|>",
        "errors": "replace",
        "model_max_length": args.model_max_length,
        "pad_token": "<|endoftext|>",
        "split_special_tokens": False,
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": None,
    }
    with open(os.path.join(args.out, "tokenizer_config.json"), "w", encoding="utf-8") as f:
        json.dump(config, f, ensure_ascii=False, indent=2)
        f.write("\n")

    total = sum(word_counts.values())
    tok = BpeTokenizer(os.path.join(args.out, "tokenizer.json"))
    tokens = sum(len(tok.bpe(w)) * c for w, c in word_counts.items())
    print(f"{len(word_counts)} distinct words, {total} words, {len(merges)} merges, "
          f"vocab {len(vocab) + len(added)}; train text -> {tokens} tokens")


if __name__ == "__main__":
    main()
