#!/usr/bin/env node
// Output tokens/s and TTFT/TPOT percentiles of a running `tformers serve`, through HTTP and the
// official openai client, at several numbers of concurrent streaming clients (closed loop: each
// client sends its next request when the last one ends). bench_serve (C++) measures the engine
// alone; the difference is what HTTP, JSON and detokenizing cost.
//   node bench/bench_serve_http.mjs --base-url http://127.0.0.1:8080/v1 --model NAME
//       [--concurrency 1,4,16,32] [--duration 20] [--max-tokens 64] [--prompt-words 50]
import { client, parseFlags } from '../tools/serve/client.mjs';

const usage = 'usage: bench_serve_http.mjs --base-url URL --model NAME [--concurrency 1,4,16,32] ' +
  '[--duration 20] [--max-tokens 64] [--prompt-words 50] [--api-key KEY]';
// --help answers before anything runs, as every bench program does.
if (process.argv.slice(2).some((a) => a === '-h' || a === '--help')) {
  console.log(usage);
  process.exit(0);
}
const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none', concurrency: '1,4,16,32',
    duration: 20, max_tokens: 64, prompt_words: 50 },
  usage);
const openai = client(flags);
const words = 'and the lord said unto moses go up with thy people into the land'.split(' ');

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

// One request: greedy, exactly max_tokens tokens (ignore_eos), timed from the call.
async function one(i) {
  const prompt = Array.from({ length: flags.prompt_words }, (_, k) => words[(i + k) % words.length])
    .join(' ');
  const start = performance.now();
  let first = 0, last = 0, tokens = 0;
  const stream = await openai.completions.create({
    model: flags.model, prompt, max_tokens: flags.max_tokens, temperature: 0, ignore_eos: true,
    stream: true, stream_options: { include_usage: true } });
  for await (const chunk of stream) {
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    if (chunk.choices[0]?.text) {
      last = performance.now();
      if (!first) first = last;
    }
  }
  return { ttft: (first - start) / 1000, tpot: tokens > 1 ? (last - first) / 1000 / (tokens - 1) : NaN,
           tokens };
}

async function level(concurrency) {
  const start = performance.now(), end = start + flags.duration * 1000;
  const done = [];
  await Promise.all(Array.from({ length: concurrency }, async (_, c) => {
    for (let k = 0; performance.now() < end; k++) done.push(await one(c * 1000 + k));
  }));
  const seconds = (performance.now() - start) / 1000;
  const ttft = done.map((r) => r.ttft).sort((a, b) => a - b);
  const tpot = done.map((r) => r.tpot).filter((x) => !Number.isNaN(x)).sort((a, b) => a - b);
  const tokens = done.reduce((sum, r) => sum + r.tokens, 0);
  const ms = (x) => (x * 1000).toFixed(1);
  return `| ${concurrency} | ${done.length} | ${(tokens / seconds).toFixed(1)} | ` +
         `${ms(percentile(ttft, 50))} / ${ms(percentile(ttft, 90))} / ${ms(percentile(ttft, 99))} | ` +
         `${ms(percentile(tpot, 50))} / ${ms(percentile(tpot, 90))} / ${ms(percentile(tpot, 99))} |`;
}

// One request first, so that the client's connection and code are warm (the server compiled its
// shapes at start).
await one(0);
console.log(`${flags.model}: ${flags.max_tokens} tokens per request, prompts of ` +
            `${flags.prompt_words} words, ${flags.duration} s per level\n`);
console.log('| clients | requests | output tok/s | TTFT ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 |');
console.log('|---|---|---|---|---|');
for (const c of String(flags.concurrency).split(',').map(Number)) console.log(await level(c));
