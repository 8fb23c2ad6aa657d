// What the scripts of tools/serve share: their flags, and the official openai client, installed
// by tools/npm (npm ci there; scripts/setup.sh --tests does it).
import { createServer } from 'node:http';
import { createRequire } from 'node:module';

const require = createRequire(new URL('../npm/package.json', import.meta.url));
export const { default: OpenAI } = require('openai');

// --name value pairs, with defaults; an unknown flag is an error.
export function parseFlags(defaults, usage) {
  const flags = { ...defaults };
  const argv = process.argv.slice(2);
  for (let i = 0; i < argv.length; i += 2) {
    const name = argv[i].replace(/^--/, '').replace(/-/g, '_');
    if (!argv[i].startsWith('--') || !(name in flags) || i + 1 >= argv.length) {
      console.error(`unknown or incomplete flag ${argv[i]}\n${usage}`);
      process.exit(2);
    }
    flags[name] = typeof defaults[name] === 'number' ? Number(argv[i + 1]) : argv[i + 1];
  }
  return flags;
}

// Prompt i as `length` token ids in [lo, hi), from a multiplicative hash of (i, k): a sequence
// of its own for each i, the same on every call.
export function tokenIdPrompt(i, length, lo, hi) {
  const span = BigInt(hi - lo);
  return Array.from({ length },
    (_, k) => lo + Number((BigInt(i + 1) * 2654435761n + BigInt(k) * 40503n) % span));
}

// A client that fails fast: a test must see every error, not a retry that hides it.
export function client(flags) {
  return new OpenAI({ baseURL: flags.base_url, apiKey: flags.api_key, maxRetries: 0, timeout: 120000 });
}

// A local HTTP server that answers every request with bodies.response, or bodies.stream when the
// request asks to stream, and a fail-fast client of it: for feeding the client bodies that no
// shipped model makes the server write. close() stops the server.
export async function cannedServer(bodies) {
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
  return { openai, close: () => server.close() };
}

// The text and finish reason of a streamed completion (chat or not), and its usage chunk.
export async function collect(stream) {
  let text = '', finish = null, usage = null, chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    const choice = chunk.choices[0];
    if (!choice) continue;
    text += choice.delta ? (choice.delta.content ?? '') : choice.text;
    if (choice.finish_reason) finish = choice.finish_reason;
  }
  return { text, finish, usage, chunks };
}
