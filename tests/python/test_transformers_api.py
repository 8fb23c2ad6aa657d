"""Transformers' model and tokenizer calls besides generate() and encoding, against Transformers
itself: each gives Transformers' output, or raises the exception type it raises. Needs torch and
transformers (the `reference` group); skipped without them."""

import functools
import json
import os

import numpy as np
import pytest

from conftest import CORPUS, KJV, MODELS, NPM_TOKENIZERS, tokenizer_folders

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import tformers  # noqa: E402

PROMPT = [3, 141, 59, 265, 358, 97, 93, 238, 46, 264, 338, 327]
HF_MODELS = sorted(MODELS.glob("hf-*"))
TOKENIZERS = [KJV, MODELS / "tiny-qwen3", *NPM_TOKENIZERS]


def tokenizer_id(folder):
    return folder.parent.name if folder.name == "models" else folder.name


def load_pair(folder):
    # MXFP4 experts (gpt-oss) dequantized by Transformers, as it runs them on a CPU.
    mxfp4 = json.loads((folder / "config.json").read_text()).get("quantization_config", {})
    extra = ({"quantization_config": transformers.Mxfp4Config(dequantize=True)}
             if mxfp4.get("quant_method") == "mxfp4" else {})
    ref = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, **extra).eval()
    return ref, tformers.AutoModelForCausalLM.from_pretrained(folder, dtype="float32")


@pytest.fixture(scope="module")
def llama():
    return load_pair(MODELS / "hf-llama")


def greedy(ref, ours, **settings):
    """(Transformers' output, ours) of one greedy generate() from PROMPT."""
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        expected = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, **settings)
    return expected, ours.generate(ids, do_sample=False, **settings)


def test_generation_config_reads_generation_config_json(llama):
    ref, ours = llama
    assert isinstance(ours.generation_config, tformers.GenerationConfig)
    for field in ("bos_token_id", "eos_token_id", "pad_token_id"):
        assert getattr(ours.generation_config, field) == getattr(ref.generation_config, field), field


def test_a_changed_generation_config_applies_to_generate():
    ref, ours = load_pair(MODELS / "hf-qwen3")
    for model in (ref, ours):
        model.generation_config.max_new_tokens = 5
        model.generation_config.eos_token_id = None
    expected, got = greedy(ref, ours)
    assert got.shape == (1, len(PROMPT) + 5)
    assert got.tolist() == expected.tolist()


def test_eval_and_to_give_the_model_itself(llama):
    ref, ours = llama
    assert ref.eval() is ref and ours.eval() is ours
    assert ref.to("cpu") is ref and ours.to("cpu") is ours
    assert ours.to(torch.device("cpu")) is ours and ours.to("cpu", non_blocking=True) is ours
    assert ours.to(torch.float32) is ours and ours.to("cpu", dtype=torch.float32) is ours


def test_to_another_device_or_dtype_says_how_to_load_it(llama):
    _, ours = llama
    with pytest.raises(ValueError, match=r"dtype='bfloat16'"):
        ours.to(torch.bfloat16)
    with pytest.raises(ValueError, match=r"device_map='cuda'"):
        ours.to("cuda:0")


def test_can_generate(llama):
    ref, ours = llama
    assert ours.can_generate() is ref.can_generate() is True


@pytest.mark.parametrize("folder", HF_MODELS, ids=lambda f: f.name)
def test_num_parameters(folder):
    ref, ours = load_pair(folder)
    for exclude_embeddings in (False, True):
        assert ours.num_parameters(exclude_embeddings=exclude_embeddings) == \
            ref.num_parameters(exclude_embeddings=exclude_embeddings), exclude_embeddings


