#!/usr/bin/env node
// Exercises a running `tformers serve` with the official openai client: chat and completions,
// streamed and not, with usage, stop strings, logprobs, seeds and errors. Greedy requests must
// give the same text streamed or not. Exits non-zero on the first failed check.
//   node tools/serve/openai_client.mjs --base-url http://127.0.0.1:8080/v1 --model NAME [--api-key K]
import assert from 'node:assert/strict';

import { client, collect, parseFlags } from './client.mjs';

const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none' },
  'usage: openai_client.mjs --base-url URL --model NAME [--api-key KEY]');
const openai = client(flags);
const model = flags.model;
let checks = 0;

async function check(name, fn) {
  await fn();
  checks++;
  console.log(`ok ${checks} ${name}`);
}

function checkUsage(usage, maxCompletion) {
  assert.ok(usage.prompt_tokens > 0, JSON.stringify(usage));
  assert.ok(usage.completion_tokens > 0 && usage.completion_tokens <= maxCompletion,
            JSON.stringify(usage));
  assert.equal(usage.total_tokens, usage.prompt_tokens + usage.completion_tokens);
}

const messages = [{ role: 'system', content: 'You answer with a fortune.' },
                  { role: 'user', content: 'What does the future hold?' }];
const prompt = 'And the LORD said unto Moses,';

await check('GET /v1/models lists the served model', async () => {
  const ids = [];
  for await (const m of openai.models.list()) ids.push(m.id);
  assert.deepEqual(ids, [model]);
});

let chatText;
await check('chat completion, greedy, not streamed', async () => {
  const r = await openai.chat.completions.create(
    { model, messages, max_tokens: 24, temperature: 0 });
  assert.equal(r.object, 'chat.completion');
  assert.match(r.id, /^chatcmpl-/);
  assert.equal(r.choices.length, 1);
  assert.equal(r.choices[0].message.role, 'assistant');
  assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));
  checkUsage(r.usage, 24);
  chatText = r.choices[0].message.content;
  assert.ok(chatText.length > 0);
});

await check('chat completion streamed gives the same text, and usage last', async () => {
  const stream = await openai.chat.completions.create(
    { model, messages, max_tokens: 24, temperature: 0, stream: true,
      stream_options: { include_usage: true } });
  const s = await collect(stream);
  assert.equal(s.text, chatText);
  assert.ok(['stop', 'length'].includes(s.finish));
  checkUsage(s.usage, 24);
  assert.ok(s.chunks >= 3, `${s.chunks} chunks`);
});

let completionText;
await check('completion, greedy, not streamed', async () => {
  const r = await openai.completions.create({ model, prompt, max_tokens: 20, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.match(r.id, /^cmpl-/);
  checkUsage(r.usage, 20);
  completionText = r.choices[0].text;
  assert.ok(completionText.length > 0);
});

await check('completion streamed gives the same text', async () => {
  const s = await collect(await openai.completions.create(
    { model, prompt, max_tokens: 20, temperature: 0, stream: true }));
  assert.equal(s.text, completionText);
  assert.equal(s.usage, null);  // only with stream_options.include_usage
});

await check('completion of token ids', async () => {
  const ids = await openai.completions.create(
    { model, prompt: [1, 2, 3, 4, 5], max_tokens: 5, temperature: 0 });
  checkUsage(ids.usage, 5);
  assert.equal(ids.usage.prompt_tokens, 5);
});

await check('max_tokens is honoured and reported as length', async () => {
  const r = await openai.completions.create(
    { model, prompt, max_tokens: 3, temperature: 0, ignore_eos: true });
  assert.equal(r.usage.completion_tokens, 3);
  assert.equal(r.choices[0].finish_reason, 'length');
});

await check('text is cut before a stop string, streamed or not', async () => {
  // A stop string from the middle of the greedy text: the text ends right before it.
  const words = completionText.split(' ').filter((w) => w.length > 0);
  const stop = ' ' + words[Math.min(3, words.length - 1)];
  const at = completionText.indexOf(stop);
  assert.ok(at >= 0, `${JSON.stringify(stop)} in ${JSON.stringify(completionText)}`);
  const r = await openai.completions.create(
    { model, prompt, max_tokens: 20, temperature: 0, stop: [stop, 'never appears'] });
  assert.equal(r.choices[0].text, completionText.slice(0, at));
  assert.equal(r.choices[0].finish_reason, 'stop');
  const s = await collect(await openai.completions.create(
    { model, prompt, max_tokens: 20, temperature: 0, stop, stream: true }));
  assert.equal(s.text, completionText.slice(0, at));
  assert.equal(s.finish, 'stop');
});

await check('chat logprobs with top alternatives', async () => {
  const r = await openai.chat.completions.create(
    { model, messages, max_tokens: 6, temperature: 0, logprobs: true, top_logprobs: 2,
      ignore_eos: true });
  const content = r.choices[0].logprobs.content;
  assert.equal(content.length, r.usage.completion_tokens);
  for (const t of content) {
    assert.ok(t.logprob <= 0, JSON.stringify(t));
    assert.equal(t.top_logprobs.length, 2);
    // Greedy: the chosen token is the most likely one.
    assert.equal(t.top_logprobs[0].logprob, t.logprob);
    // A token that is part of a character shows U+FFFD; its bytes are the raw ones.
    if (!t.token.includes("\ufffd")) assert.deepEqual(t.bytes, [...Buffer.from(t.token)]);
  }
});

await check('completion logprobs', async () => {
  const r = await openai.completions.create(
    { model, prompt, max_tokens: 4, temperature: 0, logprobs: 1, ignore_eos: true });
  const lp = r.choices[0].logprobs;
  assert.equal(lp.tokens.length, 4);
  assert.equal(lp.token_logprobs.length, 4);
  assert.equal(lp.top_logprobs.length, 4);
  assert.equal(lp.text_offset[0], 0);
});

await check('sampling with a seed repeats; without temperature the model\'s defaults apply',
  async () => {
    const ask = (extra) => openai.completions.create(
      { model, prompt, max_tokens: 16, ...extra }).then((r) => r.choices[0].text);
    assert.equal(await ask({ temperature: 0.8, seed: 7 }), await ask({ temperature: 0.8, seed: 7 }));
    assert.equal(await ask({ seed: 11 }), await ask({ seed: 11 }));
  });

await check('errors come back as OpenAI errors', async () => {
  const bad = (body) => openai.chat.completions.create({ model, messages, ...body }).then(
    () => assert.fail(`accepted ${JSON.stringify(body)}`), (e) => e);
  let e = await bad({ temperature: 5 });
  assert.equal(e.status, 400);
  assert.equal(e.param, 'temperature');
  assert.equal(e.type, 'invalid_request_error');
  e = await bad({ n: 2 });
  assert.equal(e.param, 'n');
  e = await bad({ max_tokens: 1000000 });
  assert.equal(e.status, 400);
  assert.equal(e.code, 'context_length_exceeded');
  e = await openai.completions.create({ model: 'not-this-one', prompt }).catch((x) => x);
  assert.equal(e.status, 404);
  assert.equal(e.code, 'model_not_found');
});

console.log(`all ${checks} checks passed`);
