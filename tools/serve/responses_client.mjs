#!/usr/bin/env node
// The Responses API (POST /v1/responses) of a running `tformers serve`, through the official
// openai client: responses.create streamed and not, the stream helper's accumulation
// (responses.stream), usage, max_output_tokens cutting a response (status "incomplete"),
// structured output through text.format (responses.parse), function tools forced by tool_choice
// and sent back as input items, and 400s that name the field. Every event of a stream is checked
// against the order the client's types give. Outputs that must be JSON are written to --out for
// tools/grammar/validate_outputs.py to validate against their schemas. Exits non-zero on the
// first failed check.
//   node tools/serve/responses_client.mjs --base-url URL --model NAME --out results.json
import assert from 'node:assert/strict';
import { writeFileSync } from 'node:fs';

import { client, parseFlags } from './client.mjs';

const flags = parseFlags(
  { base_url: 'http://127.0.0.1:8080/v1', model: '', api_key: 'none', out: '' },
  'usage: responses_client.mjs --base-url URL --model NAME --out FILE [--api-key KEY]');
const openai = client(flags);
const model = flags.model;
let checks = 0;
const results = [];  // {name, schema, content, finish_reason}, as validate_outputs.py reads them

async function check(name, fn) {
  await fn();
  checks++;
  console.log(`ok ${checks} ${name}`);
}

function checkUsage(r, maxOutput) {
  const u = r.usage;
  assert.ok(u.input_tokens > 0, JSON.stringify(u));
  assert.ok(u.output_tokens > 0 && u.output_tokens <= maxOutput, JSON.stringify(u));
  assert.equal(u.total_tokens, u.input_tokens + u.output_tokens);
  assert.equal(typeof u.input_tokens_details.cached_tokens, 'number');
  assert.equal(u.output_tokens_details.reasoning_tokens, 0);  // the tiny model does not reason
  // Cut by max_output_tokens exactly when all of them were used.
  assert.equal(r.status, u.output_tokens === maxOutput ? 'incomplete' : 'completed');
}

// Reads a stream, checking each event against the one before it: sequence numbers from 0, an
// item added before its content, content parts before their deltas, deltas before their done
// events, every item done before the response ends. Returns the events and the last response.
async function readStream(stream) {
  const events = [];
  const items = [];  // per output index: {item, text, done}
  let final = null;
  for await (const e of stream) {
    assert.equal(e.sequence_number, events.length, e.type);
    events.push(e);
    const at = items[e.output_index];
    switch (e.type) {
      case 'response.created':
      case 'response.in_progress':
        assert.equal(events.length, e.type === 'response.created' ? 1 : 2);
        assert.equal(e.response.status, 'in_progress');
        assert.deepEqual(e.response.output, []);
        break;
      case 'response.output_item.added':
        assert.equal(e.output_index, items.length);
        assert.ok(items.every((i) => i.done), 'an item was added while another was open');
        items.push({ item: e.item, text: '', done: false, part: false });
        break;
      case 'response.content_part.added':
        assert.equal(at.item.id, e.item_id);
        at.part = true;
        break;
      case 'response.output_text.delta':
      case 'response.reasoning_text.delta':
        assert.ok(at.part && !at.done, e.type);
        assert.equal(at.item.type, e.type.includes('reasoning') ? 'reasoning' : 'message');
        at.text += e.delta;
        break;
      case 'response.output_text.done':
      case 'response.reasoning_text.done':
        assert.equal(e.text, at.text);
        break;
      case 'response.content_part.done':
        assert.equal(e.part.text, at.text);
        break;
      case 'response.function_call_arguments.delta':
        assert.equal(at.item.type, 'function_call');
        at.text += e.delta;
        break;
      case 'response.function_call_arguments.done':
        assert.equal(e.arguments, at.text);
        assert.equal(e.name, at.item.name);
        break;
      case 'response.output_item.done':
        assert.equal(e.item.id, at.item.id);
        at.done = true;
        break;
      case 'response.completed':
      case 'response.incomplete':
        assert.ok(items.every((i) => i.done), 'the response ended with an item open');
        assert.equal(e.response.output.length, items.length);
        final = e.response;
        break;
      default:
        assert.fail(`unexpected event ${e.type}`);
    }
  }
  assert.ok(final, 'no response.completed or response.incomplete');
  return { events, final };
}

const input = 'Give me a proverb.';
const greedy = { model, input, max_output_tokens: 40, temperature: 0 };

let wholeText = '';
await check('responses.create: a message with output_text, usage, and a resp_ id', async () => {
  const r = await openai.responses.create(greedy);
  assert.match(r.id, /^resp_[0-9a-f]{24}$/);
  assert.equal(r.object, 'response');
  assert.equal(r.model, model);
  assert.ok(Math.abs(r.created_at - Date.now() / 1000) < 600, String(r.created_at));
  assert.equal(r.output.length, 1);
  const [message] = r.output;
  assert.equal(message.type, 'message');
  assert.equal(message.role, 'assistant');
  assert.match(message.id, /^msg_/);
  assert.equal(message.content[0].type, 'output_text');
  assert.deepEqual(message.content[0].annotations, []);
  assert.ok(r.output_text.length > 0);
  assert.equal(r.output_text, message.content[0].text);
  assert.equal(r.error, null);
  assert.equal(r.max_output_tokens, 40);
  assert.equal(r.temperature, 0);
  checkUsage(r, 40);
  wholeText = r.output_text;
});

