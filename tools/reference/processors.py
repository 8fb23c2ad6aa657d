"""Logits processors and warpers with the semantics of Transformers' generation/logits_process.py,
in the order GenerationMixin._get_logits_processor builds them (batch size 1, no beams).

scores: float32 [V] logits of the last position (generate() casts them to float32 first);
input_ids: list of ints, the prompt followed by the tokens generated so far.
Filtered entries become -inf (the warpers' default filter_value).

make_beam_goldens.py applies this chain. make_generation_goldens.py takes its goldens from
Transformers' own processor classes and checks that this chain ends with the same scores on
every step of every case (check_processors_py), so the two cannot drift apart unnoticed.
"""

import torch

NEG_INF = float("-inf")


def repetition_penalty(input_ids, scores, penalty):
    # gather/scatter over input_ids: an id seen several times is penalized once.
    ids = torch.tensor(sorted(set(input_ids)), dtype=torch.int64)
    s = scores[ids]
    s = torch.where(s < 0, s * penalty, s / penalty)
    out = scores.clone()
    out[ids] = s
    return out


def no_repeat_ngram(input_ids, scores, n):
    cur_len = len(input_ids)
    out = scores.clone()
    if cur_len + 1 < n:
        return out
    banned = []
    prefix = tuple(input_ids[cur_len + 1 - n :]) if n > 1 else ()
    for i in range(cur_len - n + 1):
        if tuple(input_ids[i : i + n - 1]) == prefix:
            banned.append(input_ids[i + n - 1])
    if banned:
        out[torch.tensor(banned)] = NEG_INF
    return out


def no_bad_words(input_ids, scores, bad_words_ids, eos_token_ids):
    out = scores.clone()
    # Sequences that are just an eos token are dropped, as Transformers does.
    seqs = [s for s in bad_words_ids if all(s != [e] for e in eos_token_ids)]
    for seq in seqs:
        prefix = seq[:-1]
        if len(prefix) > len(input_ids):
            continue
        if len(prefix) == 0 or input_ids[len(input_ids) - len(prefix) :] == prefix:
            out[seq[-1]] = NEG_INF
    return out


def min_length(input_ids, scores, length, eos_token_ids):
    out = scores.clone()
    if len(input_ids) < length:
        out[torch.tensor(eos_token_ids)] = NEG_INF
    return out


def min_new_tokens(input_ids, scores, prompt_len, count, eos_token_ids):
    out = scores.clone()
    if len(input_ids) - prompt_len < count:
        out[torch.tensor(eos_token_ids)] = NEG_INF
    return out


def suppress_tokens(scores, ids):
    out = scores.clone()
    out[torch.tensor(ids)] = NEG_INF
    return out


def temperature(scores, t):
    return scores / t


def top_k(scores, k, min_tokens_to_keep=1):
    k = min(max(k, min_tokens_to_keep), scores.shape[-1])
    kth = torch.topk(scores, k).values[-1]
    # Every token tied with the k-th score survives.
    return scores.masked_fill(scores < kth, NEG_INF)


def top_p(scores, p, min_tokens_to_keep=1):
    sorted_logits, sorted_idx = torch.sort(scores, descending=False)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    remove_sorted = cum <= (1 - p)
    remove_sorted[-min_tokens_to_keep:] = False  # the best token always stays
    remove = remove_sorted.scatter(0, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, NEG_INF)


def min_p(scores, p, min_tokens_to_keep=1):
    probs = torch.softmax(scores, dim=-1)
    remove = probs < p * probs.max()
    sorted_idx = torch.argsort(scores, descending=True)
    remove_sorted = remove[sorted_idx]
    remove_sorted[:min_tokens_to_keep] = False
    remove = remove_sorted.scatter(0, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, NEG_INF)


def typical_p(scores, mass, min_tokens_to_keep=1):
    normalized = torch.log_softmax(scores, dim=-1)
    p = torch.exp(normalized)
    ent = -(normalized * p).nansum(-1, keepdim=True)
    shifted = torch.abs((-normalized) - ent)
    sorted_scores, sorted_idx = torch.sort(shifted, descending=False)
    sorted_logits = scores.gather(-1, sorted_idx)
    cum = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
    last_ind = int((cum < mass).sum())
    last_ind = min(last_ind, sorted_scores.shape[-1] - 1)
    remove_sorted = sorted_scores > sorted_scores[last_ind]
    remove_sorted[:min_tokens_to_keep] = False
    remove = remove_sorted.scatter(0, sorted_idx, remove_sorted)
    return scores.masked_fill(remove, NEG_INF)


