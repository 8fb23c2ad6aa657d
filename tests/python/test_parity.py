"""Parity with Transformers itself, live: tiny seeded random models that Transformers builds and
saves (tools/reference/make_hf_models.py's recipe, in float32) are run by both; the shipped
model's chat template is rendered by both; tokenizers give the same ids on a multilingual corpus
with emoji. Needs torch and transformers (the `reference` group); skipped without them."""

import sys

import numpy as np
import pytest

from conftest import CORPUS, KJV, REPO, tokenizer_folders

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

sys.path.insert(0, str(REPO / "tools" / "reference"))
import make_hf_models  # noqa: E402

import tformers  # noqa: E402

PROMPT = [3, 141, 59, 265, 358, 97, 93, 238, 46, 264, 338, 327]
# Each architecture as save_pretrained writes it; a mixture of experts also with its experts fused
# as Transformers 5 holds them (save_pretrained writes one tensor per expert and projection).
ARCHS = sorted(make_hf_models.MODELS) + sorted(f"{m}:fused" for m in make_hf_models.MOE_MODELS)


@pytest.fixture(scope="module", params=ARCHS)
def pair(request, tmp_path_factory):
    """(Transformers' model, tformers' model) of one architecture, the same float32 weights."""
    name, _, layout = request.param.partition(":")
    seed, config_cls, model_cls, overrides, _ = make_hf_models.MODELS[name]
    config = config_cls(**{**make_hf_models.COMMON, **overrides})
    torch.manual_seed(seed)
    ref = model_cls(config).to(torch.float32).eval()
    make_hf_models.redraw(ref, seed, config.tie_word_embeddings, name in make_hf_models.OFFSET_NORMS)
    mxfp4 = name in make_hf_models.MXFP4_EXPERTS
    packed = make_hf_models.use_mxfp4(ref) if mxfp4 else None
    ref.generation_config = transformers.GenerationConfig(bos_token_id=1, eos_token_id=2, pad_token_id=0)
    folder = tmp_path_factory.mktemp(request.param.replace(":", "-"))
    ref.save_pretrained(folder, safe_serialization=True)
    if layout == "fused":
        make_hf_models.save_fused(ref, folder, mtp=False)
    if mxfp4:
        make_hf_models.save_mxfp4(ref, folder, packed)
    # MXFP4 experts dequantized by Transformers, as it runs them on a CPU.
    extra = {"quantization_config": transformers.Mxfp4Config(dequantize=True)} if mxfp4 else {}
    ref = transformers.AutoModelForCausalLM.from_pretrained(
        folder, dtype=torch.float32, attn_implementation="eager", **extra).eval()
    return ref, tformers.AutoModelForCausalLM.from_pretrained(folder, dtype="float32")


def test_f32_logits_within_1e_4(pair):
    ref, ours = pair
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref(ids).logits[0].double().numpy()
    got = ours(ids).logits[0].numpy().astype(np.float64)
    # Per position: the largest difference relative to the largest logit (the C++ goldens' metric).
    err = (np.abs(got - expected).max(-1) / np.abs(expected).max(-1)).max()
    assert err <= 1e-4, err


def test_greedy_ids_equal(pair):
    ref, ours = pair
    settings = dict(do_sample=False, max_new_tokens=16, min_new_tokens=16)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), cache_implementation="static", **settings)
    got = ours.generate(ids, cache_implementation="static", **settings)
    assert got.tolist() == expected.tolist()


@pytest.fixture(scope="module")
def assistants():
    """tiny-llama (the tiny vocabulary of every model here) as Transformers' and as tformers'
    assistant model."""
    folder = REPO / "tests" / "data" / "models" / "tiny-llama"
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    return ref, tformers.AutoModelForCausalLM.from_pretrained(folder, dtype="float32")


def test_assisted_ids_equal(pair, assistants):
    """Assisted generation with another tiny model as the assistant gives the ids of Transformers'
    assisted generation (its greedy search's); a hybrid refuses it, as prompt lookup."""
    (ref, ours), (ref_assistant, our_assistant) = pair, assistants
    ids = torch.tensor([PROMPT])
    settings = dict(do_sample=False, max_new_tokens=16, min_new_tokens=16, num_assistant_tokens=4)
    if "linear_attention" in (ref.config.to_dict().get("layer_types") or []):
        with pytest.raises(ValueError, match="recurrent state"):
            ours.generate(ids, assistant_model=our_assistant, **settings)
        return
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), assistant_model=ref_assistant, **settings)
    got = ours.generate(ids, assistant_model=our_assistant, **settings)
    assert got.tolist() == expected.tolist()


