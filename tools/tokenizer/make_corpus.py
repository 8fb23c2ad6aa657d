#!/usr/bin/env python3
"""Builds the tokenizer parity corpus: >= 1 MB of mixed text split into documents, written as a
JSON array of base64 strings (base64 because a few documents are deliberately invalid UTF-8).

Kinds of text: English prose, C source, CJK, Arabic, other scripts and combining marks, emoji and
ZWJ sequences, whitespace runs, long digit runs, special-token strings (whole and broken), rare,
private-use and unassigned code points and controls, mixed documents, invalid UTF-8, a few
edge cases (the empty string, a lone space, ...) and characters assigned after Unicode 14.

Deterministic: a seeded PRNG (mulberry32) plus files read in sorted order from
/usr/share/common-licenses and /usr/include (when absent, synthesized prose and code take their
place). The output is byte for byte the corpus of tools/tokenizer/make_corpus.js, which
bench/bench_tokenizer.cc still runs, so benchmark and tests measure the same text: lengths,
slices and the "do not cut a surrogate pair" rule therefore count UTF-16 code units, as
JavaScript strings do. Text is held here as a Python str of UTF-16 code units (a character
outside the BMP is two surrogate code points), and a lone surrogate left by a cut becomes U+FFFD
when a document is written as UTF-8, as node's Buffer.from does.

  .venv/bin/python tools/tokenizer/make_corpus.py OUT.json
"""
import array
import base64
import json
import os
import stat
import sys

MASK = 0xFFFFFFFF


class Rng:
    """mulberry32 on unsigned 32-bit words; same sequence as the JavaScript original."""

    def __init__(self, seed):
        self.seed = seed & MASK

    def rand(self):
        self.seed = (self.seed + 0x6D2B79F5) & MASK
        s = self.seed
        t = ((s ^ (s >> 15)) * (1 | s)) & MASK
        t = ((t + (((t ^ (t >> 7)) * (61 | t)) & MASK)) & MASK) ^ t
        return ((t ^ (t >> 14)) & MASK) / 4294967296.0

    def ri(self, a, b):
        return a + int(self.rand() * (b - a + 1))

    def pick(self, seq):
        return seq[int(self.rand() * len(seq))]


def u16(text):
    """A str as UTF-16 code units, one Python character per unit."""
    return "".join(map(chr, array.array("H", text.encode("utf-16-le"))))


def utf8(units):
    """UTF-8 bytes of a str of UTF-16 code units; lone surrogates become U+FFFD."""
    return units.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "replace").encode()


def is_high(unit):
    return "\ud800" <= unit <= "\udbff"


def is_low(unit):
    return "\udc00" <= unit <= "\udfff"


rng = Rng(0x7F4A7C15)
ri, pick = rng.ri, rng.pick


def cp(c):
    return u16(chr(c))


def rand_range(lo, hi):
    return cp(ri(lo, hi))


docs = []  # bytes


def add_text(units):
    docs.append(utf8(units))


def chunks(text, lo, hi):
    out = []
    i = 0
    while i < len(text):
        end = min(len(text), i + ri(lo, hi))
        if end < len(text) and is_high(text[end - 1]):  # do not cut a surrogate pair
            end += 1
        out.append(text[i:end])
        i = end
    return out