@pytest.mark.parametrize("normalize_logits", [False, True])
def test_compute_transition_scores(llama, normalize_logits):
    ref, ours = llama
    settings = dict(max_new_tokens=6, min_new_tokens=6, return_dict_in_generate=True, output_scores=True)
    expected, got = greedy(ref, ours, **settings)
    want = ref.compute_transition_scores(expected.sequences, expected.scores, normalize_logits=normalize_logits)
    # The same function over Transformers' own outputs, and over ours.
    same_inputs = ours.compute_transition_scores(expected.sequences, expected.scores,
                                                 normalize_logits=normalize_logits)
    assert isinstance(same_inputs, torch.Tensor) and same_inputs.shape == want.shape == (1, 6)
    np.testing.assert_allclose(same_inputs.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)
    ours_scores = ours.compute_transition_scores(got.sequences, got.scores, normalize_logits=normalize_logits)
    np.testing.assert_allclose(ours_scores.numpy(), want.numpy(), rtol=1e-4, atol=1e-4)


def test_compute_transition_scores_of_a_beam_search(llama):
    ref, ours = llama
    ids = torch.tensor([PROMPT])
    with torch.no_grad():
        out = ref.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False, num_beams=3,
                           num_return_sequences=2, max_new_tokens=5, return_dict_in_generate=True,
                           output_scores=True)
    want = ref.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    got = ours.compute_transition_scores(out.sequences, out.scores, out.beam_indices)
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6, atol=1e-6)


@functools.cache
def load_tokenizers(folder):
    """(Transformers' tokenizer, ours) of a folder; tests that change one restore it."""
    return transformers.AutoTokenizer.from_pretrained(folder), tformers.AutoTokenizer.from_pretrained(folder)


ALL_TOKENIZERS = tokenizer_folders({})


@pytest.mark.parametrize("folder", ALL_TOKENIZERS)
def test_get_vocab(folder):
    ref, ours = load_tokenizers(folder)
    assert ours.get_vocab() == ref.get_vocab()


@pytest.mark.parametrize("folder", tokenizer_folders({
    "tokenizer-gemma3": "Transformers 5's GemmaTokenizer adds a mask_token '<mask>' of its own, which "
                        "tokenizer_config.json does not name"}))
def test_special_tokens(folder):
    ref, ours = load_tokenizers(folder)
    assert ours.special_tokens_map == ref.special_tokens_map
    assert ours.all_special_tokens == ref.all_special_tokens
    assert ours.all_special_ids == ref.all_special_ids


@pytest.mark.parametrize("folder", tokenizer_folders())
def test_text_pair(folder):
    ref, ours = load_tokenizers(folder)
    for first, second in zip(CORPUS, reversed(CORPUS)):
        assert ours(first, text_pair=second)["input_ids"] == ref(first, text_pair=second)["input_ids"]
    assert ours(CORPUS[:2], text_pair=CORPUS[2:4])["input_ids"] == ref(CORPUS[:2], text_pair=CORPUS[2:4])["input_ids"]
    assert ours.encode(CORPUS[0], CORPUS[1]) == ref.encode(CORPUS[0], CORPUS[1])


@pytest.mark.parametrize("folder", ALL_TOKENIZERS)
def test_save_pretrained_round_trips_through_transformers(folder, tmp_path):
    ref, ours = load_tokenizers(folder)
    side, ours.padding_side = ours.padding_side, "left"
    try:
        files = ours.save_pretrained(tmp_path / "ours")
    finally:
        ours.padding_side = side
    expected = ref.save_pretrained(tmp_path / "ref")
    assert sorted(os.path.basename(f) for f in files) == sorted(os.path.basename(f) for f in expected)
    again = transformers.AutoTokenizer.from_pretrained(tmp_path / "ours")
    assert again.padding_side == "left"
    assert again.all_special_tokens == ref.all_special_tokens
    for text in CORPUS:
        assert again(text)["input_ids"] == ref(text)["input_ids"], text
    if ref.chat_template is not None:
        assert again.chat_template == ref.chat_template


