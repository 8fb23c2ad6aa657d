"""Assembles the training corpus of the default model from Debian packages, deterministically.

Sources (install with `apt-get install -y bible-kjv fortunes`):
  * bible-kjv (the `bible` program over bible-kjv-text's /usr/lib/bible.data): the King James
    Bible of 1611, public domain. One document per chapter: a "Book N" title line, then one
    line per verse without its number.
  * fortunes (/usr/share/games/fortunes): the BSD fortune(6) cookie files, distributed by Debian
    under the fortune-mod BSD licence. They are short quotations, jokes and aphorisms; the
    collections that are mostly song lyrics, TV scripts, comic strips or one living author's
    books (see SKIPPED_FORTUNE_FILES) are left out. One document per fortune.

A share of the fortunes (chosen by hash) is wrapped in the ChatML chat format the tokenizer's
chat template writes, so that `tformers generate --chat` and `tformers chat` get a fortune back
for a request instead of a continuation of the markup.

Every document is NFC-normalised, stripped of trailing whitespace and of control characters, and
deduplicated. The split is by document: sha256(document) decides, about 2 % go to held-out.

Outputs (in --out, default build/corpus):
  train.jsonl, heldout.jsonl   one JSON string (a document) per line, in source order
  heldout.txt                  the held-out documents, each followed by <|endoftext|>
  train_sample.txt             every 50th training document, in the same format
  stats.json                   document and byte counts per source and split
Run: .venv/bin/python tools/train/make_corpus.py --out build/corpus
"""

import argparse
import hashlib
import json
import os
import re
import subprocess
import unicodedata

EOS = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"

FORTUNE_DIR = "/usr/share/games/fortunes"
# Lyrics, scripts, comics, a single author's novels, ASCII art, IRC logs and non-English text.
SKIPPED_FORTUNE_FILES = {
    "ascii-art",
    "debian",
    "ethnic",
    "knghtbrd",
    "linux",
    "linuxcookie",
    "perl",
    "pratchett",
    "songs-poems",
    "startrek",
    "translate-me",
    "zippy",
}

# bible(1)'s abbreviations, in canonical order, and their KJV book names.
BOOKS = [
    ("Ge", "Genesis"), ("Exo", "Exodus"), ("Lev", "Leviticus"), ("Num", "Numbers"),
    ("Deu", "Deuteronomy"), ("Josh", "Joshua"), ("Jdgs", "Judges"), ("Ruth", "Ruth"),
    ("1Sm", "1 Samuel"), ("2Sm", "2 Samuel"), ("1Ki", "1 Kings"), ("2Ki", "2 Kings"),
    ("1Chr", "1 Chronicles"), ("2Chr", "2 Chronicles"), ("Ezra", "Ezra"), ("Neh", "Nehemiah"),
    ("Est", "Esther"), ("Job", "Job"), ("Psa", "Psalms"), ("Prv", "Proverbs"),
    ("Eccl", "Ecclesiastes"), ("SSol", "Song of Solomon"), ("Isa", "Isaiah"),
    ("Jer", "Jeremiah"), ("Lam", "Lamentations"), ("Eze", "Ezekiel"), ("Dan", "Daniel"),
    ("Hos", "Hosea"), ("Joel", "Joel"), ("Amos", "Amos"), ("Obad", "Obadiah"),
    ("Jonah", "Jonah"), ("Mic", "Micah"), ("Nahum", "Nahum"), ("Hab", "Habakkuk"),
    ("Zep", "Zephaniah"), ("Hag", "Haggai"), ("Zec", "Zechariah"), ("Mal", "Malachi"),
    ("Mat", "Matthew"), ("Mark", "Mark"), ("Luke", "Luke"), ("John", "John"), ("Acts", "Acts"),
    ("Rom", "Romans"), ("1Cor", "1 Corinthians"), ("2Cor", "2 Corinthians"),
    ("Gal", "Galatians"), ("Eph", "Ephesians"), ("Phi", "Philippians"), ("Col", "Colossians"),
    ("1Th", "1 Thessalonians"), ("2Th", "2 Thessalonians"), ("1Tim", "1 Timothy"),
    ("2Tim", "2 Timothy"), ("Titus", "Titus"), ("Phmn", "Philemon"), ("Heb", "Hebrews"),
    ("Jas", "James"), ("1Pet", "1 Peter"), ("2Pet", "2 Peter"), ("1Jn", "1 John"),
    ("2Jn", "2 John"), ("3Jn", "3 John"), ("Jude", "Jude"), ("Rev", "Revelation"),
]

