"""Writes tests/data/goldens/beam_search.<model>.float32.json with Transformers' generate().

Every case runs model.generate(num_beams=..., do_sample=False, ...) of Transformers 5.23.0 on
the float32 checkpoint (eager attention) with return_dict_in_generate and output_scores, and
records the returned sequences and sequences_scores. A batch of prompts of different lengths is
left-padded with an attention mask, as Transformers expects for generation; the padding is
removed from the recorded sequences, so each row is its prompt followed by what was generated.
Sequences shorter than the longest returned one end in `pad_token_id or eos_token_id[0]`, which
is what generate() fills them with (the case's generation_config sets no pad_token_id).

Self-check: every case is rerun 6 times with the logits perturbed by 1e-4 relative noise (a
forward hook on lm_head); a case whose sequences change is fragile (the run fails), so the
goldens only hold decisions that an implementation within the logits tolerance must reproduce.

Run: .venv/bin/python tools/reference/make_beam_goldens.py [MODEL ...]
"""

import json
import os
import sys

import torch
import transformers
from transformers import GenerationConfig

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import OUT_DIR, check_versions, fmt, generate, load, setup_torch  # noqa: E402

MODELS = ["tiny-llama", "tiny-qwen3", "hf-llama", "hf-qwen2", "hf-qwen3", "hf-mistral", "hf-glm",
          "hf-glm4", "hf-gemma3", "hf-qwen3-moe", "hf-mixtral", "hf-glm4-moe"]
PROMPT_A = [1, 17, 300, 45]
PROMPT_B = [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128]
GENERATOR = (f"tools/reference/make_beam_goldens.py (transformers {transformers.__version__}, "
             f"torch {torch.__version__.split('+')[0]})")
PAD_IN = 0  # left padding of the prompts; masked, so its value does not matter


class Noise:
    """A forward hook on lm_head adding uniform noise of 1e-4 times the row's largest |logit|."""

    def __init__(self, seed):
        self.gen = torch.Generator().manual_seed(seed)

    def __call__(self, module, args, out):
        u = torch.rand(out.shape, generator=self.gen, dtype=out.dtype) * 2 - 1
        return out + u * 1e-4 * out.abs().amax(-1, keepdim=True)


