#!/usr/bin/env node
// Exercises a running `tformers serve` with the official openai client: chat and completions,
// streamed and not, with usage, stop strings, logprobs, seeds, penalties, logit_bias, n > 1
// choices and errors. Greedy requests must give the same text streamed or not. Exits non-zero on
// the first failed check.
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

await check('GET /v1/models/{id} retrieves the served model; another id is 404', async () => {
  const m = await openai.models.retrieve(model);
  assert.equal(m.id, model);
  assert.equal(m.object, 'model');
  const e = await openai.models.retrieve('not-this-one').catch((x) => x);
  assert.equal(e.status, 404);
  assert.equal(e.code, 'model_not_found');
});

// vLLM's endpoints beside the API, at the server's root.
const root = flags.base_url.replace(/\/v1\/?$/, '');
async function post(path, body) {
  const r = await fetch(root + path, {
    method: 'POST', body: JSON.stringify(body),
    headers: { 'Content-Type': 'application/json', Authorization: `Bearer ${flags.api_key}` },
  });
  return { status: r.status, json: await r.json() };
}

await check("vLLM's /tokenize gives the ids a request prefills; /detokenize reverses it", async () => {
  const t = await post('/tokenize', { model, prompt, return_token_strs: true });
  assert.equal(t.status, 200, JSON.stringify(t.json));
  assert.equal(t.json.count, t.json.tokens.length);
  assert.equal(t.json.token_strs.length, t.json.count);
  assert.ok(t.json.max_model_len > t.json.count);
  const c = await openai.completions.create({ model, prompt, max_tokens: 1 });
  assert.equal(t.json.count, c.usage.prompt_tokens);
  const chat = await post('/tokenize', { messages });
  const r = await openai.chat.completions.create({ model, messages, max_tokens: 1 });
  assert.equal(chat.json.count, r.usage.prompt_tokens);
  const plain = await post('/tokenize', { prompt, add_special_tokens: false });
  const d = await post('/detokenize', { model, tokens: plain.json.tokens });
  assert.equal(d.status, 200, JSON.stringify(d.json));
  assert.equal(d.json.prompt, prompt);
  const both = await post('/tokenize', { prompt, messages });
  assert.equal(both.status, 400);
  const outside = await post('/detokenize', { tokens: [1, 1000000000] });
  assert.equal(outside.status, 400);
  assert.equal(outside.json.error.param, 'tokens');
  const other = await post('/tokenize', { model: 'not-this-one', prompt });
  assert.equal(other.status, 404);
  const v = await fetch(root + '/version').then((x) => x.json());
  assert.match(v.version, /^\d+\.\d+\.\d+/);
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

await check('a batch of prompts gives each its choices, numbered prompt by prompt', async () => {
  const other = 'In the beginning';
  const alone = await openai.completions.create({ model, prompt: other, max_tokens: 20, temperature: 0 });
  const r = await openai.completions.create(
    { model, prompt: [prompt, other], max_tokens: 20, temperature: 0, n: 2 });
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  assert.deepEqual(r.choices.map((c) => c.text),
                   [completionText, completionText, alone.choices[0].text, alone.choices[0].text]);
  const single = await openai.completions.create({ model, prompt, max_tokens: 1 });
  assert.equal(r.usage.prompt_tokens, single.usage.prompt_tokens + alone.usage.prompt_tokens);
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

// The generated tokens of a greedy completion, as logprobs lists them.
async function greedyTokens(extra) {
  const r = await openai.completions.create(
    { model, prompt, max_tokens: 16, temperature: 0, ignore_eos: true, logprobs: 0, ...extra });
  return r.choices[0].logprobs.tokens;
}

await check('logit_bias of +100 on one token makes greedy decoding repeat it', async () => {
  const plain = await greedyTokens({});
  const biased = await greedyTokens({ logit_bias: { 42: 100 } });
  assert.equal(biased.length, 16);
  assert.ok(biased.every((t) => t === biased[0]), JSON.stringify(biased));
  assert.ok(!plain.includes(biased[0]), `${JSON.stringify(plain)} has ${biased[0]} already`);
  // A chat completion takes it too.
  const chat = await openai.chat.completions.create(
    { model, messages, max_tokens: 8, temperature: 0, logit_bias: { 42: 100 }, logprobs: true });
  const chatTokens = chat.choices[0].logprobs.content.map((t) => t.token);
  assert.deepEqual(chatTokens, Array(8).fill(biased[0]));
});

await check('a large presence_penalty leaves no generated token repeated', async () => {
  const distinct = (tokens) => new Set(tokens).size;
  const plain = await greedyTokens({});
  assert.ok(distinct(plain) < plain.length, `no repeat without it: ${JSON.stringify(plain)}`);
  const penalized = await greedyTokens({ presence_penalty: 2 });
  assert.equal(penalized.length, 16);
  assert.equal(distinct(penalized), penalized.length, JSON.stringify(penalized));
  // A negative frequency penalty rewards repeats instead.
  assert.ok(distinct(await greedyTokens({ frequency_penalty: -2 })) < distinct(plain));
});

await check('n = 3 sampled with a seed: three choices, the same again with the same seed',
  async () => {
    const ask = () => openai.completions.create(
      { model, prompt, max_tokens: 12, temperature: 1, seed: 5, n: 3, ignore_eos: true });
    const a = await ask(), b = await ask();
    assert.deepEqual(a.choices.map((c) => c.index), [0, 1, 2]);
    assert.deepEqual(b.choices.map((c) => c.text), a.choices.map((c) => c.text));
    // Each choice is its own sequence (seeds 5, 6 and 7), not one text three times.
    assert.ok(new Set(a.choices.map((c) => c.text)).size > 1, JSON.stringify(a.choices));
    assert.equal(a.usage.prompt_tokens, 7);  // counted once
    assert.equal(a.usage.completion_tokens, 36);  // summed over the choices
    for (const c of a.choices) assert.equal(c.finish_reason, 'length');
    // Choice 1 of seed 5 is choice 0 of seed 6.
    const alone = await openai.completions.create(
      { model, prompt, max_tokens: 12, temperature: 1, seed: 6, ignore_eos: true });
    assert.equal(alone.choices[0].text, a.choices[1].text);
    // Greedy choices are all the same text.
    const greedy = await openai.chat.completions.create(
      { model, messages, max_tokens: 10, temperature: 0, n: 2 });
    assert.equal(greedy.choices.length, 2);
    assert.equal(greedy.choices[0].message.content, greedy.choices[1].message.content);
  });

await check('streamed with n = 2, every chunk names its choice and each one finishes', async () => {
  for (const endpoint of ['chat', 'completions']) {
    const body = { model, max_tokens: 6, temperature: 0.9, seed: 3, n: 2, stream: true,
                   stream_options: { include_usage: true }, ignore_eos: true };
    const stream = endpoint === 'chat'
      ? await openai.chat.completions.create({ ...body, messages })
      : await openai.completions.create({ ...body, prompt });
    const text = ['', ''], finish = [null, null];
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        assert.ok(c.index === 0 || c.index === 1, JSON.stringify(chunk));
        assert.equal(finish[c.index], null, `choice ${c.index} went on after its finish`);
        text[c.index] += c.delta ? (c.delta.content ?? '') : c.text;
        finish[c.index] = c.finish_reason ?? null;
      }
    }
    assert.deepEqual(finish, ['length', 'length'], endpoint);
    assert.equal(usage.completion_tokens, 12, endpoint);
    // The same choices as the request not streamed.
    const whole = endpoint === 'chat'
      ? await openai.chat.completions.create({ ...body, messages, stream: false })
      : await openai.completions.create({ ...body, prompt, stream: false });
    assert.deepEqual(text, whole.choices.map((c) => c.message ? c.message.content : c.text),
                     endpoint);
  }
});

await check('errors come back as OpenAI errors', async () => {
  const bad = (body) => openai.chat.completions.create({ model, messages, ...body }).then(
    () => assert.fail(`accepted ${JSON.stringify(body)}`), (e) => e);
  let e = await bad({ temperature: 5 });
  assert.equal(e.status, 400);
  assert.equal(e.param, 'temperature');
  assert.equal(e.type, 'invalid_request_error');
  e = await bad({ n: 17 });
  assert.equal(e.param, 'n');
  e = await bad({ logit_bias: { the: 5 } });
  assert.equal(e.param, 'logit_bias');
  assert.match(e.message, /key "the" is not a token id/);
  e = await bad({ presence_penalty: 2.5 });
  assert.equal(e.param, 'presence_penalty');
  e = await bad({ max_tokens: 1000000 });
  assert.equal(e.status, 400);
  assert.equal(e.code, 'context_length_exceeded');
  e = await openai.completions.create({ model: 'not-this-one', prompt }).catch((x) => x);
  assert.equal(e.status, 404);
  assert.equal(e.code, 'model_not_found');
});

console.log(`all ${checks} checks passed`);