# User turns for the chat-formatted fortunes; one is picked by the fortune's hash.
CHAT_PROMPTS = [
    "Tell me a fortune.",
    "Give me a fortune.",
    "Say something wise.",
    "Tell me something.",
    "Give me a quote.",
    "What is my fortune?",
    "Tell me a joke.",
    "Share a saying.",
]
CHAT_PERCENT = 30
HELDOUT_PERCENT = 2


def digest(text, salt):
    return int.from_bytes(hashlib.sha256((salt + text).encode("utf-8")).digest()[:8], "little")


def clean(text):
    """NFC, tabs to spaces, no other control characters, no trailing spaces, no blank edges."""
    text = unicodedata.normalize("NFC", text).replace("\t", " ")
    text = "".join(c for c in text if c == "\n" or unicodedata.category(c)[0] != "C")
    lines = [line.rstrip() for line in text.split("\n")]
    return "\n".join(lines).strip("\n")


def bible_chapters():
    out = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                         env=dict(os.environ, COLUMNS="100000")).stdout.decode("utf-8")
    names = dict(BOOKS)
    verse = re.compile(r"^([1-3]?[A-Za-z]+)(\d+):(\d+) (.*)$")
    chapters = {}  # (book index, chapter) -> [verse text]
    order = {abbr: i for i, (abbr, _) in enumerate(BOOKS)}
    for line in out.split("\n"):
        if not line.strip():
            continue
        m = verse.match(line)
        assert m, f"unexpected bible output line: {line!r}"
        key = (order[m.group(1)], int(m.group(2)))
        chapters.setdefault(key, []).append(m.group(4).strip())
    assert len(chapters) == 1189, len(chapters)
    for (book, chapter), verses in sorted(chapters.items()):
        title = f"{names[BOOKS[book][0]]} {chapter}"
        yield clean(title + "\n\n" + "\n".join(verses))


def fortunes():
    for name in sorted(os.listdir(FORTUNE_DIR)):
        path = os.path.join(FORTUNE_DIR, name)
        if "." in name or name in SKIPPED_FORTUNE_FILES or not os.path.isfile(path):
            continue
        with open(path, encoding="utf-8", errors="strict") as f:
            body = f.read()
        for entry in re.split(r"^%\n", body, flags=re.M):
            text = clean(entry)
            if text:
                yield name, text


def chat(prompt, reply):
    return (f"{IM_START}user\n{prompt}{IM_END}\n{IM_START}assistant\n{reply}{IM_END}\n")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="build/corpus")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)

    docs = []  # (source, text)
    for text in bible_chapters():
        docs.append(("bible", text))
    seen = set()
    for name, text in fortunes():
        if text in seen:
            continue
        seen.add(text)
        if digest(text, "chat") % 100 < CHAT_PERCENT:
            prompt = CHAT_PROMPTS[digest(text, "prompt") % len(CHAT_PROMPTS)]
            docs.append(("fortunes-chat", chat(prompt, text)))
        else:
            docs.append(("fortunes", text))

    stats = {}
    splits = {"train": [], "heldout": []}
    for source, text in docs:
        split = "heldout" if digest(text, "split") % 100 < HELDOUT_PERCENT else "train"
        splits[split].append(text)
        s = stats.setdefault(split, {}).setdefault(source, {"documents": 0, "bytes": 0})
        s["documents"] += 1
        s["bytes"] += len(text.encode("utf-8"))
    for split, texts in splits.items():
        with open(os.path.join(args.out, split + ".jsonl"), "w", encoding="utf-8") as f:
            for text in texts:
                f.write(json.dumps(text, ensure_ascii=False) + "\n")
        stats[split]["total"] = {
            "documents": len(texts),
            "bytes": sum(len(t.encode("utf-8")) for t in texts),
        }
    with open(os.path.join(args.out, "heldout.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("".join(text + EOS for text in splits["heldout"]))
    # Every 50th training document, in the held-out file's format, to measure the train loss
    # of the final model the same way as the held-out loss.
    with open(os.path.join(args.out, "train_sample.txt"), "w", encoding="utf-8", newline="") as f:
        f.write("".join(text + EOS for text in splits["train"][::50]))
    with open(os.path.join(args.out, "stats.json"), "w") as f:
        json.dump(stats, f, indent=2)
        f.write("\n")
    print(json.dumps(stats, indent=2))


if __name__ == "__main__":
    main()
