"""Writes tests/data/goldens/generation.<model>.float32.json: generate() goldens from Transformers.

Everything in these files comes from Transformers 5.23.0 (torch 2.15.0, CPU) itself:

- the model is `AutoModelForCausalLM.from_pretrained(dir, dtype=torch.float32,
  attn_implementation="eager")`; a step's raw scores are its last-position logits for the whole
  sequence so far, cast to float32 as generate() casts them;
- the processor chain is the LogitsProcessorList that `model._get_logits_processor` builds inside
  a real `model.generate(...)` call for the case's settings (caught by wrapping the method), so
  the stages, their order and their defaults (top_k 50, min_length from min_new_tokens, ...) are
  Transformers' own; each stage is one of its processor objects, applied in turn;
- greedy cases: the path is the first argmax of the processed scores, and the script asserts
  that it is token for token what `model.generate(...)` returned, and that generate()'s own raw
  and processed scores (output_logits / output_scores, computed with its KV cache) agree with
  the recorded ones;
- sampling cases also follow the first argmax of the processed scores (random generators differ
  between implementations), so the golden fixes the path and holds the scores after each stage;
  generate()'s processed scores of its first step (the same input) are checked against ours.

Self-check: each step's chain is rerun on raw scores perturbed by 1e-4 relative noise (8 seeded
draws); a step where any stage keeps a different token set is fragile and fails the run, so the
goldens only hold filtering decisions that a float32 implementation within the logits tolerance
must reproduce. `self_test` pins the edge cases the C++ engine relies on, against the classes.

Run: .venv/bin/python tools/reference/make_generation_goldens.py
(deterministic: a rerun writes byte-identical files; ~30 s on 2 cores)
"""

import json
import os
import sys

import numpy as np
import torch
import transformers
from transformers import AutoModelForCausalLM
from transformers.generation import logits_process as lp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
OUT_DIR = os.path.join(ROOT, "tests", "data", "goldens")
MODELS = ["tiny-llama", "tiny-qwen3"]
PROMPT_A = [1, 17, 300, 45]
PROMPT_B = [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128]
# The versions these files were made with (pyproject.toml's "reference" group pins them): another
# version may order or define the processors differently.
VERSIONS = {"transformers": "5.23.0", "torch": "2.15.0"}

# Transformers' processor classes and the stage names the goldens (and the C++ engine) use. A
# class not listed here means the case asks for something the engine does not implement.
STAGE_NAMES = {
    lp.RepetitionPenaltyLogitsProcessor: "repetition_penalty",
    lp.NoRepeatNGramLogitsProcessor: "no_repeat_ngram",
    lp.NoBadWordsLogitsProcessor: "no_bad_words",
    lp.MinLengthLogitsProcessor: "min_length",
    lp.MinNewTokensLengthLogitsProcessor: "min_new_tokens",
    lp.SuppressTokensLogitsProcessor: "suppress_tokens",
    lp.TemperatureLogitsWarper: "temperature",
    lp.TopKLogitsWarper: "top_k",
    lp.TopPLogitsWarper: "top_p",
    lp.MinPLogitsWarper: "min_p",
    lp.TypicalLogitsWarper: "typical_p",
}


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
        ("greedy_no_repeat_ngram_3", {"max_new_tokens": 8, "no_repeat_ngram_size": 3}, PROMPT_B),
        ("greedy_bad_words_suppress",
         {"max_new_tokens": 8, "bad_words_ids": [[plain_a[0]], [plain_a[1], plain_a[2]]],
          "suppress_tokens": [plain_a[3], 0]}, PROMPT_A),
        # A bad word whose prefix is the whole context (the prompt): Transformers 5.23 matches it
        # (it skips only a prefix longer than the context); one a token longer is skipped.
        ("greedy_bad_words_whole_context",
         {"max_new_tokens": 4, "bad_words_ids": [PROMPT_A + [plain_a[0]],
                                                 [9] + PROMPT_A + [plain_a[1]]]}, PROMPT_A),
        ("greedy_eos_list_min_new_tokens",
         {"max_new_tokens": 8, "eos_token_id": [2, plain_a[1]], "min_new_tokens": 3}, PROMPT_A),
        # min_length counts the prompt: eos is held back for the first 3 new tokens.
        ("greedy_eos_list_min_length",
         {"max_new_tokens": 8, "eos_token_id": [2, plain_a[1]], "min_length": len(PROMPT_A) + 3},
         PROMPT_A),
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
        # Every warper at once, in Transformers' order, after the processors.
        ("sample_all_warpers",
         {"max_new_tokens": 4, "do_sample": True, "repetition_penalty": 1.3,
          "temperature": 1.3, "top_k": 40, "top_p": 0.9, "min_p": 0.05, "typical_p": 0.85},
         PROMPT_B),
    ]


