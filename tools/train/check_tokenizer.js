// Encodes each case of a JSON file [{"text": ..., "ids": [...]}] with the Rust `tokenizers`
// library (through @anush008/tokenizers) and reports the first case whose ids differ from the
// expected ones. Usage: node check_tokenizer.js TOKENIZER_JSON CASES_JSON [NODE_MODULES_DIR]
const fs = require('fs');
const path = require('path');

async function main() {
  const [tokenizerPath, casesPath, modulesDir] = process.argv.slice(2);
  const { Tokenizer } = require(
    path.join(modulesDir || '/work/main/tools/npm/node_modules', '@anush008/tokenizers'));
  const tokenizer = Tokenizer.fromFile(tokenizerPath);
  const cases = JSON.parse(fs.readFileSync(casesPath, 'utf8'));
  let tokens = 0;
  for (const [n, c] of cases.entries()) {
    const got = (await tokenizer.encode(c.text, null, { addSpecialTokens: false })).getIds();
    tokens += got.length;
    const same = got.length === c.ids.length && got.every((id, i) => id === c.ids[i]);
    if (!same) {
      let i = 0;
      while (i < got.length && got[i] === c.ids[i]) i++;
      console.error(`case ${n}: ids differ at ${i}: rust ${JSON.stringify(got.slice(i, i + 8))}` +
                    ` python ${JSON.stringify(c.ids.slice(i, i + 8))}` +
                    ` text ${JSON.stringify(c.text.slice(0, 80))}`);
      process.exit(1);
    }
    const decoded = await tokenizer.decode(got, false);
    if (c.decoded !== undefined && decoded !== c.decoded) {
      console.error(`case ${n}: decode differs: ${JSON.stringify(decoded.slice(0, 80))}`);
      process.exit(1);
    }
  }
  console.log(`${cases.length} cases, ${tokens} tokens: identical ids`);
}
main();
