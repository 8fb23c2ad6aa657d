"""Writes tests/data/goldens/generation.<model>.float32.json: generate() goldens for issue 4.

For each case (a GenerationConfig-like dict and a prompt) it runs a generation loop on the
reference model in float32: raw scores = last-position logits, then the processor chain of
processors.py (Transformers' order), then the next token. Greedy cases pick the first argmax, as
generate() does. Sampling cases also pick the first argmax of the processed scores: random
generators differ between implementations, so the golden fixes the path and records the
processed scores after every stage of the chain, which a test compares step by step. The loop
stops at an eos id (one or a list) or after max_new_tokens.

Self-check: each step's filtering is recomputed from raw scores perturbed by 1e-4 relative noise;
a step whose kept set changes is reported as fragile (the run fails), so the goldens only hold
decisions a float32 implementation within the logits tolerance must reproduce.

Run: /usr/bin/python3 tools/reference/make_generation_goldens.py
"""

import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import fmt  # noqa: E402
from processors import process, self_test  # noqa: E402
from reference import Model, first_argmax, load_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
OUT_DIR = os.path.join(ROOT, "tests", "data", "goldens")
MODELS = ["tiny-llama", "tiny-qwen3"]
PROMPT_A = [1, 17, 300, 45]
PROMPT_B = [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128]


def cases_for(plain_a):
    """plain_a: the plain greedy continuation of PROMPT_A, used to aim eos and bad words at
    tokens the model really produces."""
    return [
        ("greedy", {"max_new_tokens": 8}, PROMPT_A),
        ("greedy_prompt_b", {"max_new_tokens": 8}, PROMPT_B),
        ("greedy_repetition_penalty", {"max_new_tokens": 8, "repetition_penalty": 1.5},
         PROMPT_A),
        ("greedy_repetition_penalty_below_1", {"max_new_tokens": 6, "repetition_penalty": 0.7},
         PROMPT_B),
        ("greedy_no_repeat_ngram_2", {"max_new_tokens": 10, "no_repeat_ngram_size": 2},
         PROMPT_A),
        ("greedy_no_repeat_ngram_1", {"max_new_tokens": 6, "no_repeat_ngram_size": 1}, PROMPT_B),
        ("greedy_bad_words_suppress",
         {"max_new_tokens": 8, "bad_words_ids": [[plain_a[0]], [plain_a[1], plain_a[2]]],
          "suppress_tokens": [plain_a[3], 0]}, PROMPT_A),
        ("greedy_eos_list_min_new_tokens",
         {"max_new_tokens": 8, "eos_token_id": [2, plain_a[1]], "min_new_tokens": 3}, PROMPT_A),
        ("greedy_eos_stops", {"max_new_tokens": 8, "eos_token_id": [plain_a[2], 2]}, PROMPT_A),
        ("sample_temperature_top_k",
         {"max_new_tokens": 4, "do_sample": True, "temperature": 0.7, "top_k": 10}, PROMPT_A),
        ("sample_top_p", {"max_new_tokens": 4, "do_sample": True, "top_k": 0, "top_p": 0.9},
         PROMPT_B),
        ("sample_min_p",
         {"max_new_tokens": 4, "do_sample": True, "top_k": 0, "temperature": 1.5, "min_p": 0.1},
         PROMPT_A),
        ("sample_typical_p",
         {"max_new_tokens": 4, "do_sample": True, "top_k": 0, "typical_p": 0.8}, PROMPT_B),
        ("sample_qwen3_defaults_repetition_penalty",
         {"max_new_tokens": 4, "do_sample": True, "temperature": 0.6, "top_k": 20,
          "top_p": 0.95, "repetition_penalty": 1.1}, PROMPT_B),
        ("sample_default_top_k_50", {"max_new_tokens": 4, "do_sample": True}, PROMPT_A),
    ]


def kept(s):
    return torch.isfinite(s)


