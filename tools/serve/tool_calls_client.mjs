#!/usr/bin/env node
// Feeds the official openai client the response body and the stream that tformers serve writes
// for a chat completion with tool calls (built by tests/serve/test_tool_calls.cc), from a small
// HTTP server of its own, and checks what the client makes of them: message.tool_calls, and the
// stream helper's accumulation of delta.tool_calls. Exits non-zero on the first failed check.
//   node tools/serve/tool_calls_client.mjs --bodies FILE.json
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { createServer } from 'node:http';

import { OpenAI, parseFlags } from './client.mjs';

const flags = parseFlags({ bodies: '' }, 'usage: tool_calls_client.mjs --bodies FILE.json');
const bodies = JSON.parse(readFileSync(flags.bodies, 'utf8'));

const server = createServer((req, res) => {
  let body = '';
  req.on('data', (d) => { body += d; });
  req.on('end', () => {
    const stream = JSON.parse(body).stream === true;
    res.writeHead(200, { 'Content-Type': stream ? 'text/event-stream' : 'application/json' });
    res.end(stream ? bodies.stream : bodies.response);
  });
});
await new Promise((resolve) => server.listen(0, '127.0.0.1', resolve));
const openai = new OpenAI({ baseURL: `http://127.0.0.1:${server.address().port}/v1`,
                            apiKey: 'none', maxRetries: 0 });
const request = { model: 'm', messages: [{ role: 'user', content: 'Weather?' }],
                  tools: bodies.tools };
const expected = bodies.expected;

const calls = (list) => list.map((c) => ({ id: c.id, type: c.type, name: c.function.name,
                                           arguments: JSON.parse(c.function.arguments) }));

const whole = await openai.chat.completions.create(request);
assert.equal(whole.choices[0].finish_reason, 'tool_calls');
assert.equal(whole.choices[0].message.content, expected.content);
assert.deepEqual(calls(whole.choices[0].message.tool_calls), expected.tool_calls);
console.log('ok 1 message.tool_calls');

const stream = openai.chat.completions.stream(request);
const final = await stream.finalChatCompletion();
assert.equal(final.choices[0].finish_reason, 'tool_calls');
assert.equal(final.choices[0].message.content, expected.content);
assert.deepEqual(calls(final.choices[0].message.tool_calls), expected.tool_calls);
console.log('ok 2 delta.tool_calls accumulated by the stream helper');

server.close();
console.log('all 2 checks passed');
