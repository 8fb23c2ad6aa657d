#!/usr/bin/env node
// A bounded loopback load test of a running `tformers serve`: --clients streaming clients send
// greedy requests (chat and completions, prompts of many lengths) back to back for --duration
// seconds. It fails on any error, on any output that differs from the same request run alone
// beforehand, on a server whose resident memory grows more than --rss-growth-mib above the level
// it reached during a --warm-up of the same load, and on any compile after the server's warm-up.
// With --prompt-tokens N, the requests are completions whose prompts are N token ids, or a few
// fewer (long prompts: chunked prefill beside the decodes of the others).
//   node tools/serve/load_test.mjs --base-url http://127.0.0.1:8080/v1 --model NAME --pid PID
import fs from 'node:fs';

import { client, collect, parseFlags, tokenIdPrompt } from './client.mjs';

const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none', pid: 0, clients: 32,
    duration: 60, warm_up: 10, max_tokens: 32, rss_growth_mib: 8, prompt_tokens: 0 },
  'usage: load_test.mjs --base-url URL --model NAME --pid SERVER_PID [--clients 32] ' +
  '[--duration 60] [--warm-up 10] [--max-tokens 32] [--rss-growth-mib 8] [--prompt-tokens 0] ' +
  '[--api-key KEY]');
const openai = client(flags);

function rssMib() {
  const status = fs.readFileSync(`/proc/${flags.pid}/status`, 'utf8');
  return Number(status.match(/^VmRSS:\s+(\d+) kB/m)[1]) / 1024;
}

const variants = [];
if (flags.prompt_tokens > 0) {
  // Token ids below 256 (inside any vocabulary), ending 0 to 14 ids short of --prompt-tokens so
  // that prompts end at several places in a block.
  for (let v = 0; v < 8; v++) {
    const ids = tokenIdPrompt(v, flags.prompt_tokens - 2 * v, 0, 256);
    variants.push({ kind: 'completion', body: { prompt: ids } });
  }
} else {
  // Prompts from a few tokens to most of the context, so that many prefill buckets are used.
  const verse = 'And God said, Let there be light: and there was light. ';
  for (const [i, repeat] of [1, 2, 3, 5, 8, 12].entries()) {
    const text = verse.repeat(repeat).slice(i);
    variants.push({ kind: 'completion', body: { prompt: text } });
    variants.push({ kind: 'chat', body: { messages: [{ role: 'user', content: text }] } });
  }
  // Stop strings and usage chunks go through the same checks.
  variants.push({ kind: 'completion', body: { prompt: 'And the LORD said', stop: [' the', ','] } });
  variants.push({ kind: 'chat', body: { messages: [{ role: 'user', content: 'Why?' }],
                                        stream_options: { include_usage: true } } });
}

async function run(variant) {
  const body = { model: flags.model, max_tokens: flags.max_tokens, temperature: 0, stream: true,
                 ...variant.body };
  const api = variant.kind === 'chat' ? openai.chat.completions : openai.completions;
  return collect(await api.create(body));
}

// The reference: each request alone, one at a time.
const expected = [];
for (const v of variants) expected.push(await run(v));

const stats = { requests: 0, errors: 0, mismatches: 0, firstErrors: [] };
const rss = { after_warm_up: 0, max: 0, last: 0 };

async function load(seconds, count) {
  const end = Date.now() + seconds * 1000;
  const worker = async (c) => {
    for (let k = 0; Date.now() < end; k++) {
      const i = (c + k * flags.clients) % variants.length;
      try {
        const got = await run(variants[i]);
        if (!count) continue;
        stats.requests++;
        if (got.text !== expected[i].text || got.finish !== expected[i].finish) {
          stats.mismatches++;
          if (stats.firstErrors.length < 5)
            stats.firstErrors.push({ variant: i, got: got.text, expected: expected[i].text });
        }
      } catch (e) {
        stats.errors++;
        if (stats.firstErrors.length < 5) stats.firstErrors.push(String(e));
      }
    }
  };
  await Promise.all(Array.from({ length: flags.clients }, (_, c) => worker(c)));
}

await load(flags.warm_up, false);
rss.after_warm_up = rssMib();
const sampler = setInterval(() => {
  rss.last = rssMib();
  rss.max = Math.max(rss.max, rss.last);
}, 1000);
const started = Date.now();
await load(flags.duration, true);
clearInterval(sampler);
const seconds = (Date.now() - started) / 1000;

const metrics = await (await fetch(flags.base_url.replace(/\/v1\/?$/, '/metrics'))).text();
const compiles = Number(metrics.match(/^tformers_compiles_since_ready_total (\S+)$/m)[1]);

const failures = [];
if (stats.errors) failures.push(`${stats.errors} requests failed`);
if (stats.mismatches) failures.push(`${stats.mismatches} outputs differ from the request alone`);
if (stats.requests === 0) failures.push('no request completed');
if (rss.max - rss.after_warm_up > flags.rss_growth_mib)
  failures.push(`server RSS grew ${(rss.max - rss.after_warm_up).toFixed(1)} MiB after warm-up ` +
                `(bound ${flags.rss_growth_mib} MiB)`);
if (compiles !== 0) failures.push(`${compiles} compiles after the server's warm-up`);
console.log(JSON.stringify({
  clients: flags.clients, seconds: Number(seconds.toFixed(1)), requests: stats.requests,
  requests_per_s: Number((stats.requests / seconds).toFixed(2)),
  errors: stats.errors, mismatches: stats.mismatches, compiles_since_ready: compiles,
  rss_mib: { after_warm_up: Number(rss.after_warm_up.toFixed(1)), max: Number(rss.max.toFixed(1)),
             last: Number(rss.last.toFixed(1)) },
  first_errors: stats.firstErrors,
}));
if (failures.length) {
  console.error(`load test failed: ${failures.join('; ')}`);
  process.exit(1);
}
