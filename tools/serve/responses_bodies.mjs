#!/usr/bin/env node
// Feeds the official openai client a Responses API body and stream that tformers serve writes
// for output no shipped model gives (reasoning, then an answer or function calls: built by
// tests/serve/test_responses.cc), from a small HTTP server of its own, and checks what the client
// makes of them: the output items of responses.create, the raw events of a stream, and
// responses.stream's accumulation into its final response. Exits non-zero on the first failed
// check.
//   node tools/serve/responses_bodies.mjs --bodies FILE.json
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { cannedServer, parseFlags } from './client.mjs';

const flags = parseFlags({ bodies: '' }, 'usage: responses_bodies.mjs --bodies FILE.json');
const bodies = JSON.parse(readFileSync(flags.bodies, 'utf8'));

const { openai, close } = await cannedServer(bodies);
const request = { model: 'm', input: 'Weather in Paris?' };
const expected = bodies.expected;  // {reasoning, text, calls: [{call_id, name, arguments}]}

// What a response's output says, in the shape of `expected`.
function outputOf(response) {
  const out = { reasoning: '', text: '', calls: [] };
  for (const item of response.output) {
    assert.equal(item.status, 'completed', JSON.stringify(item));
    if (item.type === 'reasoning') {
      assert.deepEqual(item.summary, []);
      out.reasoning += item.content.map((c) => c.text).join('');
    } else if (item.type === 'message') {
      out.text += item.content.map((c) => c.text).join('');
    } else {
      assert.equal(item.type, 'function_call');
      out.calls.push({ call_id: item.call_id, name: item.name, arguments: item.arguments });
    }
  }
  return out;
}

const whole = await openai.responses.create(request);
assert.equal(whole.status, 'completed');
assert.deepEqual(outputOf(whole), expected);
assert.equal(whole.output_text, expected.text);
assert.equal(whole.usage.output_tokens_details.reasoning_tokens, bodies.reasoning_tokens);
console.log('ok 1 output items of responses.create');

const raw = { reasoning: '', text: '', calls: [] };
let last = null;
for await (const e of await openai.responses.create({ ...request, stream: true })) {
  if (e.type === 'response.reasoning_text.delta') raw.reasoning += e.delta;
  if (e.type === 'response.output_text.delta') raw.text += e.delta;
  if (e.type === 'response.function_call_arguments.done') {
    raw.calls.push({ call_id: null, name: e.name, arguments: e.arguments });
  }
  if (e.type === 'response.output_item.done' && e.item.type === 'function_call') {
    raw.calls.at(-1).call_id = e.item.call_id;
  }
  last = e;
}
assert.deepEqual(raw, expected);
assert.equal(last.type, 'response.completed');
console.log('ok 2 the stream\'s deltas and calls');

const stream = openai.responses.stream(request);
const final = await stream.finalResponse();
assert.deepEqual(outputOf(final), expected);
assert.equal(final.output_text, expected.text);
console.log('ok 3 responses.stream accumulates the same output');

close();
console.log('all 3 checks passed');
