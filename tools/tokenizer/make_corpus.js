#!/usr/bin/env node
// Builds the tokenizer parity corpus: >= 1 MB of mixed text split into documents, written as a
// JSON array of base64 strings (base64 because a few documents are deliberately invalid UTF-8).
// Deterministic: a seeded PRNG plus files read in sorted order from /usr/share/common-licenses
// and /usr/include (when absent, synthesized prose and code take their place).
//   node tools/tokenizer/make_corpus.js OUT.json
'use strict';
const fs = require('fs');
const path = require('path');

let seed = 0x7f4a7c15;
function rand() {  // mulberry32
  seed |= 0; seed = (seed + 0x6D2B79F5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (a, b) => a + Math.floor(rand() * (b - a + 1));
const pick = (arr) => arr[Math.floor(rand() * arr.length)];
const cp = (c) => String.fromCodePoint(c);
const randRange = (lo, hi) => cp(ri(lo, hi));

const docs = [];  // Buffers
const addText = (s) => docs.push(Buffer.from(s, 'utf8'));

function chunks(text, min, max) {
  const out = [];
  let i = 0;
  while (i < text.length) {
    let n = ri(min, max);
    let end = Math.min(text.length, i + n);
    // do not cut a surrogate pair
    if (end < text.length && /[\uD800-\uDBFF]/.test(text[end - 1])) end++;
    out.push(text.slice(i, end));
    i = end;
  }
  return out;
}

function readSorted(dir, filter, limitBytes) {
  let total = 0;
  const out = [];
  let names = [];
  try { names = fs.readdirSync(dir).sort(); } catch (e) { return out; }
  for (const n of names) {
    if (!filter(n)) continue;
    const p = path.join(dir, n);
    let st;
    try { st = fs.statSync(p); } catch (e) { continue; }
    if (!st.isFile() || st.size > 200000) continue;
    const t = fs.readFileSync(p, 'utf8');
    out.push(t);
    total += t.length;
    if (total >= limitBytes) break;
  }
  return out;
}

// 1. English prose.
const words = ('the of and to in is that for it as was with be by on not he I this are or his from at ' +
  'which but have an they you were her she there been one all we their has would when if so what ' +
  'bread law states French government Freedom license software copyright distribute modify ' +
  "don't can't it's we're they've I'm you'll he'd WHATEVER Program Source Code").split(' ');
let prose = readSorted('/usr/share/common-licenses', () => true, 450000);
if (prose.join('').length < 300000) {
  for (let k = 0; k < 3000; k++) {
    let s = '';
    for (let w = 0; w < 60; w++) s += (w ? ' ' : '') + pick(words) + (rand() < 0.1 ? pick([',', '.', ';', '!', '?']) : '');
    prose.push(s + '\n\n');
  }
}
for (const t of prose) for (const c of chunks(t, 1500, 4000)) addText(c);

// 2. Source code.
let code = readSorted('/usr/include', (n) => n.endsWith('.h'), 300000);
if (code.join('').length < 100000) {
  for (let k = 0; k < 2000; k++) code.push(`static inline int f${k}(int x) {\n\treturn x * ${k} + 0x${k.toString(16)};\n}\n`);
}
for (const t of code) for (const c of chunks(t, 1500, 4000)) addText(c);

// 3. CJK, 4. Arabic, and other scripts.
function synth(gen, n, size) {
  for (let d = 0; d < n; d++) {
    let s = '';
    while (s.length < size) s += gen();
    addText(s);
  }
}
synth(() => {
  const r = rand();
  if (r < 0.5) return randRange(0x4E00, 0x9FA5);
  if (r < 0.6) return randRange(0x3041, 0x3096);
  if (r < 0.7) return randRange(0x30A1, 0x30FA);
  if (r < 0.8) return randRange(0xAC00, 0xD7A3);
  if (r < 0.85) return pick(['。', '，', '、', '「', '」', '！', '？', ' ', '\n', '（', '）']);
  if (r < 0.9) return pick(['ＡＢＣ', '１２３', 'ｶﾀｶﾅ', '㍿', '①']);
  return pick([' the ', 'GPU', '2024年', '東京', '中文 English mix ']);
}, 60, 1500);
synth(() => {
  const r = rand();
  if (r < 0.8) return randRange(0x0621, 0x064A);
  if (r < 0.85) return randRange(0x064B, 0x0652);  // harakat
  if (r < 0.9) return randRange(0x0660, 0x0669);
  if (r < 0.97) return ' ';
  return pick(['، ', '؟', '\n', 'ﷺ', 'ﻻ']);
}, 40, 1500);
synth(() => {
  const r = rand();
  if (r < 0.2) return randRange(0x0410, 0x044F);
  if (r < 0.35) return randRange(0x0391, 0x03C9);
  if (r < 0.5) return randRange(0x0905, 0x0939) + (rand() < 0.5 ? randRange(0x093E, 0x094D) : '');
  if (r < 0.6) return randRange(0x0E01, 0x0E30);
  if (r < 0.7) return randRange(0x05D0, 0x05EA);
  if (r < 0.8) return 'e\u0301a\u0300o\u0308A\u030A\u212B\uFB01\u1100\u1161\u11A8ﬀ²½';
  if (r < 0.9) return ' ';
  return pick(['İstanbul ', 'ß ', 'Ǆ ', 'ﬃ ', '\u00C5', '\u0130', 'ǅungla ']);
}, 40, 1500);

// 5. Emoji and ZWJ sequences.
const emoji = ['😀', '👍', '👍🏽', '👨‍👩‍👧‍👦', '🏳️‍🌈', '🇫🇷', '🇯🇵', '❤️', '🧑🏿‍💻', '1️⃣', '#️⃣', '🫠', '🤷‍♀️',
  '👩🏻‍❤️‍💋‍👨🏼', '🐈‍⬛', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '✍🏾', '☺', '\u200D', '\uFE0F'];
synth(() => (rand() < 0.7 ? pick(emoji) : pick([' ', 'ok ', '\n', 'lol', '!!'])), 40, 1200);

// 6. Whitespace runs.
const spaces = [' ', '  ', '\t', '\n', '\r\n', '\u00A0', '\u3000', '\u0085', '\u2028', '\u2029',
  '\u200B', '\u2003', '\u000B', '\u000C', '\u1680', '\u202F', '\u205F', '\u180E'];
synth(() => {
  if (rand() < 0.5) {
    let s = '';
    const n = ri(1, 40);
    const kind = pick(spaces);
    for (let k = 0; k < n; k++) s += rand() < 0.8 ? kind : pick(spaces);
    return s;
  }
  return pick(words) + (rand() < 0.3 ? pick(words) : '');
}, 60, 1500);

// 7. Long digit runs.
synth(() => {
  const r = rand();
  let s = '';
  const n = ri(1, 300);
  if (r < 0.7) for (let k = 0; k < n; k++) s += String(ri(0, 9));
  else if (r < 0.8) for (let k = 0; k < n; k++) s += randRange(0x0660, 0x0669);
  else if (r < 0.9) for (let k = 0; k < n; k++) s += randRange(0xFF10, 0xFF19);
  else s = ri(0, 99999) + '.' + ri(0, 999) + 'e-' + ri(1, 30);
  return s + pick([' ', ',', '\n', 'px ', '%', ' + ', '']);
}, 40, 1500);

// 8. Special-token strings inside text (every tokenizer's, whole and broken).
const specials = ['<|im_start|>', '<|im_end|>', '<|endoftext|>', '<think>', '</think>', '<tool_call>',
  '<|begin_of_text|>', '<|end_of_text|>', '<|start_header_id|>', '<|eot_id|>', '<|reserved_special_token_5|>',
  '<s>', '</s>', '<unk>', '<bos>', '<eos>', '<pad>', '<start_of_turn>', '<end_of_turn>', '<unused7>',
  '<mask>', '<table>', '</td>', '<｜begin▁of▁sentence｜>', '<｜end▁of▁sentence｜>', '<｜User｜>',
  '<｜Assistant｜>', '<｜tool▁sep｜>', '<0x41>', '▁▁', '\t\t\t', '\n\n\n', '<|im_st', 'im_end|>', '<<s>>',
  '<|fim_prefix|>', '[multimodal]', '<image_soft_token>'];
synth(() => {
  const r = rand();
  if (r < 0.35) return pick(specials);
  if (r < 0.5) return ' ' + pick(specials) + ' ';
  if (r < 0.6) return '\n' + pick(specials) + '\n';
  return pick(words) + pick([' ', '', '\n', '  ']);
}, 60, 1500);

// 9. Rare, private-use, unassigned code points and control characters. Only code points that are
// unassigned up to Unicode 16 are used as "unassigned": the regex engines' Unicode versions differ
// (PCRE2 10.42 knows Unicode 14), so a character assigned later has different classes there.
synth(() => {
  const r = rand();
  if (r < 0.15) return pick(['\u0378', '\u0530', '\u05FF', '\uFFF0', '\u0AF2', '\uFFFE', '\uFFFF', '\uFDD0']);
  if (r < 0.3) return randRange(0xE000, 0xF8FF);
  if (r < 0.4) return randRange(0xF0000, 0xF00FF);
  if (r < 0.5) return pick([cp(0x10FFFF), cp(0x1FFFF), cp(0x2FFFE), cp(0xE0001), cp(0x1D11E), cp(0x1F8FF), cp(0x3134F)]);
  if (r < 0.6) return randRange(0x0000, 0x001F);
  if (r < 0.65) return '\u007F\u0080\u009F';
  if (r < 0.75) return randRange(0x20000, 0x2A6DF);  // CJK extension B
  if (r < 0.85) return randRange(0x1D400, 0x1D7FF);  // math alphanumerics (NFKC-sensitive)
  return pick(words) + ' ';
}, 40, 1200);

// 10. Mixed documents: everything interleaved.
const pool = docs.slice();
for (let d = 0; d < 60; d++) {
  const parts = [];
  for (let k = 0; k < 6; k++) {
    const b = pick(pool).toString('utf8');
    const s = ri(0, Math.max(0, b.length - 200));
    parts.push(b.slice(s, s + ri(20, 400)).replace(/^[\uDC00-\uDFFF]|[\uD800-\uDBFF]$/g, ''));
  }
  addText(parts.join(pick([' ', '', '\n', '<|im_end|>', '  '])));
}

// 11. Invalid UTF-8 byte sequences (encode must repair them as the reference does).
const invalid = [
  [0x61, 0x80, 0x62], [0xC3], [0xE2, 0x82], [0xF0, 0x9F, 0x98], [0xED, 0xA0, 0x80],
  [0xC0, 0xAF], [0xF5, 0x80, 0x80, 0x80], [0xFF, 0xFE, 0x41], [0xE0, 0x80, 0x80],
  [0xF4, 0x90, 0x80, 0x80], [0x20, 0xC3, 0x28, 0x20], [0xF0, 0x9F, 0x98, 0x80, 0x80],
];
for (let d = 0; d < 30; d++) {
  const parts = [];
  for (let k = 0; k < 40; k++) {
    parts.push(Buffer.from(pick(words) + pick([' ', '', '\n']), 'utf8'));
    if (rand() < 0.4) parts.push(Buffer.from(pick(invalid)));
  }
  docs.push(Buffer.concat(parts));
}
// Edge cases.
for (const s of ['', ' ', '  ', '\n', 'a', 'The French Bread Law states', ' Hello', 'Hello world',
  "I'm here, aren't you? WE'LL SEE'S", '<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n']) addText(s);

// 12. Characters assigned after Unicode 14 (15 and 16), which PCRE2 10.42 takes for unassigned:
// letters, digits, marks and symbols next to the contraction, space and digit rules.
const newer = [[0x11F00, 0x11F59], [0x1E4D0, 0x1E4F9], [0x31350, 0x323AF], [0x2EBF0, 0x2EE5D],
  [0x10D40, 0x10D8F], [0x105C0, 0x105F3], [0x11BC0, 0x11BF9], [0x16100, 0x16139],
  [0x16D40, 0x16D79], [0x1E5D0, 0x1E5FF], [0x11380, 0x113E2], [0x1CC00, 0x1CEB3],
  [0x13460, 0x143FA], [0x1FA70, 0x1FAFF], [0x0897, 0x0897], [0x1C89, 0x1C8A], [0xA7CB, 0xA7DC]];
synth(() => {
  const r = rand();
  if (r < 0.6) { const [lo, hi] = pick(newer); return randRange(lo, hi); }
  return pick([' ', "'s", "'ll", '1', '42', 'a', 'The', '  ', '\n', '.', '-']);
}, 20, 1200);

const total = docs.reduce((a, b) => a + b.length, 0);
if (total < 1 << 20) { console.error(`corpus too small: ${total} bytes`); process.exit(1); }
fs.writeFileSync(process.argv[2], JSON.stringify(docs.map((b) => b.toString('base64'))));
console.error(`corpus: ${docs.length} documents, ${total} bytes -> ${process.argv[2]}`);
