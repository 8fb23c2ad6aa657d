#!/usr/bin/env python3
"""The token masks of llguidance (PyPI llguidance, pinned in pyproject.toml's `test` group) for
JSON schemas along given token paths: the oracle of tests/generation/test_json_grammar_oracle.cc.

    llguidance_masks.py TOKENIZER_JSON CASES_JSON OUT_JSON

CASES_JSON: {"eos": [ids], "cases": [{"schema": {...}, "paths": [[ids], ...]}]}. For each path,
at each step (before each of its tokens, and once after the last), the mask of the tokens
llguidance allows, then the path's token is consumed. OUT_JSON:
    {"vocab_size": N, "special": [ids], "token_bytes": [hex, ...],
     "cases": [{"paths": [{"steps": [{"mask": base64, "accepting": bool}], "refused": i or null}]}]}
`refused` is the first step whose token llguidance did not take (the path stops there).

llguidance is set to tformers' rules: compact JSON (x-guidance whitespace_flexible false), oneOf
followed as anyOf (coerce_one_of), and no forcing (`no_forcing`), so that a mask is every token
whose bytes can come next, as tformers computes it, rather than the one canonical token of bytes
the grammar forces.
"""
import base64
import json
import sys

import llguidance


def main():
    tokenizer_json, cases_json, out_json = sys.argv[1:4]
    with open(tokenizer_json, encoding="utf-8") as f:
        tokenizer_text = f.read()
    with open(cases_json, encoding="utf-8") as f:
        cases = json.load(f)
    tok = llguidance.LLTokenizer(tokenizer_text, eos_token=cases["eos"])
    n = tok.vocab_size
    out = {
        "vocab_size": n,
        "special": [i for i in range(n) if tok.is_special_token(i)],
        "token_bytes": [tok.decode_bytes([i]).hex() for i in range(n)],
        "cases": [],
    }
    for case in cases["cases"]:
        schema = dict(case["schema"]) if isinstance(case["schema"], dict) else case["schema"]
        if isinstance(schema, dict):
            schema["x-guidance"] = {"whitespace_flexible": False, "coerce_one_of": True}
        lark = '%llguidance {"no_forcing": true}\nstart: %json ' + json.dumps(schema)
        grammar = llguidance.LLMatcher.grammar_from_lark(lark)
        error = llguidance.LLMatcher.validate_grammar(grammar, tok)
        if error:
            raise SystemExit(f"llguidance refuses {json.dumps(case['schema'])}: {error}")
        result = {"paths": []}
        for path in case["paths"]:
            m = llguidance.LLMatcher(tok, grammar, log_level=0)
            steps, refused = [], None
            for i in range(len(path) + 1):
                mask = m.compute_bitmask()
                if m.is_error():
                    raise SystemExit(f"llguidance failed: {m.get_error()}")
                steps.append({"mask": base64.b64encode(mask).decode(),
                              "accepting": m.is_accepting()})
                if i == len(path):
                    break
                if not m.consume_token(path[i]):
                    refused = i
                    break
            result["paths"].append({"steps": steps, "refused": refused})
        out["cases"].append(result)
    with open(out_json, "w", encoding="utf-8") as f:
        json.dump(out, f)


if __name__ == "__main__":
    main()