await check('stream: the events in order, the same text as the whole response', async () => {
  const { events, final } = await readStream(
    await openai.responses.create({ ...greedy, stream: true }));
  const types = events.map((e) => e.type);
  assert.deepEqual(types.slice(0, 4), ['response.created', 'response.in_progress',
                                       'response.output_item.added',
                                       'response.content_part.added']);
  assert.deepEqual(types.slice(-4), ['response.output_text.done', 'response.content_part.done',
                                     'response.output_item.done',
                                     `response.${final.status}`]);
  assert.ok(types.slice(4, -4).every((t) => t === 'response.output_text.delta'), types.join());
  assert.equal(final.output[0].content[0].text, wholeText);
  checkUsage(final, 40);
});

await check('responses.stream accumulates the events into the same response', async () => {
  const stream = openai.responses.stream(greedy);
  let deltas = '';
  stream.on('response.output_text.delta', (e) => { deltas += e.delta; });
  const r = await stream.finalResponse();
  assert.equal(r.output_text, wholeText);
  assert.equal(deltas, wholeText);
});

await check('max_output_tokens cuts a response: status incomplete, streamed and not', async () => {
  const body = { ...greedy, max_output_tokens: 3 };
  const r = await openai.responses.create(body);
  assert.equal(r.status, 'incomplete');
  assert.deepEqual(r.incomplete_details, { reason: 'max_output_tokens' });
  assert.equal(r.usage.output_tokens, 3);
  assert.equal(r.output[0].status, 'incomplete');
  const streamed = await openai.responses.create({ ...body, stream: true });
  const { events, final } = await readStream(streamed);
  assert.equal(events.at(-1).type, 'response.incomplete');
  assert.equal(final.status, 'incomplete');
  assert.equal(final.output[0].content[0].text, r.output_text);
});

await check('instructions and input items reach the chat template', async () => {
  const bare = await openai.responses.create({ ...greedy, max_output_tokens: 1 });
  const r = await openai.responses.create({
    ...greedy, max_output_tokens: 1, instructions: 'You answer with a fortune.',
    metadata: { trace: 'abc' }, store: true, user: 'u1',
  });
  assert.ok(r.usage.input_tokens > bare.usage.input_tokens + 5, JSON.stringify(r.usage));
  assert.equal(r.instructions, 'You answer with a fortune.');
  assert.deepEqual(r.metadata, { trace: 'abc' });
  assert.equal(r.user, 'u1');
  // The same conversation as items: developer, user and assistant messages of text parts.
  const items = await openai.responses.create({
    ...greedy, max_output_tokens: 1,
    input: [
      { role: 'developer', content: 'You answer with a fortune.' },
      { type: 'message', role: 'user', content: [{ type: 'input_text', text: 'Hello.' }] },
      { type: 'message', role: 'assistant', status: 'completed', id: 'msg_1',
        content: [{ type: 'output_text', text: 'Blessed are the meek.', annotations: [] }] },
      { role: 'user', content: input },
    ],
  });
  assert.ok(items.usage.input_tokens > r.usage.input_tokens, JSON.stringify(items.usage));
});

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
    },
    required: ['name', 'age', 'tags'],
    additionalProperties: false,
  },
};

for (const name of Object.keys(schemas)) {
  await check(`text.format json_schema (${name}): output_parsed, streamed the same`, async () => {
    const body = { model, input: 'Describe yourself as JSON.', max_output_tokens: 150,
                   temperature: 0,
                   text: { format: { type: 'json_schema', name, schema: schemas[name],
                                     strict: true } } };
    const r = await openai.responses.parse(body);
    assert.equal(r.status, 'completed', JSON.stringify(r.output));
    assert.equal(typeof r.output_parsed, 'object');
    assert.deepEqual(r.output_parsed, JSON.parse(r.output_text));
    assert.deepEqual(r.text.format.schema, schemas[name]);
    results.push({ name: `responses ${name}`, schema: schemas[name], content: r.output_text,
                   finish_reason: 'stop' });
    const { final } = await readStream(await openai.responses.create({ ...body, stream: true }));
    assert.equal(final.output[0].content[0].text, r.output_text);
  });
}