CHAT = [{"role": "system", "content": "Answer in the words of the King James Bible."},
        {"role": "user", "content": "What is wisdom?"},
        {"role": "assistant", "content": "The fear of the LORD is "}]


def chat_tokenizers():
    return [folder for folder in TOKENIZERS if "chat_template" in (folder / "tokenizer_config.json").read_text()
            or (folder / "chat_template.jinja").exists()]


@pytest.mark.parametrize("folder", chat_tokenizers(), ids=tokenizer_id)
def test_continue_final_message(folder):
    ref, ours = transformers.AutoTokenizer.from_pretrained(folder), tformers.AutoTokenizer.from_pretrained(folder)
    want = ref.apply_chat_template(CHAT, continue_final_message=True, tokenize=False)
    assert ours.apply_chat_template(CHAT, continue_final_message=True, tokenize=False) == want
    assert want.rstrip().endswith("The fear of the LORD is")
    with pytest.raises(ValueError):
        ref.apply_chat_template(CHAT, continue_final_message=True, add_generation_prompt=True)
    with pytest.raises(ValueError):
        ours.apply_chat_template(CHAT, continue_final_message=True, add_generation_prompt=True)


def test_a_batch_of_conversations():
    ref, ours = transformers.AutoTokenizer.from_pretrained(KJV), tformers.AutoTokenizer.from_pretrained(KJV)
    batch = [CHAT[:2], [{"role": "user", "content": "Who begat Enos? 🎉"}]]
    want = ref.apply_chat_template(batch, add_generation_prompt=True, tokenize=False)
    assert isinstance(want, list)
    assert ours.apply_chat_template(batch, add_generation_prompt=True, tokenize=False) == want
    ref.padding_side = ours.padding_side = "left"
    want = ref.apply_chat_template(batch, add_generation_prompt=True, padding=True, return_tensors="pt")
    got = ours.apply_chat_template(batch, add_generation_prompt=True, padding=True, return_tensors="pt")
    assert got["input_ids"].tolist() == want["input_ids"].tolist()
    assert got["attention_mask"].tolist() == want["attention_mask"].tolist()


TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# A tool round trip as the openai SDK sends it back: the assistant's message has content None.
TOOL_ROUND_TRIP = [
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
]


@pytest.mark.parametrize("folder", chat_tokenizers(), ids=tokenizer_id)
def test_tool_round_trip_with_null_content(folder):
    ref, ours = transformers.AutoTokenizer.from_pretrained(folder), tformers.AutoTokenizer.from_pretrained(folder)
    try:
        want = ref.apply_chat_template(TOOL_ROUND_TRIP, tools=TOOLS, add_generation_prompt=True, tokenize=False)
    except Exception as e:
        # Transformers drops the None-valued keys, so a template that reads every message's
        # content (Qwen3's, DeepSeek-V3's) fails on the missing key there too, with its message.
        with pytest.raises(ValueError) as ours_error:
            ours.apply_chat_template(TOOL_ROUND_TRIP, tools=TOOLS, add_generation_prompt=True, tokenize=False)
        assert str(e) in str(ours_error.value)
        return
    assert ours.apply_chat_template(TOOL_ROUND_TRIP, tools=TOOLS, add_generation_prompt=True, tokenize=False) == want


@pytest.mark.parametrize("folder", tokenizer_folders())
def test_offsets_mapping(folder):
    ref, ours = load_tokenizers(folder)
    for text in CORPUS:
        want = ref(text, return_offsets_mapping=True)["offset_mapping"]
        assert ours(text, return_offsets_mapping=True)["offset_mapping"] == want, text
    want = ref(CORPUS[:3], padding=True, return_offsets_mapping=True, return_tensors="pt") if ref.pad_token else None
    if want is not None:
        got = ours(CORPUS[:3], padding=True, return_offsets_mapping=True, return_tensors="pt")
        assert got["offset_mapping"].tolist() == want["offset_mapping"].tolist()
