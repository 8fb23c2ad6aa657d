#!/usr/bin/env node
// Feeds the official openai client the response body and the stream that tformers serve writes
// for a chat completion with tool calls or reasoning (built by tests/serve/test_tool_calls.cc and
// test_reasoning.cc), from a small HTTP server of its own, and checks what the client makes of
// them: message.tool_calls, the stream helper's accumulation of delta.tool_calls, and, when the
// bodies expect reasoning, message.reasoning_content and reasoning and the stream's deltas of
// them. Exits non-zero on the first failed check.
//   node tools/serve/tool_calls_client.mjs --bodies FILE.json
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';

import { cannedServer, parseFlags } from './client.mjs';

const flags = parseFlags({ bodies: '' }, 'usage: tool_calls_client.mjs --bodies FILE.json');
const bodies = JSON.parse(readFileSync(flags.bodies, 'utf8'));

const { openai, close } = await cannedServer(bodies);
const request = { model: 'm', messages: [{ role: 'user', content: 'Weather?' }],
                  tools: bodies.tools };
const expected = bodies.expected;

const calls = (list) => (list ?? []).map((c) => ({ id: c.id, type: c.type, name: c.function.name,
                                                   arguments: JSON.parse(c.function.arguments) }));
const finishReason = expected.finish_reason ?? 'tool_calls';

const whole = await openai.chat.completions.create(request);
assert.equal(whole.choices[0].finish_reason, finishReason);
assert.equal(whole.choices[0].message.content, expected.content);
assert.deepEqual(calls(whole.choices[0].message.tool_calls), expected.tool_calls);
console.log('ok 1 message.tool_calls');

const stream = openai.chat.completions.stream(request);
const final = await stream.finalChatCompletion();
assert.equal(final.choices[0].finish_reason, finishReason);
// The helper starts content from the first chunk's "": no content is "" or null.
assert.equal(final.choices[0].message.content || null, expected.content || null);
assert.deepEqual(calls(final.choices[0].message.tool_calls), expected.tool_calls);
console.log('ok 2 delta.tool_calls accumulated by the stream helper');

let checks = 2;
if ('reasoning' in expected) {
  assert.equal(whole.choices[0].message.reasoning_content, expected.reasoning);
  assert.equal(whole.choices[0].message.reasoning, expected.reasoning);
  console.log('ok 3 message.reasoning_content and message.reasoning');
  // The stream helper keeps only the last delta's unknown fields: the deltas are read raw.
  const deltas = { reasoning_content: '', reasoning: '', content: '' };
  for await (const chunk of await openai.chat.completions.create({ ...request, stream: true })) {
    for (const key of Object.keys(deltas)) deltas[key] += chunk.choices[0]?.delta?.[key] ?? '';
  }
  assert.equal(deltas.reasoning_content, expected.reasoning);
  assert.equal(deltas.reasoning, expected.reasoning);
  assert.equal(deltas.content, expected.content ?? '');
  console.log('ok 4 delta.reasoning_content and delta.reasoning');
  checks = 4;
}

close();
console.log(`all ${checks} checks passed`);