await check('text.format json_object: a JSON object, or cut', async () => {
  const r = await openai.responses.create(
    { model, input: 'JSON, please.', max_output_tokens: 60, temperature: 0.7, seed: 3,
      text: { format: { type: 'json_object' } } });
  assert.ok(r.output_text.startsWith('{'), r.output_text);
  results.push({ name: 'responses json_object', schema: { type: 'object' },
                 content: r.output_text,
                 finish_reason: r.status === 'completed' ? 'stop' : 'length' });
});

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
// The Responses API's function tools are flat: no nested "function".
const tools = [
  { type: 'function', name: 'get_weather', description: 'The weather in a city',
    parameters: weather, strict: true },
  { type: 'function', name: 'get_time', parameters: clock, strict: true },
];
const schemaOf = { get_weather: weather, get_time: clock };
const question = 'What is the weather in Paris?';

function checkCall(item) {
  assert.equal(item.type, 'function_call');
  assert.match(item.id, /^fc_/);
  assert.match(item.call_id, /^call_[A-Za-z0-9]{24}$/);
  assert.equal(item.status, 'completed');
  assert.ok(item.name in schemaOf, item.name);
  results.push({ name: `responses call ${item.name}`, schema: schemaOf[item.name],
                 content: item.arguments, finish_reason: 'tool_calls' });
}

let forcedCall = null;
await check('tool_choice naming a function: a function_call item the client parses', async () => {
  const body = { model, input: question, tools, max_output_tokens: 60, temperature: 0,
                 tool_choice: { type: 'function', name: 'get_weather' } };
  const r = await openai.responses.parse(body);
  assert.equal(r.status, 'completed');
  assert.equal(r.output.length, 1, JSON.stringify(r.output));
  const [call] = r.output;
  checkCall(call);
  assert.equal(call.name, 'get_weather');
  assert.deepEqual(call.parsed_arguments, JSON.parse(call.arguments));
  assert.equal(r.output_text, '');
  assert.deepEqual(r.tool_choice, { type: 'function', name: 'get_weather' });
  assert.equal(r.tools.length, 2);
  const streamed = await openai.responses.create({ ...body, stream: true });
  const { events, final } = await readStream(streamed);
  assert.ok(events.some((e) => e.type === 'response.function_call_arguments.delta'));
  const done = events.find((e) => e.type === 'response.function_call_arguments.done');
  assert.equal(done.arguments, call.arguments);
  assert.equal(final.output[0].arguments, call.arguments);
  forcedCall = call;
});

await check('tool_choice "required": function_call items of the tools given', async () => {
  for (const seed of [3, 4]) {
    const r = await openai.responses.create(
      { model, input: question, tools, max_output_tokens: 80, temperature: 1, seed,
        tool_choice: 'required', parallel_tool_calls: false });
    assert.equal(r.status, 'completed', JSON.stringify(r));
    assert.equal(r.output.length, 1, JSON.stringify(r.output));
    checkCall(r.output[0]);
  }
});

await check('a call and its output sent back as input items', async () => {
  const r = await openai.responses.create({
    model, tools, max_output_tokens: 5, temperature: 0,
    input: [{ role: 'user', content: question },
            { type: 'function_call', call_id: forcedCall.call_id, name: forcedCall.name,
              arguments: forcedCall.arguments, id: forcedCall.id, status: 'completed' },
            { type: 'function_call_output', call_id: forcedCall.call_id,
              output: '{"temperature": 21}' }],
  });
  assert.equal(r.output[0].type, 'message');
});

await check('bad requests are 400s naming the field', async () => {
  const bad = async (body, param, pattern) => {
    const e = await openai.responses.create({ model, input, ...body })
      .then(() => assert.fail(`accepted ${JSON.stringify(body)}`), (x) => x);
    assert.equal(e.status, 400, `${JSON.stringify(body)}: ${e.message}`);
    assert.equal(e.param, param, e.message);
    if (pattern) assert.match(e.message, pattern);
  };
  await bad({ messages: [] }, 'messages', /calls it input/);
  await bad({ previous_response_id: 'resp_1' }, 'previous_response_id', /stores no responses/);
  await bad({ background: true }, 'background');
  await bad({ include: ['reasoning.encrypted_content'] }, 'include');
  await bad({ input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] },
            'input[0].content[0].type', /"input_image" is not supported/);
  await bad({ input: [{ type: 'item_reference', id: 'msg_1' }] }, 'input[0].type');
  await bad({ tools: [{ type: 'web_search' }] }, 'tools[0].type');
  await bad({ tools: [{ type: 'function', name: 'a b' }] }, 'tools[0].name');
  await bad({ tools, tool_choice: { type: 'function', name: 'nope' } }, 'tool_choice');
  await bad({ text: { format: { type: 'json_schema', name: 'x',
                                schema: { type: 'integer', minimum: 0 } } } },
            'text.format', /"minimum" is not supported/);
  await bad({ reasoning: { effort: 'huge' } }, 'reasoning.effort');
  await bad({ max_output_tokens: 100000 }, 'max_output_tokens', /maximum context length/);
  const e = await openai.responses.create({ model: 'other', input }).catch((x) => x);
  assert.equal(e.status, 404);
});

writeFileSync(flags.out, JSON.stringify(results));
console.log(`all ${checks} checks passed; ${results.length} outputs written to ${flags.out}`);
