"""AutoTokenizer: Transformers' call forms and return types over the C++ tokenizer. Ids are
checked against Hugging Face `tokenizers` (the test group) where it is installed."""

import importlib.util
import json

import numpy as np
import pytest

from conftest import CORPUS, KJV, MODELS, NPM_TOKENIZERS

TEXTS = ["And the LORD said", "Blessed are the meek: for they shall inherit the earth.", "x"]


def test_ids_match_the_tokenizers_library(kjv_tokenizer):
    tokenizers = pytest.importorskip("tokenizers")
    reference = tokenizers.Tokenizer.from_file(str(KJV / "tokenizer.json"))
    for text in TEXTS + ["Ünïcödé, 中文, emoji 🎉🦀, and\ttabs\n"]:
        assert kjv_tokenizer(text)["input_ids"] == reference.encode(text).ids, text
        assert kjv_tokenizer.encode(text) == reference.encode(text).ids


@pytest.mark.parametrize("folder", NPM_TOKENIZERS, ids=lambda folder: folder.parent.name)
def test_shipped_tokenizers_give_the_tokenizers_librarys_ids(folder):
    """tokenizer.json as the Rust library reads it. A Llama or Gemma tokenizer_config.json's
    add_bos_token / add_eos_token decide the special tokens instead, as Transformers 4's
    LlamaTokenizerFast and GemmaTokenizerFast rebuild the post-processor from them (DeepSeek-V3's
    tokenizer.json adds no BOS, its config does)."""
    tokenizers = pytest.importorskip("tokenizers")
    from tformers import AutoTokenizer

    reference = tokenizers.Tokenizer.from_file(str(folder / "tokenizer.json"))
    ours = AutoTokenizer.from_pretrained(folder)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    rebuilt = config.get("tokenizer_class", "").startswith(("LlamaTokenizer", "GemmaTokenizer"))
    for text in CORPUS:
        plain = reference.encode(text, add_special_tokens=False).ids
        assert ours(text, add_special_tokens=False)["input_ids"] == plain, text
        want = reference.encode(text).ids
        if rebuilt:
            want = [ours.bos_token_id] * bool(config.get("add_bos_token", True)) + plain + \
                [ours.eos_token_id] * bool(config.get("add_eos_token", False))
        assert ours(text)["input_ids"] == want, text


def test_a_string_gives_lists_and_return_tensors_np_gives_one_row(kjv_tokenizer):
    plain = kjv_tokenizer(TEXTS[0])
    assert isinstance(plain["input_ids"], list) and plain["attention_mask"] == [1] * len(plain["input_ids"])
    enc = kjv_tokenizer(TEXTS[0], return_tensors="np")
    assert enc.input_ids.shape == (1, len(plain["input_ids"])) and enc.input_ids.dtype == np.int64
    assert enc.input_ids[0].tolist() == plain["input_ids"]
    assert set(enc) == {"input_ids", "attention_mask"}


def test_a_list_pads_on_the_tokenizers_side_and_masks_the_padding(kjv_tokenizer):
    lengths = [len(kjv_tokenizer(t)["input_ids"]) for t in TEXTS]
    for side in ("left", "right"):
        enc = kjv_tokenizer(TEXTS, padding=True, padding_side=side, return_tensors="np")
        assert enc["input_ids"].shape == (3, max(lengths))
        assert enc["attention_mask"].sum(axis=1).tolist() == lengths
        first_real = enc["attention_mask"][2].argmax()
        assert (first_real > 0) == (side == "left")
    with pytest.raises(ValueError, match="padding=True"):
        kjv_tokenizer(TEXTS, return_tensors="np")


def test_return_tensors_pt_without_torch_names_np():
    if importlib.util.find_spec("torch") is not None:
        pytest.skip("torch is installed")
    from tformers import AutoTokenizer

    with pytest.raises(ImportError, match='return_tensors="np"'):
        AutoTokenizer.from_pretrained(KJV)("hi", return_tensors="pt")


def test_return_tensors_pt_gives_int64_tensors(kjv_tokenizer):
    torch = pytest.importorskip("torch")
    enc = kjv_tokenizer(TEXTS, padding=True, return_tensors="pt")
    assert isinstance(enc["input_ids"], torch.Tensor) and enc["input_ids"].dtype == torch.int64
    assert kjv_tokenizer.batch_decode(enc["input_ids"], skip_special_tokens=True) == TEXTS


def test_decode_takes_lists_numpy_rows_and_batches(kjv_tokenizer):
    enc = kjv_tokenizer(TEXTS, padding=True, padding_side="left", return_tensors="np")
    assert kjv_tokenizer.batch_decode(enc["input_ids"], skip_special_tokens=True) == TEXTS
    assert kjv_tokenizer.decode(enc["input_ids"][0], skip_special_tokens=True) == TEXTS[0]
    assert kjv_tokenizer.decode(kjv_tokenizer.encode(TEXTS[1])) == TEXTS[1]
    with pytest.raises(ValueError, match="batch_decode"):
        kjv_tokenizer.decode(enc["input_ids"])


def test_chat_template_text_and_ids(kjv_tokenizer):
    messages = [{"role": "user", "content": "Who begat Enos?"}]
    text = kjv_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert "Who begat Enos?" in text and text != kjv_tokenizer.apply_chat_template(messages, tokenize=False)
    ids = kjv_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=False)
    assert ids == kjv_tokenizer.encode(text, add_special_tokens=False)
    enc = kjv_tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="np")
    assert enc["input_ids"][0].tolist() == ids


def test_special_tokens_and_vocabulary(kjv_tokenizer):
    assert len(kjv_tokenizer) == 4096
    assert kjv_tokenizer.eos_token is not None
    assert kjv_tokenizer.convert_tokens_to_ids(kjv_tokenizer.eos_token) == kjv_tokenizer.eos_token_id
    assert kjv_tokenizer.convert_ids_to_tokens(kjv_tokenizer.eos_token_id) == kjv_tokenizer.eos_token


def test_missing_folder_is_file_not_found():
    from tformers import AutoTokenizer

    with pytest.raises(FileNotFoundError, match="no-such-model"):
        AutoTokenizer.from_pretrained("/nonexistent/no-such-model")


def test_a_folder_without_a_tokenizer_is_an_oserror_naming_it():
    from tformers import AutoTokenizer

    with pytest.raises(OSError, match="tokenizer.json"):
        AutoTokenizer.from_pretrained(MODELS / "tiny-glm4")
