#!/usr/bin/env python3
"""Validates structured outputs against their JSON schemas with the `jsonschema` package (pinned
in pyproject.toml's `test` group): the independent check of tests/serve/test_structured_output.cc.

    validate_outputs.py RESULTS_JSON

RESULTS_JSON: [{"name", "schema", "content", "finish_reason"}], as tools/serve/structured_output.mjs
writes it. Every output that ended with "stop" (or "tool_calls": a call's arguments) must parse
as JSON and validate (Draft 2020-12); one cut by max_tokens ("length") need not. Prints one line per output, exits 1 on any failure.
"""
import json
import sys

import jsonschema


def main():
    with open(sys.argv[1], encoding="utf-8") as f:
        results = json.load(f)
    failures = stopped = 0
    for r in results:
        # A forced tool call of tool_choice "required" ends with "tool_calls".
        if r["finish_reason"] not in ("stop", "tool_calls"):
            print(f"cut   {r['name']}: {r['finish_reason']}: {r['content']!r}")
            continue
        stopped += 1
        try:
            value = json.loads(r["content"])
            jsonschema.Draft202012Validator(r["schema"]).validate(value)
            print(f"valid {r['name']}: {r['content']}")
        except (ValueError, jsonschema.ValidationError) as e:
            failures += 1
            print(f"FAIL  {r['name']}: {r['content']!r}: {e}")
    print(f"{stopped} of {len(results)} outputs ended complete; {failures} failed validation")
    sys.exit(1 if failures or stopped == 0 else 0)


if __name__ == "__main__":
    main()
