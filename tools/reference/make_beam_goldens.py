"""Writes tests/data/goldens/beam_search.<model>.float32.json: beam search goldens (issue 18).

Beam search as Transformers' GenerationMixin._beam_search (4.50 and later) runs it, written here
over (batch, num_beams, ...) tensors with torch.topk, from its documented semantics:

- Scores are float32: log_softmax of the last position's logits, then the logits processors
  (processors.py, Transformers' order), plus the beam's running score. At the start only the
  first beam is live (the others start at -1e9).
- Each step keeps the top beams_to_keep = max(2, 1 + number of eos ids) * num_beams
  continuations over all beams of a prompt. A continuation "hits" when its token is an eos id or
  it reaches max_new_tokens.
- Running beams for the next step: the top num_beams after adding -1e9 to those that hit.
- Finished beams: among the first num_beams continuations, those that hit, scored
  sum(log p) / generated_length ** length_penalty (generated_length counts the eos), compete with
  the finished ones so far; the top num_beams stay. Nothing is added once a prompt's finished set
  is full with early_stopping=True, or once the early-stop heuristic says no running beam can
  improve (each added as -1e9, as Transformers does).
- The heuristic: the best running beam scored at the current length (at max length when
  early_stopping="never" and length_penalty > 0) must beat the worst finished score, while any
  finished slot is empty (-1e9) it always does.
- The loop ends when no prompt can improve, or all are full with early_stopping=True, or every
  continuation hit.
- Output: the best num_return_sequences finished beams per prompt, cropped to the longest
  returned length; shorter ones are filled with `pad_token_id or eos_token_id[0]`.

Each prompt row is computed alone by the reference model (reference.py, whole sequence every
step): that is what left padding with a mask computes in Transformers, and what tformers'
batching must reproduce.

Self-check: every case is rerun 6 times with each step's logits perturbed by 1e-4 relative noise;
a case whose sequences change is fragile (the run fails), so the goldens only hold decisions that
an implementation within the logits tolerance must reproduce.

Run: /usr/bin/python3 tools/reference/make_beam_goldens.py
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_goldens import fmt  # noqa: E402
from processors import process  # noqa: E402
from reference import Model, load_checkpoint  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODELS_DIR = os.path.join(ROOT, "tests", "data", "models")
OUT_DIR = os.path.join(ROOT, "tests", "data", "goldens")
MODELS = ["tiny-llama", "tiny-qwen3"]
PROMPT_A = [1, 17, 300, 45]
PROMPT_B = [1, 400, 3, 3, 3, 9, 200, 51, 7, 7, 128]
IMPOSSIBLE = -1.0e9


def gather_beams(x, idx):
    """x (B, M, ...) gathered along dim 1 by idx (B, K)."""
    while idx.dim() < x.dim():
        idx = idx.unsqueeze(-1)
    return torch.take_along_dim(x, idx.expand(*idx.shape[:2], *x.shape[2:]), dim=1)


def beam_search(model, prompts, cfg, noise=None):
    eos = cfg["eos_token_id"]
    eos = [eos] if isinstance(eos, int) else eos
    K = cfg["num_beams"]
    N = cfg["max_new_tokens"]
    lp = cfg.get("length_penalty", 1.0)
    es = cfg.get("early_stopping", False)
    R = cfg.get("num_return_sequences", 1)
    pad = cfg.get("pad_token_id")
    B = len(prompts)
    V = model.config["vocab_size"]
    keep = max(2, 1 + len(eos)) * K
    top_mask = torch.cat([torch.ones(K, dtype=torch.bool), torch.zeros(keep - K, dtype=torch.bool)])
    fill = (pad or eos[0]) if eos else -1

    running = torch.full((B, K, N), fill, dtype=torch.int64)
    running_scores = torch.zeros(B, K)
    running_scores[:, 1:] = IMPOSSIBLE
    running_len = torch.zeros(B, K, dtype=torch.int64)
    seqs = running.clone()
    seq_len = running_len.clone()
    scores = torch.full((B, K), IMPOSSIBLE)
    sent_finished = torch.zeros(B, K, dtype=torch.bool)
    unsatisfied = torch.ones(B, 1, dtype=torch.bool)

    for t in range(N):
        rows = []
        for b in range(B):
            for k in range(K):
                ids = prompts[b] + running[b, k, :t].tolist()
                logits = model.forward(ids)[-1].to(torch.float32)
                if noise is not None:
                    logits = logits + (torch.rand(V, generator=noise) * 2 - 1) * 1e-4 * logits.abs().max()
                log_probs = torch.log_softmax(logits, dim=-1)
                stages = process(cfg, len(prompts[b]), ids, log_probs)
                rows.append(stages[-1][1] if stages else log_probs)
        log_probs = torch.stack(rows).view(B, K, V) + running_scores[:, :, None]
        topk_lp, topk_idx = torch.topk(log_probs.view(B, K * V), k=keep)
        parent = topk_idx // V
        token = topk_idx % V
        cand = gather_beams(running, parent)
        cand[:, :, t] = token
        cand_len = torch.full((B, keep), t + 1, dtype=torch.int64)
        hits = torch.isin(token, torch.tensor(eos)) | (t + 1 == N)

        cand_running_lp = topk_lp + hits.to(torch.float32) * IMPOSSIBLE
        nxt = torch.topk(cand_running_lp, k=K)[1]
        running = gather_beams(cand, nxt)
        running_scores = gather_beams(cand_running_lp, nxt)

        just_finished = hits & top_mask[None, :]
        cand_fin = topk_lp / ((t + 1) ** lp)
        full = torch.all(sent_finished, dim=-1, keepdim=True) & (es is True)
        cand_fin = cand_fin + full.to(torch.float32) * IMPOSSIBLE
        cand_fin = cand_fin + (~unsatisfied).to(torch.float32) * IMPOSSIBLE
        cand_fin = cand_fin + (~just_finished).to(torch.float32) * IMPOSSIBLE
        merged_scores = torch.cat([scores, cand_fin], dim=1)
        best = torch.topk(merged_scores, k=K)[1]
        seqs = gather_beams(torch.cat([seqs, cand], dim=1), best)
        seq_len = gather_beams(torch.cat([seq_len, cand_len], dim=1), best)
        scores = gather_beams(merged_scores, best)
        sent_finished = gather_beams(torch.cat([sent_finished, just_finished], dim=1), best)

        length = N if (es == "never" and lp > 0) else t + 1
        best_running = running_scores[:, :1] / (length ** lp)
        worst = torch.where(sent_finished, torch.min(scores, dim=1, keepdim=True)[0],
                            torch.tensor(IMPOSSIBLE))
        unsatisfied = unsatisfied & torch.any(best_running > worst, dim=-1, keepdim=True)

        improvement = bool(torch.any(unsatisfied))
        open_beam = not (bool(torch.all(sent_finished)) and es is True)
        if not (improvement and open_beam and not bool(torch.all(hits))):
            break

    out_len = int(seq_len[:, :R].max())
    sequences, out_scores = [], []
    for b in range(B):
        for r in range(R):
            sequences.append(prompts[b] + seqs[b, r, :out_len].tolist())
            out_scores.append(float(scores[b, r]))
    return sequences, out_scores


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
             '  "generator": "tools/reference/make_beam_goldens.py",', '  "cases": [']
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


def main():
    torch.set_num_threads(2)
    n_fragile = 0
    for name in MODELS:
        config, weights = load_checkpoint(os.path.join(MODELS_DIR, name))
        model = Model(config, weights, torch.float32)
        plain, _ = beam_search(model, [PROMPT_A], {"num_beams": 2, "max_new_tokens": 4,
                                                   "eos_token_id": []})
        cases = []
        for case_name, cfg, prompts in cases_for(plain[0][len(PROMPT_A):]):
            cfg = dict(cfg)
            cfg.setdefault("eos_token_id", config["eos_token_id"])
            seqs, scores = beam_search(model, prompts, cfg)
            noise = torch.Generator().manual_seed(0)
            fragile = sum(beam_search(model, prompts, cfg, noise)[0] != seqs for _ in range(6))
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
    main()