def test_prompt_lookup_ids_equal(pair, request):
    """Prompt lookup decoding gives greedy search's ids, as Transformers' does; a hybrid model,
    whose recurrent state cannot take back a rejected proposal, refuses it."""
    ref, ours = pair
    ids = torch.tensor([PROMPT + PROMPT[:4]])
    settings = dict(do_sample=False, max_new_tokens=16, min_new_tokens=16, prompt_lookup_num_tokens=4)
    if "linear_attention" in (ref.config.to_dict().get("layer_types") or []):
        with pytest.raises(ValueError, match="recurrent state"):
            ours.generate(ids, **settings)
        return
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    got = ours.generate(ids, **settings)
    assert got.tolist() == expected.tolist()


def test_four_beam_ids_equal(pair):
    ref, ours = pair
    settings = dict(do_sample=False, num_beams=4, num_return_sequences=2, max_new_tokens=8)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    got = ours.generate(ids, **settings)
    assert got.tolist() == expected.tolist()


def assert_steps_close(got, expected):
    """Per-step (rows, vocab) scores or logits: the same steps, -inf where Transformers has -inf,
    the rest within 1e-4 of the largest magnitude (the logits' metric above)."""
    assert len(got) == len(expected)
    for t, (g, e) in enumerate(zip(got, expected)):
        g, e = g.numpy().astype(np.float64), e.double().numpy()
        assert g.shape == e.shape, t
        finite = np.isfinite(e)
        assert (np.isfinite(g) == finite).all(), t
        assert np.abs(g[finite] - e[finite]).max() / np.abs(e[finite]).max() <= 1e-4, t


def test_greedy_scores_and_logits_equal(pair):
    ref, ours = pair
    settings = dict(do_sample=False, max_new_tokens=8, min_new_tokens=4, repetition_penalty=1.3,
                    return_dict_in_generate=True, output_scores=True, output_logits=True)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), cache_implementation="static", **settings)
    got = ours.generate(ids, cache_implementation="static", **settings)
    assert got.sequences.tolist() == expected.sequences.tolist()
    assert_steps_close(got.scores, expected.scores)
    assert_steps_close(got.logits, expected.logits)


def test_four_beam_scores_equal(pair):
    ref, ours = pair
    settings = dict(do_sample=False, num_beams=4, num_return_sequences=2, max_new_tokens=8,
                    return_dict_in_generate=True, output_scores=True, output_logits=True)
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), **settings)
    got = ours.generate(ids, **settings)
    assert got.sequences.tolist() == expected.sequences.tolist()
    np.testing.assert_allclose(got.sequences_scores.numpy(), expected.sequences_scores.numpy(), rtol=1e-4)
    assert_steps_close(got.scores, expected.scores)
    assert_steps_close(got.logits, expected.logits)


CONVERSATIONS = [
    [{"role": "user", "content": "Who begat Enos?"}],
    [{"role": "system", "content": "Answer in the words of the King James Bible."},
     {"role": "user", "content": "What is wisdom?"},
     {"role": "assistant", "content": "The fear of the LORD is the beginning of wisdom."},
     {"role": "user", "content": "And understanding? 🎉 中文"}],
]


@pytest.mark.parametrize("generation_prompt", [False, True])
def test_shipped_chat_template_renders_the_same(generation_prompt):
    ref = transformers.AutoTokenizer.from_pretrained(KJV)
    ours = tformers.AutoTokenizer.from_pretrained(KJV)
    for messages in CONVERSATIONS:
        want = ref.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False)
        assert ours.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=False) == want


@pytest.mark.parametrize("folder", tokenizer_folders())
def test_tokenizer_ids_equal_transformers(folder):
    ref = transformers.AutoTokenizer.from_pretrained(folder)
    ours = tformers.AutoTokenizer.from_pretrained(folder)
    for text in CORPUS:
        assert ours(text)["input_ids"] == ref(text)["input_ids"], text
        assert ours(text, add_special_tokens=False)["input_ids"] == ref(text, add_special_tokens=False)["input_ids"]
    if ref.pad_token is not None:  # both refuse to pad without one
        assert ours(CORPUS, padding=True)["input_ids"] == ref(CORPUS, padding=True)["input_ids"]
    ids = ref(CORPUS[3])["input_ids"]
    assert ours.decode(ids, skip_special_tokens=True) == ref.decode(ids, skip_special_tokens=True)