def fragile(cfg, prompt_len, ids, raw):
    """True when 1e-4 relative noise on the raw scores changes what any stage filters."""
    stages = process(cfg, prompt_len, ids, raw)
    g = torch.Generator().manual_seed(len(ids))
    for _ in range(8):
        noise = (torch.rand(raw.shape, generator=g) * 2 - 1) * 1e-4 * raw.abs().max()
        other = process(cfg, prompt_len, ids, raw + noise)
        for (_, a), (_, b) in zip(stages, other):
            if not torch.equal(kept(a), kept(b)):
                return True
    return False


def run_case(model, cfg, prompt, default_eos):
    cfg = dict(cfg)
    cfg.setdefault("eos_token_id", default_eos)
    eos = cfg["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else eos
    ids = list(prompt)
    steps, out = [], []
    finished = False
    n_fragile = 0
    for _ in range(cfg["max_new_tokens"]):
        raw = model.forward(ids)[-1].to(torch.float32)  # generate() casts scores to float32
        stages = process(cfg, len(prompt), ids, raw)
        final = stages[-1][1] if stages else raw
        n_fragile += fragile(cfg, len(prompt), ids, raw)
        tok = first_argmax(final)
        steps.append({"scores": raw, "stages": stages, "token": tok})
        out.append(tok)
        ids.append(tok)
        if tok in eos:
            finished = True
            break
    return cfg, out, finished, steps, n_fragile


def row(s):
    return "[" + ", ".join("null" if not np.isfinite(x) else fmt(x) for x in s.numpy()) + "]"


def write(path, name, cases):
    lines = ["{", f'  "model": {json.dumps(name)},', '  "dtype": "float32",',
             '  "generator": "tools/reference/make_generation_goldens.py",', '  "cases": [']
    for ci, (case_name, cfg, prompt, out, finished, steps) in enumerate(cases):
        lines.append("    {")
        lines.append(f'      "name": {json.dumps(case_name)},')
        lines.append(f'      "generation_config": {json.dumps(cfg)},')
        lines.append(f'      "input_ids": {json.dumps(prompt)},')
        lines.append(f'      "output_ids": {json.dumps(out)},')
        lines.append(f'      "finished_by_eos": {json.dumps(finished)},')
        lines.append('      "steps": [')
        for si, st in enumerate(steps):
            lines.append("        {")
            lines.append(f'          "token": {st["token"]},')
            lines.append(f'          "scores": {row(st["scores"])},')
            lines.append('          "stages": [')
            for gi, (stage, s) in enumerate(st["stages"]):
                sep = "," if gi + 1 < len(st["stages"]) else ""
                lines.append(f'            {{"name": {json.dumps(stage)}, "scores": {row(s)}}}{sep}')
            lines.append("          ]")
            lines.append("        }" + ("," if si + 1 < len(steps) else ""))
        lines.append("      ]")
        lines.append("    }" + ("," if ci + 1 < len(cases) else ""))
    lines += ["  ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path) as f:
        back = json.load(f)
    assert len(back["cases"]) == len(cases)


def main():
    torch.set_num_threads(2)
    self_test()
    total_fragile = 0
    for name in MODELS:
        config, weights = load_checkpoint(os.path.join(MODELS_DIR, name))
        model = Model(config, weights, torch.float32)
        _, plain, _, _, _ = run_case(model, {"max_new_tokens": 4, "eos_token_id": []}, PROMPT_A,
                                     None)
        cases = []
        for case_name, cfg, prompt in cases_for(plain):
            cfg, out, finished, steps, n_fragile = run_case(model, cfg, prompt,
                                                            config["eos_token_id"])
            total_fragile += n_fragile
            stage_names = [s for s, _ in steps[0]["stages"]]
            print(f"{name:11s} {case_name:42s} -> {out} eos={finished} stages={stage_names} "
                  f"fragile={n_fragile}")
            cases.append((case_name, cfg, prompt, out, finished, steps))
        path = os.path.join(OUT_DIR, f"generation.{name}.float32.json")
        write(path, name, cases)
        print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")
    assert total_fragile == 0, f"{total_fragile} fragile steps: change the case parameters"


if __name__ == "__main__":
    main()
