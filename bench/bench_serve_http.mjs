#!/usr/bin/env node
// Output tokens/s and TTFT/TPOT percentiles of a running `tformers serve`, through HTTP and the
// official openai client, at several numbers of concurrent streaming clients (closed loop: each
// client sends its next request when the last one ends). bench_serve (C++) measures the engine
// alone; the difference is what HTTP, JSON and detokenizing cost.
// Any server of the OpenAI API can be measured the same way (bench/peer_serve.sh drives it against
// llama.cpp's and vLLM's): with --prompt-tokens N each prompt is N token ids, different for every
// request so that no server reuses a cached prefix, which also needs no tokenizer on either side.
//   node bench/bench_serve_http.mjs --base-url http://127.0.0.1:8080/v1 --model NAME
//       [--concurrency 1,4,16,32] [--duration 20] [--max-tokens 64] [--prompt-words 50]
//       [--prompt-tokens 0]
import { OpenAI, client, parseFlags, tokenIdPrompt } from '../tools/serve/client.mjs';

const usage = 'usage: bench_serve_http.mjs --base-url URL --model NAME [--concurrency 1,4,16,32] ' +
  '[--duration 20] [--max-tokens 64] [--prompt-words 50] [--prompt-tokens 0] [--api-key KEY]';
// --help answers before anything runs, as every bench program does.
if (process.argv.slice(2).some((a) => a === '-h' || a === '--help')) {
  console.log(usage);
  process.exit(0);
}
const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none', concurrency: '1,4,16,32',
    duration: 20, max_tokens: 64, prompt_words: 50, prompt_tokens: 0 },
  usage);
const openai = client(flags);
const words = 'and the lord said unto moses go up with thy people into the land'.split(' ');

function percentile(sorted, p) {
  if (sorted.length === 0) return NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor((p / 100) * sorted.length))];
}

// Request i's prompt: words of the text, or token ids in [100, 150000) (below every special
// token of the Qwen and Llama vocabularies).
function promptOf(i) {
  if (flags.prompt_tokens > 0) return tokenIdPrompt(i, flags.prompt_tokens, 100, 150000);
  return Array.from({ length: flags.prompt_words }, (_, k) => words[(i + k) % words.length])
    .join(' ');
}

// One request: greedy, exactly max_tokens tokens (ignore_eos), timed from the call. A server that
// ends early or sends no usage fails the run: its numbers would not compare.
// llama-server at times closes a kept-alive connection just as the next request goes out on it
// ("other side closed" before any response): such a request is sent again at once, timed from
// the new send, and counted (printed after each level).
let resent = 0;
const kMaxResends = 3;

async function one(i) {
  const prompt = promptOf(i);
  let start = 0, stream = null;
  for (let attempt = 0; !stream; attempt++) {
    start = performance.now();
    try {
      stream = await openai.completions.create({
        model: flags.model, prompt, max_tokens: flags.max_tokens, temperature: 0, ignore_eos: true,
        stream: true, stream_options: { include_usage: true } });
    } catch (e) {
      if (!(e instanceof OpenAI.APIConnectionError) || e instanceof OpenAI.APIConnectionTimeoutError ||
          attempt >= kMaxResends) throw e;
      resent++;
    }
  }
  let first = 0, last = 0, tokens = 0;
  for await (const chunk of stream) {
    if (chunk.usage) tokens = chunk.usage.completion_tokens;
    if (chunk.choices[0]?.text) {
      last = performance.now();
      if (!first) first = last;
    }
  }
  if (tokens !== flags.max_tokens) {
    throw new Error(`request ${i}: ${tokens} completion tokens reported, ${flags.max_tokens} asked`);
  }
  return { ttft: (first - start) / 1000, tpot: tokens > 1 ? (last - first) / 1000 / (tokens - 1) : NaN,
           tokens };
}

// Every request of the run, the warm-up one and those of every level, has a prompt of its own: a
// prompt sent again would be a prefix-cache hit on servers that keep one (both tformers and
// llama.cpp do), and its TTFT would not be a prefill's.
let nextRequest = 0;

async function level(concurrency) {
  const start = performance.now(), end = start + flags.duration * 1000;
  const done = [];
  await Promise.all(Array.from({ length: concurrency }, async () => {
    while (performance.now() < end) done.push(await one(nextRequest++));
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
await one(nextRequest++);
const prompts = flags.prompt_tokens > 0 ? `${flags.prompt_tokens} token ids` :
  `${flags.prompt_words} words`;
console.log(`${flags.model}: ${flags.max_tokens} tokens per request, prompts of ${prompts}, ` +
            `${flags.duration} s per level\n`);
console.log('| clients | requests | output tok/s | TTFT ms p50 / p90 / p99 | TPOT ms p50 / p90 / p99 |');
console.log('|---|---|---|---|---|');
for (const c of String(flags.concurrency).split(',').map(Number)) {
  console.log(await level(c));
  if (resent) console.error(`(${resent} requests sent again after a closed connection so far)`);
}
