#!/usr/bin/env node
// Structured output through the official openai client: response_format json_schema and
// json_object on chat (streamed and not) and on completions, greedy and sampled, a request cut
// by max_tokens, schemas the server refuses, and the tool calls tool_choice "required" or a named
// function forces (their arguments are checked against the functions' parameters). Each answer that ends with "stop" must be JSON;
// validating it against its schema is the `jsonschema` Python package's job
// (tools/grammar/validate_outputs.py reads the --out file). Exits non-zero on the first failed
// check.
//   node tools/serve/structured_output.mjs --base-url URL --model NAME --out results.json
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';

import { client, collect, parseFlags } from './client.mjs';

const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none', out: '' },
  'usage: structured_output.mjs --base-url URL --model NAME --out FILE [--api-key KEY]');
const openai = client(flags);
const model = flags.model;
let checks = 0;
const results = [];  // {name, schema, content, finish_reason}

async function check(name, fn) {
  await fn();
  checks++;
  console.log(`ok ${checks} ${name}`);
}

const schemas = {
  mood: {
    type: 'object',
    properties: { mood: { enum: ['happy', 'sad', 'stoic'] }, sure: { type: 'boolean' } },
    required: ['mood', 'sure'],
    additionalProperties: false,
  },
  person: {
    type: 'object',
    properties: {
      name: { type: 'string', minLength: 1, maxLength: 12 },
      age: { enum: [20, 30, 40] },
      tags: { type: 'array', items: { enum: ['kind', 'wise'] }, maxItems: 2 },
      motto: { type: ['string', 'null'], maxLength: 16 },
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
  order: {
    $defs: {
      item: {
        type: 'object',
        properties: { id: { enum: [1, 2, 3] }, label: { type: 'string', maxLength: 8 } },
        required: ['id', 'label'],
        additionalProperties: false,
      },
    },
    type: 'object',
    properties: {
      items: { type: 'array', items: { $ref: '#/$defs/item' }, minItems: 1, maxItems: 2 },
      note: { anyOf: [{ type: 'null' }, { type: 'string', maxLength: 10 }] },
    },
    required: ['items', 'note'],
    additionalProperties: false,
  },
  answer: { enum: ['yes', 'no', 'maybe'] },
};

const messages = [{ role: 'user', content: 'Describe yourself as JSON.' }];
const format = (name) => ({
  type: 'json_schema',
  json_schema: { name, schema: schemas[name], strict: true },
});

function record(name, schema, content, finish) {
  results.push({ name, schema, content, finish_reason: finish });
  // JSON at least; the schema is checked after.
  if (finish === 'stop' || finish === 'tool_calls') JSON.parse(content);
}

for (const name of Object.keys(schemas)) {
  await check(`${name}: chat, greedy, streamed and not, the same JSON`, async () => {
    const body = { model, messages, max_tokens: 150, temperature: 0, response_format: format(name) };
    const r = await openai.chat.completions.create(body);
    const whole = r.choices[0].message.content;
    assert.equal(r.choices[0].finish_reason, 'stop', whole);
    record(`${name} greedy`, schemas[name], whole, r.choices[0].finish_reason);
    const s = await collect(await openai.chat.completions.create({ ...body, stream: true }));
    assert.equal(s.text, whole);
    assert.equal(s.finish, 'stop');
    record(`${name} greedy streamed`, schemas[name], s.text, s.finish);
  });
  await check(`${name}: chat, sampled with seeds, n = 3`, async () => {
    const r = await openai.chat.completions.create(
      { model, messages, max_tokens: 150, temperature: 1, seed: 17, n: 3,
        response_format: format(name) });
    for (const c of r.choices)
      record(`${name} sampled ${c.index}`, schemas[name], c.message.content, c.finish_reason);
    assert.ok(r.choices.some((c) => c.finish_reason === 'stop'), JSON.stringify(r.choices));
  });
}

await check('completions take response_format too, streamed and not', async () => {
  const body = { model, prompt: 'The answer, as JSON:', max_tokens: 100, temperature: 0,
                 response_format: format('mood') };
  const r = await openai.completions.create(body);
  assert.equal(r.choices[0].finish_reason, 'stop');
  record('mood completion', schemas.mood, r.choices[0].text, 'stop');
  const s = await collect(await openai.completions.create({ ...body, stream: true }));
  assert.equal(s.text, r.choices[0].text);
});

await check('json_object: any JSON object', async () => {
  for (const seed of [1, 2, 3]) {
    const r = await openai.chat.completions.create(
      { model, messages, max_tokens: 120, temperature: 0.7, seed,
        response_format: { type: 'json_object' } });
    const c = r.choices[0];
    record(`json_object seed ${seed}`, { type: 'object' }, c.message.content, c.finish_reason);
    if (c.finish_reason === 'stop') assert.equal(typeof JSON.parse(c.message.content), 'object');
  }
});

await check('cut by max_tokens: finish_reason "length", the text a beginning of JSON', async () => {
  const r = await openai.chat.completions.create(
    { model, messages, max_tokens: 3, temperature: 0, response_format: format('person') });
  const text = r.choices[0].message.content;
  assert.equal(r.choices[0].finish_reason, 'length');
  assert.equal(r.usage.completion_tokens, 3);
  // Forced so far: the object's first property.
  assert.ok(text.length > 0 && ('{"name":"'.startsWith(text) || text.startsWith('{"name":"')), text);
});

await check('bad schemas are 400s naming the keyword and where it is', async () => {
  const bad = (schema) => openai.chat.completions.create(
    { model, messages, response_format: { type: 'json_schema', json_schema: { name: 'x', schema } } })
    .then(() => assert.fail(`accepted ${JSON.stringify(schema)}`), (e) => e);
  let e = await bad({ type: 'object', properties: { at: { type: 'string', format: 'date-time' } } });
  assert.equal(e.status, 400);
  assert.equal(e.param, 'response_format');
  assert.match(e.message, /#\/properties\/at\/format: keyword "format" is not supported/);
  e = await bad({ type: 'integer', minimum: 0 });
  assert.match(e.message, /"minimum" is not supported/);
  e = await bad({ $ref: 'https://example.com/schema.json' });
  assert.match(e.message, /only references within the schema/);
  e = await bad({ type: 'object', properties: { self: { $ref: '#' } }, required: ['self'] });
  assert.match(e.message, /no finite value/);
  e = await openai.chat.completions.create(
    { model, messages, response_format: { type: 'json_schema' } }).catch((x) => x);
  assert.equal(e.status, 400);
  assert.equal(e.param, 'response_format');
});

// tool_choice "required" or a named function: the output is constrained to the functions'
// parameters (a list of calls, or the named function's arguments), and comes back as tool_calls.
const weather = {
  type: 'object',
  properties: { city: { type: 'string', minLength: 1, maxLength: 12 },
                unit: { enum: ['celsius', 'fahrenheit'] } },
  required: ['city', 'unit'],
  additionalProperties: false,
};
const clock = {
  type: 'object',
  properties: { zone: { enum: ['UTC', 'CET', 'PST'] } },
  required: ['zone'],
  additionalProperties: false,
};
const tools = [
  { type: 'function', function: { name: 'get_weather', description: 'The weather in a city',
                                   parameters: weather } },
  { type: 'function', function: { name: 'get_time', parameters: clock } },
];
const toolMessages = [{ role: 'user', content: 'What is the weather in Paris?' }];
const schemaOf = { get_weather: weather, get_time: clock };

function recordCalls(name, message, finish) {
  assert.equal(message.content ?? null, null, JSON.stringify(message));
  assert.ok(message.tool_calls.length >= 1, JSON.stringify(message));
  for (const call of message.tool_calls) {
    assert.equal(call.type, 'function');
    assert.match(call.id, /^call_[A-Za-z0-9]{24}$/);
    assert.ok(call.function.name in schemaOf, call.function.name);
    record(`${name} ${call.function.name}`, schemaOf[call.function.name], call.function.arguments,
           finish);
  }
}

await check('tool_choice naming a function: its arguments, streamed and not, finish "stop"',
            async () => {
  const body = { model, messages: toolMessages, tools, max_tokens: 60, temperature: 0,
                 tool_choice: { type: 'function', function: { name: 'get_weather' } } };
  const r = await openai.chat.completions.create(body);
  const c = r.choices[0];
  assert.equal(c.finish_reason, 'stop', JSON.stringify(c));
  assert.equal(c.message.tool_calls.length, 1);
  assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
  recordCalls('named tool', c.message, c.finish_reason);
  const s = await openai.chat.completions.stream(body).finalChatCompletion();
  const sc = s.choices[0];
  assert.equal(sc.finish_reason, 'stop');
  assert.equal(sc.message.tool_calls[0].function.arguments,
               c.message.tool_calls[0].function.arguments);
  recordCalls('named tool streamed', sc.message, sc.finish_reason);
});

await check('tool_choice "required": calls to the tools given, finish "tool_calls"', async () => {
  for (const seed of [3, 4]) {
    const body = { model, messages: toolMessages, tools, max_tokens: 80, temperature: 1, seed,
                   tool_choice: 'required', parallel_tool_calls: false };
    const r = await openai.chat.completions.create(body);
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    assert.equal(c.message.tool_calls.length, 1);
    recordCalls(`required seed ${seed}`, c.message, c.finish_reason);
    const s = await openai.chat.completions.stream(body).finalChatCompletion();
    assert.equal(s.choices[0].finish_reason, 'tool_calls');
    assert.deepEqual(s.choices[0].message.tool_calls.map((t) => t.function),
                     c.message.tool_calls.map((t) => t.function));
  }
  const e = await openai.chat.completions.create(
    { model, messages: toolMessages, tools, tool_choice: 'required',
      response_format: { type: 'json_object' } }).catch((x) => x);
  assert.equal(e.status, 400);
  assert.equal(e.param, 'tool_choice');
});

writeFileSync(flags.out, JSON.stringify(results));
console.log(`all ${checks} checks passed; ${results.length} outputs written to ${flags.out}`);