@torch.no_grad()
def beam_search(model, prompts, cfg, noise=None):
    """generate()'s sequences (prompt padding removed) and sequences_scores for one case."""
    eos = cfg.get("eos_token_id")
    eos_list = [eos] if isinstance(eos, int) else (eos or [])
    pad = cfg.get("pad_token_id")
    if pad is None:
        pad = eos_list[0] if eos_list else PAD_IN
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[PAD_IN] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    settings = {k: v for k, v in cfg.items() if k not in ("eos_token_id", "pad_token_id")}
    gc = GenerationConfig(do_sample=False, eos_token_id=eos_list or None, pad_token_id=pad,
                          bos_token_id=1, return_dict_in_generate=True, output_scores=True,
                          **settings)
    handle = model.lm_head.register_forward_hook(noise) if noise is not None else None
    try:
        out = generate(model, ids, gc, attention_mask=mask)
    finally:
        if handle is not None:
            handle.remove()
    R = cfg.get("num_return_sequences", 1)
    sequences = []
    for i, row in enumerate(out.sequences.tolist()):
        sequences.append(row[width - len(prompts[i // R]):])
    return sequences, [float(s) for s in out.sequences_scores]


def cases_for(plain):
    """plain: the best hypothesis of a 2-beam search from PROMPT_A without eos, used to aim eos at
    tokens the beams really produce."""
    aimed = [2, plain[2]]
    return [
        ("beams_2", {"num_beams": 2, "max_new_tokens": 6}, [PROMPT_A]),
        ("beams_4_return_3", {"num_beams": 4, "num_return_sequences": 3, "max_new_tokens": 8},
         [PROMPT_B]),
        ("eos_early_stopping_false", {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": aimed,
                                      "num_return_sequences": 3}, [PROMPT_A]),
        ("eos_early_stopping_true", {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": aimed,
                                     "early_stopping": True, "num_return_sequences": 2},
         [PROMPT_A]),
        ("eos_early_stopping_never", {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": aimed,
                                      "early_stopping": "never", "num_return_sequences": 3},
         [PROMPT_A]),
        # eos on the second token of the plain search: on tiny-qwen3 the three early_stopping
        # modes then return three different pairs of hypotheses.
        ("early_stopping_false_lp_2", {"num_beams": 2, "max_new_tokens": 10,
                                       "eos_token_id": [plain[1]], "length_penalty": 2.0,
                                       "early_stopping": False, "num_return_sequences": 2},
         [PROMPT_A]),
        ("early_stopping_true_lp_2", {"num_beams": 2, "max_new_tokens": 10,
                                      "eos_token_id": [plain[1]], "length_penalty": 2.0,
                                      "early_stopping": True, "num_return_sequences": 2},
         [PROMPT_A]),
        ("early_stopping_never_lp_2", {"num_beams": 2, "max_new_tokens": 10,
                                       "eos_token_id": [plain[1]], "length_penalty": 2.0,
                                       "early_stopping": "never", "num_return_sequences": 2},
         [PROMPT_A]),
        ("length_penalty_2_never", {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": aimed,
                                    "length_penalty": 2.0, "early_stopping": "never",
                                    "num_return_sequences": 3}, [PROMPT_A]),
        ("length_penalty_negative", {"num_beams": 3, "max_new_tokens": 8, "eos_token_id": aimed,
                                     "length_penalty": -1.0, "num_return_sequences": 2},
         [PROMPT_A]),
        ("repetition_penalty", {"num_beams": 2, "max_new_tokens": 6, "repetition_penalty": 1.5},
         [PROMPT_B]),
        # Prompts that fill their finished sets at different steps: a full one takes no more.
        ("batch_early_stopping_true", {"num_beams": 2, "max_new_tokens": 10,
                                       "eos_token_id": [plain[1]], "length_penalty": 2.0,
                                       "early_stopping": True, "num_return_sequences": 2},
         [PROMPT_A, PROMPT_B]),
        ("batch_ragged", {"num_beams": 3, "max_new_tokens": 7, "eos_token_id": aimed,
                          "num_return_sequences": 2}, [PROMPT_A, PROMPT_B]),
    ]


def write(path, name, cases):
    lines = ["{", f'  "model": {json.dumps(name)},', '  "dtype": "float32",',
             f'  "generator": {json.dumps(GENERATOR)},', '  "cases": [']
    for ci, (case_name, cfg, prompts, seqs, scores) in enumerate(cases):
        lines.append("    {")
        lines.append(f'      "name": {json.dumps(case_name)},')
        lines.append(f'      "generation_config": {json.dumps(cfg)},')
        lines.append(f'      "input_ids": {json.dumps(prompts)},')
        lines.append(f'      "sequences": {json.dumps(seqs)},')
        lines.append(f'      "sequences_scores": [{", ".join(fmt(s) for s in scores)}]')
        lines.append("    }" + ("," if ci + 1 < len(cases) else ""))
    lines += ["  ]", "}"]
    with open(path, "w") as f:
        f.write("\n".join(lines) + "\n")
    with open(path) as f:
        back = json.load(f)
    assert [c["sequences"] for c in back["cases"]] == [c[3] for c in cases]


def main(names=None):
    check_versions()
    setup_torch()
    n_fragile = 0
    for name in names or MODELS:
        model = load(name, torch.float32)
        plain, _ = beam_search(model, [PROMPT_A], {"num_beams": 2, "max_new_tokens": 4,
                                                   "eos_token_id": []})
        cases = []
        for case_name, cfg, prompts in cases_for(plain[0][len(PROMPT_A):]):
            cfg = dict(cfg)
            cfg.setdefault("eos_token_id", model.generation_config.eos_token_id)
            seqs, scores = beam_search(model, prompts, cfg)
            fragile = sum(beam_search(model, prompts, cfg, Noise(seed))[0] != seqs
                          for seed in range(6))
            n_fragile += fragile
            gen = [s[len(prompts[i // cfg.get("num_return_sequences", 1)]):]
                   for i, s in enumerate(seqs)]
            print(f"{name:11s} {case_name:26s} -> {gen} {[round(s, 4) for s in scores]} "
                  f"fragile={fragile}")
            cases.append((case_name, cfg, prompts, seqs, scores))
        path = os.path.join(OUT_DIR, f"beam_search.{name}.float32.json")
        write(path, name, cases)
        print(f"  wrote {path}")
    assert n_fragile == 0, f"{n_fragile} fragile runs: change the case parameters"


if __name__ == "__main__":
    main(sys.argv[1:])