def load(name):
    model = AutoModelForCausalLM.from_pretrained(os.path.join(MODELS_DIR, name),
                                                 dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def raw_scores(model, ids):
    """The last position's logits for the whole sequence, as float32 (generate()'s cast)."""
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    return logits[0, -1].to(torch.float32)


def generate_with_processors(model, cfg, prompt):
    """Runs model.generate for cfg; returns its output and the LogitsProcessorList it built."""
    built = []
    original = model._get_logits_processor

    def keep(*args, **kwargs):
        processors = original(*args, **kwargs)
        built.append(processors)
        return processors

    model._get_logits_processor = keep
    try:
        torch.manual_seed(0)  # sampling cases draw tokens; only their first step is compared
        with torch.no_grad():
            out = model.generate(torch.tensor([prompt]), **cfg, return_dict_in_generate=True,
                                 output_scores=True, output_logits=True)
    finally:
        del model._get_logits_processor
    assert len(built) == 1, "generate() built the processor list more than once"
    return out, built[0]


def stage_names(processors):
    names = []
    for p in processors:
        assert type(p) in STAGE_NAMES, f"unexpected processor {type(p).__name__}"
        names.append(STAGE_NAMES[type(p)])
    return names


def run_chain(processors, ids, raw):
    """Applies Transformers' processors one by one: [(name, class name, scores after it)]."""
    input_ids = torch.tensor([ids])
    s = raw[None].clone()
    stages = []
    for p in processors:
        s = p(input_ids, s.clone())
        stages.append((STAGE_NAMES[type(p)], type(p).__name__, s[0].clone()))
    # The list's own __call__ must give the same result as the stage-by-stage application.
    whole = processors(input_ids, raw[None].clone())[0]
    last = stages[-1][2] if stages else raw
    assert torch.equal(whole, last), "LogitsProcessorList differs from its stages"
    return stages


def kept(s):
    return torch.isfinite(s)


def fragile(processors, ids, raw):
    """True when 1e-4 relative noise on the raw scores changes what any stage filters."""
    stages = run_chain(processors, ids, raw)
    g = torch.Generator().manual_seed(len(ids))
    for _ in range(8):
        noise = (torch.rand(raw.shape, generator=g) * 2 - 1) * 1e-4 * raw.abs().max()
        other = run_chain(processors, ids, raw + noise)
        for (_, _, a), (_, _, b) in zip(stages, other):
            if not torch.equal(kept(a), kept(b)):
                return True
    return False


def close(a, b, tol=1e-5):
    """Same filtered set and finite values within tol * max|b| (the C++ test's metric)."""
    if not torch.equal(kept(a), kept(b)):
        return False
    f = kept(b)
    if not f.any():
        return True
    return float((a[f] - b[f]).abs().max()) <= tol * float(b[f].abs().max())


def first_argmax(s):
    # torch.argmax returns the first of equal maxima, as generate()'s greedy step does.
    return int(torch.argmax(s))


def run_case(model, cfg, prompt, default_eos):
    cfg = dict(cfg)
    cfg.setdefault("eos_token_id", default_eos)
    eos = cfg["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else eos
    gen, processors = generate_with_processors(model, cfg, prompt)
    names = stage_names(processors)
    ids = list(prompt)
    steps, out = [], []
    finished = False
    n_fragile = 0
    for _ in range(cfg["max_new_tokens"]):
        raw = raw_scores(model, ids)
        stages = run_chain(processors, ids, raw)
        final = stages[-1][2] if stages else raw
        n_fragile += fragile(processors, ids, raw)
        tok = first_argmax(final)
        steps.append({"scores": raw, "stages": stages, "token": tok})
        out.append(tok)
        ids.append(tok)
        if tok in eos:
            finished = True
            break

    # generate()'s own numbers: greedy follows the same path, so every step compares; a sampling
    # run draws its own tokens, so only the first step (same input) does.
    compared = len(steps) if not cfg.get("do_sample") else 1
    for i in range(compared):
        assert close(steps[i]["scores"], gen.logits[i][0].float()), f"raw scores, step {i}"
        final = steps[i]["stages"][-1][2] if steps[i]["stages"] else steps[i]["scores"]
        assert close(final, gen.scores[i][0].float()), f"processed scores, step {i}"
    if not cfg.get("do_sample"):
        got = gen.sequences[0, len(prompt):].tolist()
        assert got == out, f"generate() gave {got}, the loop {out}"
    return cfg, names, out, finished, steps, n_fragile


def fmt(x):
    # numpy prints the shortest decimal that reads back as the same float32.
    return str(np.float32(x))


def row(s):
    return "[" + ", ".join("null" if not np.isfinite(x) else fmt(x) for x in s.numpy()) + "]"


def write(path, name, cases):
    lines = ["{", f'  "model": {json.dumps(name)},', '  "dtype": "float32",',
             '  "generator": "tools/reference/make_generation_goldens.py",',
             f'  "reference": {json.dumps(VERSIONS)},', '  "cases": [']
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
            for gi, (stage, cls, s) in enumerate(st["stages"]):
                sep = "," if gi + 1 < len(st["stages"]) else ""
                lines.append(f'            {{"name": {json.dumps(stage)}, '
                             f'"processor": {json.dumps(cls)}, "scores": {row(s)}}}{sep}')
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


def self_test():
    """Edge cases the engine's processors follow, checked on Transformers' classes themselves."""
    t = torch.tensor

    def finite(s):
        return torch.isfinite(s[0]).tolist()

    # Repetition penalty: once per distinct id; a positive score is divided, a negative one
    # multiplied (so both become less likely); 0 stays 0.
    out = lp.RepetitionPenaltyLogitsProcessor(2.0)(t([[0, 0, 1, 3]]), t([[2.0, -2.0, 3.0, 0.0]]))
    assert out[0].tolist() == [1.0, -4.0, 3.0, 0.0], out
    # top_k keeps every token tied with the k-th score.
    out = lp.TopKLogitsWarper(2)(None, t([[1.0, 3.0, 2.0, 2.0, 0.0]]))
    assert finite(out) == [False, True, True, True, False], out
    # top_p keeps the best token even when its probability alone exceeds top_p.
    out = lp.TopPLogitsWarper(0.01)(None, t([[10.0, 0.0, 0.0]]))
    assert finite(out) == [True, False, False], out
    # top_p with tied probabilities at the cut: on rows this short torch 2.15's default sort
    # keeps ties in index order, so the lower index is the one removed (probs .5 .25 .25, p = .6:
    # cumulative .25 .5 1, 1 - p = .4). On a 512-entry row the default (unstable) sort returns
    # ties in another order, so which of several tied tokens at the cut goes is not defined by
    # Transformers; the fragility check keeps such ties out of the goldens.
    out = lp.TopPLogitsWarper(0.6)(None, torch.log(t([[0.5, 0.25, 0.25]])))
    assert finite(out) == [True, False, True], out
    out = lp.TopPLogitsWarper(0.3)(None, torch.log(t([[0.25, 0.25, 0.25, 0.25]])))
    assert finite(out) == [False, False, True, True], out
    # min_p is relative to the top probability.
    out = lp.MinPLogitsWarper(0.2)(None, torch.log(t([[0.5, 0.3, 0.15, 0.05]])))
    assert finite(out) == [True, True, True, False], out
    # typical_p may drop the most likely token: with probs .4 .3 .3 the two .3 are closer to the
    # entropy, and they reach the mass .5.
    out = lp.TypicalLogitsWarper(0.5)(None, torch.log(t([[0.4, 0.3, 0.3]])))
    assert finite(out) == [False, True, True], out
    # no_repeat_ngram 2: after "5 6 ... 5", 6 is banned.
    out = lp.NoRepeatNGramLogitsProcessor(2)(t([[5, 6, 7, 5]]), torch.zeros(1, 8))
    assert torch.isinf(out[0]).nonzero().flatten().tolist() == [6], out
    # Bad words: a 2-token sequence only bans its last token after its prefix; a prefix as long
    # as the context still matches, a longer one is skipped; an eos-only bad word is dropped.
    bad = lp.NoBadWordsLogitsProcessor([[3, 4], [2], [1, 3, 5], [9, 1, 3, 6]], eos_token_id=[2])
    assert finite(bad(t([[1, 3]]), torch.zeros(1, 10))) == [True] * 4 + [False, False] + [True] * 4
    assert torch.isfinite(bad(t([[3, 1]]), torch.zeros(1, 10))).all()
    # min_length counts the prompt, min_new_tokens does not.
    out = lp.MinLengthLogitsProcessor(3, [2])(t([[1, 1]]), torch.zeros(1, 4))
    assert finite(out) == [True, True, False, True], out
    out = lp.MinNewTokensLengthLogitsProcessor(2, 1, [2])(t([[1, 1, 5]]), torch.zeros(1, 4))
    assert torch.isfinite(out).all(), out


def main():
    got = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0]}
    assert got == VERSIONS, f"made with {VERSIONS}, running {got}: install pyproject's pins"
    torch.set_num_threads(1)  # one thread: the same float sums on every machine
    transformers.logging.set_verbosity_error()
    self_test()
    total_fragile = 0
    for name in MODELS:
        model = load(name)
        default_eos = model.generation_config.eos_token_id
        plain = []
        ids = list(PROMPT_A)
        for _ in range(4):
            plain.append(first_argmax(raw_scores(model, ids)))
            ids.append(plain[-1])
        cases = []
        for case_name, cfg, prompt in cases_for(plain):
            cfg, names, out, finished, steps, n_fragile = run_case(model, cfg, prompt,
                                                                   default_eos)
            total_fragile += n_fragile
            print(f"{name:11s} {case_name:42s} -> {out} eos={finished} stages={names} "
                  f"fragile={n_fragile}")
            cases.append((case_name, cfg, prompt, out, finished, steps))
        path = os.path.join(OUT_DIR, f"generation.{name}.float32.json")
        write(path, name, cases)
        print(f"  wrote {path} ({os.path.getsize(path) / 1024:.0f} KiB)")
    assert total_fragile == 0, f"{total_fragile} fragile steps: change the case parameters"


if __name__ == "__main__":
    sys.exit(main())