def process(cfg, prompt_len, input_ids, scores):
    """Applies the chain a GenerationConfig-like dict selects, in Transformers' order.

    Returns [(processor name, scores after it)] so a test can check each stage.
    """
    eos = cfg.get("eos_token_id")
    eos = [eos] if isinstance(eos, int) else (eos or [])
    stages = []

    def add(name, s):
        stages.append((name, s))
        return s

    s = scores
    if cfg.get("repetition_penalty", 1.0) != 1.0:
        s = add("repetition_penalty", repetition_penalty(input_ids, s, cfg["repetition_penalty"]))
    if cfg.get("no_repeat_ngram_size", 0) > 0:
        s = add("no_repeat_ngram", no_repeat_ngram(input_ids, s, cfg["no_repeat_ngram_size"]))
    if cfg.get("bad_words_ids"):
        s = add("no_bad_words", no_bad_words(input_ids, s, cfg["bad_words_ids"], eos))
    if cfg.get("min_length", 0) > 0 and eos:
        s = add("min_length", min_length(input_ids, s, cfg["min_length"], eos))
    if cfg.get("min_new_tokens", 0) > 0 and eos:
        s = add("min_new_tokens", min_new_tokens(input_ids, s, prompt_len, cfg["min_new_tokens"],
                                                 eos))
    if cfg.get("suppress_tokens"):
        s = add("suppress_tokens", suppress_tokens(s, cfg["suppress_tokens"]))
    if cfg.get("do_sample", False):
        if cfg.get("temperature", 1.0) != 1.0:
            s = add("temperature", temperature(s, cfg["temperature"]))
        if cfg.get("top_k", 50):  # GenerationConfig's default top_k is 50
            s = add("top_k", top_k(s, cfg.get("top_k", 50)))
        if cfg.get("top_p", 1.0) < 1.0:
            s = add("top_p", top_p(s, cfg["top_p"]))
        if cfg.get("min_p") is not None:
            s = add("min_p", min_p(s, cfg["min_p"]))
        if cfg.get("typical_p", 1.0) < 1.0:
            s = add("typical_p", typical_p(s, cfg["typical_p"]))
    return stages


def self_test():
    """Hand-computed edge cases (the ones issue 4 names)."""
    t = torch.tensor
    # Repetition penalty: once per distinct id, positive divided, negative multiplied.
    out = repetition_penalty([0, 0, 1], t([2.0, -2.0, 3.0]), 2.0)
    assert out.tolist() == [1.0, -4.0, 3.0], out
    # top_k keeps every token tied with the k-th score.
    out = top_k(t([1.0, 3.0, 2.0, 2.0, 0.0]), 2)
    assert torch.isfinite(out).tolist() == [False, True, True, True, False], out
    # top_p keeps the best token even when its probability alone exceeds top_p.
    out = top_p(t([10.0, 0.0, 0.0]), 0.01)
    assert torch.isfinite(out).tolist() == [True, False, False], out
    # top_p keeps the smallest set whose mass reaches top_p: probs .5 .25 .25 with p = .6.
    out = top_p(torch.log(t([0.5, 0.25, 0.25])), 0.6)
    assert int(torch.isfinite(out).sum()) == 2, out
    # min_p: keeps tokens with prob >= min_p * max prob.
    out = min_p(torch.log(t([0.5, 0.3, 0.15, 0.05])), 0.2)
    assert torch.isfinite(out).tolist() == [True, True, True, False], out
    # no_repeat_ngram 2: after "5 6 ... 5", 6 is banned.
    out = no_repeat_ngram([5, 6, 7, 5], torch.zeros(8), 2)
    assert torch.isinf(out).nonzero().flatten().tolist() == [6], out
    # bad words: a 2-token sequence only bans its last token after its prefix.
    assert torch.isfinite(no_bad_words([1, 3], torch.zeros(5), [[3, 4]], [2])).all() == False
    assert torch.isfinite(no_bad_words([3, 1], torch.zeros(5), [[3, 4]], [2])).all()
    # an eos-only bad word is ignored.
    assert torch.isfinite(no_bad_words([1], torch.zeros(5), [[2]], [2])).all()