def read_sorted(directory, keep, limit):
    """Texts of the regular files (<= 200 kB) of `directory` in name order, up to `limit` units."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return []
    out, total = [], 0
    for name in names:
        if not keep(name):
            continue
        p = os.path.join(directory, name)
        try:
            st = os.stat(p)
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or st.st_size > 200000:
            continue
        with open(p, "rb") as f:
            t = u16(f.read().decode("utf-8", errors="replace"))
        out.append(t)
        total += len(t)
        if total >= limit:
            break
    return out


def synth(gen, n, size):
    for _ in range(n):
        s = ""
        while len(s) < size:
            s += gen()
        add_text(s)


# 1. English prose.
words = ("the of and to in is that for it as was with be by on not he I this are or his from at "
         "which but have an they you were her she there been one all we their has would when if "
         "so what bread law states French government Freedom license software copyright "
         "distribute modify don't can't it's we're they've I'm you'll he'd WHATEVER Program "
         "Source Code").split(" ")
prose = read_sorted("/usr/share/common-licenses", lambda n: True, 450000)
if sum(map(len, prose)) < 300000:
    for _ in range(3000):
        s = ""
        for w in range(60):
            s += (" " if w else "") + pick(words)
            if rng.rand() < 0.1:
                s += pick([",", ".", ";", "!", "?"])
        prose.append(s + "\n\n")
for t in prose:
    for c in chunks(t, 1500, 4000):
        add_text(c)

# 2. Source code.
code = read_sorted("/usr/include", lambda n: n.endswith(".h"), 300000)
if sum(map(len, code)) < 100000:
    for k in range(2000):
        code.append("static inline int f%d(int x) {\n\treturn x * %d + 0x%x;\n}\n" % (k, k, k))
for t in code:
    for c in chunks(t, 1500, 4000):
        add_text(c)


# 3. CJK, 4. Arabic, and other scripts.
def gen_cjk():
    r = rng.rand()
    if r < 0.5:
        return rand_range(0x4E00, 0x9FA5)
    if r < 0.6:
        return rand_range(0x3041, 0x3096)
    if r < 0.7:
        return rand_range(0x30A1, 0x30FA)
    if r < 0.8:
        return rand_range(0xAC00, 0xD7A3)
    if r < 0.85:
        return pick(["。", "，", "、", "「", "」", "！", "？", " ", "\n", "（", "）"])
    if r < 0.9:
        return pick(["ＡＢＣ", "１２３", "ｶﾀｶﾅ", "㍿", "①"])
    return pick([" the ", "GPU", "2024年", "東京", "中文 English mix "])


def gen_arabic():
    r = rng.rand()
    if r < 0.8:
        return rand_range(0x0621, 0x064A)
    if r < 0.85:
        return rand_range(0x064B, 0x0652)  # harakat
    if r < 0.9:
        return rand_range(0x0660, 0x0669)
    if r < 0.97:
        return " "
    return pick(["، ", "؟", "\n", "ﷺ", "ﻻ"])


def gen_scripts():
    r = rng.rand()
    if r < 0.2:
        return rand_range(0x0410, 0x044F)
    if r < 0.35:
        return rand_range(0x0391, 0x03C9)
    if r < 0.5:
        consonant = rand_range(0x0905, 0x0939)
        return consonant + (rand_range(0x093E, 0x094D) if rng.rand() < 0.5 else "")
    if r < 0.6:
        return rand_range(0x0E01, 0x0E30)
    if r < 0.7:
        return rand_range(0x05D0, 0x05EA)
    if r < 0.8:
        # Decomposed accents, the Angstrom sign, ligatures, conjoining jamo, super/fractions:
        # what the NFC/NFKC/NFKD normalizers change.
        return "e\u0301a\u0300o\u0308A\u030A\u212B\uFB01\u1100\u1161\u11A8ﬀ²½"
    if r < 0.9:
        return " "
    return pick(["İstanbul ", "ß ", "Ǆ ", "ﬃ ", "\u00C5", "\u0130", "ǅungla "])


synth(gen_cjk, 60, 1500)
synth(gen_arabic, 40, 1500)
synth(gen_scripts, 40, 1500)

# 5. Emoji and ZWJ sequences.
emoji = [u16(e) for e in [
    "😀", "👍", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "🇫🇷", "🇯🇵", "❤️", "🧑🏿‍💻", "1️⃣", "#️⃣", "🫠", "🤷‍♀️",
    "👩🏻‍❤️‍💋‍👨🏼", "🐈‍⬛", "🏴󠁧󠁢󠁳󠁣󠁴󠁿", "✍🏾", "☺", "\u200D", "\uFE0F"]]
synth(lambda: pick(emoji) if rng.rand() < 0.7 else pick([" ", "ok ", "\n", "lol", "!!"]), 40, 1200)

# 6. Whitespace runs: every Unicode space, line and paragraph separator, and a few that are not
# White_Space (U+200B, U+180E) though they look it.
spaces = [" ", "  ", "\t", "\n", "\r\n", "\u00A0", "\u3000", "\u0085", "\u2028", "\u2029",
          "\u200B", "\u2003", "\u000B", "\u000C", "\u1680", "\u202F", "\u205F", "\u180E"]


def gen_spaces():
    if rng.rand() < 0.5:
        s = ""
        n = ri(1, 40)
        kind = pick(spaces)
        for _ in range(n):
            s += kind if rng.rand() < 0.8 else pick(spaces)
        return s
    w = pick(words)
    return w + (pick(words) if rng.rand() < 0.3 else "")


synth(gen_spaces, 60, 1500)


# 7. Long digit runs (ASCII, Arabic-Indic, fullwidth) and numbers with exponents.
def gen_digits():
    r = rng.rand()
    s = ""
    n = ri(1, 300)
    if r < 0.7:
        for _ in range(n):
            s += str(ri(0, 9))
    elif r < 0.8:
        for _ in range(n):
            s += rand_range(0x0660, 0x0669)
    elif r < 0.9:
        for _ in range(n):
            s += rand_range(0xFF10, 0xFF19)
    else:
        a = ri(0, 99999)
        b = ri(0, 999)
        s = "%d.%de-%d" % (a, b, ri(1, 30))
    return s + pick([" ", ",", "\n", "px ", "%", " + ", ""])


synth(gen_digits, 40, 1500)

# 8. Special-token strings inside text (every tokenizer's, whole and broken).
specials = [
    "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
    "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|eot_id|>",
    "<|reserved_special_token_5|>", "<s>", "</s>", "<unk>", "<bos>", "<eos>", "<pad>",
    "<start_of_turn>", "<end_of_turn>", "<unused7>", "<mask>", "<table>", "</td>",
    "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>", "<｜User｜>", "<｜Assistant｜>",
    "<｜tool▁sep｜>", "<0x41>", "▁▁", "\t\t\t", "\n\n\n", "<|im_st", "im_end|>", "<<s>>",
    "<|fim_prefix|>", "[multimodal]", "<image_soft_token>"]


def gen_specials():
    r = rng.rand()
    if r < 0.35:
        return pick(specials)
    if r < 0.5:
        return " " + pick(specials) + " "
    if r < 0.6:
        return "\n" + pick(specials) + "\n"
    w = pick(words)
    return w + pick([" ", "", "\n", "  "])


synth(gen_specials, 60, 1500)


# 9. Rare, private-use, unassigned code points and control characters. Only code points that are
# unassigned up to Unicode 16 are used as "unassigned": the regex engines' Unicode versions differ
# (PCRE2 10.42 knows Unicode 14), so a character assigned later has different classes there.
def gen_rare():
    r = rng.rand()
    if r < 0.15:
        return pick(["\u0378", "\u0530", "\u05FF", "\uFFF0", "\u0AF2", "\uFFFE", "\uFFFF",
                     "\uFDD0"])
    if r < 0.3:
        return rand_range(0xE000, 0xF8FF)
    if r < 0.4:
        return rand_range(0xF0000, 0xF00FF)
    if r < 0.5:
        return pick([cp(c) for c in (0x10FFFF, 0x1FFFF, 0x2FFFE, 0xE0001, 0x1D11E, 0x1F8FF,
                                     0x3134F)])
    if r < 0.6:
        return rand_range(0x0000, 0x001F)
    if r < 0.65:
        return "\u007F\u0080\u009F"
    if r < 0.75:
        return rand_range(0x20000, 0x2A6DF)  # CJK extension B
    if r < 0.85:
        return rand_range(0x1D400, 0x1D7FF)  # math alphanumerics (NFKC-sensitive)
    return pick(words) + " "


synth(gen_rare, 40, 1200)

# 10. Mixed documents: pieces of the others interleaved. A piece cut inside a surrogate pair loses
# the orphaned half at its edge.
pool = list(docs)
for _ in range(60):
    parts = []
    for _ in range(6):
        b = u16(pick(pool).decode("utf-8"))
        s = ri(0, max(0, len(b) - 200))
        piece = b[s:s + ri(20, 400)]
        if piece and is_low(piece[0]):
            piece = piece[1:]
        if piece and is_high(piece[-1]):
            piece = piece[:-1]
        parts.append(piece)
    add_text(pick([" ", "", "\n", "<|im_end|>", "  "]).join(parts))

# 11. Invalid UTF-8 byte sequences (encode must repair them as the reference does): a stray
# continuation byte, truncated sequences, a surrogate, overlongs, beyond U+10FFFF, 0xFF/0xFE.
invalid = [
    [0x61, 0x80, 0x62], [0xC3], [0xE2, 0x82], [0xF0, 0x9F, 0x98], [0xED, 0xA0, 0x80],
    [0xC0, 0xAF], [0xF5, 0x80, 0x80, 0x80], [0xFF, 0xFE, 0x41], [0xE0, 0x80, 0x80],
    [0xF4, 0x90, 0x80, 0x80], [0x20, 0xC3, 0x28, 0x20], [0xF0, 0x9F, 0x98, 0x80, 0x80],
]
for _ in range(30):
    parts = []
    for _ in range(40):
        w = pick(words)
        parts.append(utf8(w + pick([" ", "", "\n"])))
        if rng.rand() < 0.4:
            parts.append(bytes(pick(invalid)))
    docs.append(b"".join(parts))

# Edge cases.
for s in ["", " ", "  ", "\n", "a", "The French Bread Law states", " Hello", "Hello world",
          "I'm here, aren't you? WE'LL SEE'S",
          "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"]:
    add_text(s)


# 12. Characters assigned after Unicode 14 (15 and 16), which PCRE2 10.42 takes for unassigned:
# letters, digits, marks and symbols next to the contraction, space and digit rules.
newer = [(0x11F00, 0x11F59), (0x1E4D0, 0x1E4F9), (0x31350, 0x323AF), (0x2EBF0, 0x2EE5D),
         (0x10D40, 0x10D8F), (0x105C0, 0x105F3), (0x11BC0, 0x11BF9), (0x16100, 0x16139),
         (0x16D40, 0x16D79), (0x1E5D0, 0x1E5FF), (0x11380, 0x113E2), (0x1CC00, 0x1CEB3),
         (0x13460, 0x143FA), (0x1FA70, 0x1FAFF), (0x0897, 0x0897), (0x1C89, 0x1C8A),
         (0xA7CB, 0xA7DC)]


def gen_newer():
    if rng.rand() < 0.6:
        return rand_range(*pick(newer))
    return pick([" ", "'s", "'ll", "1", "42", "a", "The", "  ", "\n", ".", "-"])


synth(gen_newer, 20, 1200)

total = sum(map(len, docs))
if total < 1 << 20:
    sys.exit("make_corpus.py: corpus too small: %d bytes" % total)
if len(sys.argv) != 2:
    sys.exit("usage: make_corpus.py OUT.json")
with open(sys.argv[1], "w", encoding="ascii") as f:
    f.write(json.dumps([base64.b64encode(d).decode("ascii") for d in docs], separators=(",", ":")))
print("corpus: %d documents, %d bytes -> %s" % (len(docs), total, sys.argv[1]), file=sys.stderr)
