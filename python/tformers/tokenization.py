"""AutoTokenizer and the tokenizer it returns, as Transformers' PreTrainedTokenizerFast: the
encoding, decoding and chat templates are the C++ library's (include/tformers/tokenizer.h)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from . import _core
from ._tensors import convert, id_list


class BatchEncoding(dict):
    """input_ids and attention_mask, as a dict that also reads as attributes (inputs.input_ids)."""

    def __getattr__(self, name: str):
        try:
            return self[name]
        except KeyError:
            raise AttributeError(name) from None

    def to(self, device) -> "BatchEncoding":
        """The same encoding: ids stay on the host, and the engine moves them to its device."""
        return self


def _padding_name(padding) -> str:
    if padding is True:
        return "longest"
    if padding is False or padding is None:
        return "do_not_pad"
    return str(padding)


class PreTrainedTokenizerFast:
    """A tokenizer read from tokenizer.json and tokenizer_config.json. Make one with
    AutoTokenizer.from_pretrained."""

    def __init__(self, core: _core.Tokenizer, name_or_path: str):
        self._core = core
        self.name_or_path = name_or_path

    def __call__(self, text, add_special_tokens: bool = True, padding=False, truncation: bool = False,
                 max_length: int | None = None, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, return_tensors: str | None = None,
                 return_attention_mask: bool = True) -> BatchEncoding:
        """input_ids and attention_mask of a text or a list of texts: lists, or numpy arrays with
        return_tensors="np", or torch tensors with return_tensors="pt" (a single text then gives
        one row)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("the tokenizer takes a str or a list of str")
        ids, mask = self._core.batch(texts, add_special_tokens, _padding_name(padding), bool(truncation),
                                     max_length, pad_to_multiple_of, padding_side)
        out = BatchEncoding()
        if return_tensors is None:
            out["input_ids"] = ids[0] if single else ids
            if return_attention_mask:
                out["attention_mask"] = mask[0] if single else mask
            return out
        if len({len(row) for row in ids}) > 1:
            raise ValueError(f"return_tensors={return_tensors!r} needs rows of one length, got lengths "
                             f"{sorted({len(row) for row in ids})}: pass padding=True")
        out["input_ids"] = convert(np.array(ids, dtype=np.int64).reshape(len(ids), -1), return_tensors)
        if return_attention_mask:
            out["attention_mask"] = convert(np.array(mask, dtype=np.int64).reshape(len(ids), -1), return_tensors)
        return out

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text."""
        return self._core.encode(text, add_special_tokens)

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[str]:
        """Token strings of one text."""
        return self._core.tokenize(text, add_special_tokens)

    def decode(self, token_ids, skip_special_tokens: bool = False,
               clean_up_tokenization_spaces: bool | None = None) -> str:
        """Text of one sequence of ids (a list, or a 1-D numpy array or torch tensor)."""
        return self._core.decode(id_list(token_ids), skip_special_tokens, clean_up_tokenization_spaces)

    def batch_decode(self, sequences, skip_special_tokens: bool = False,
                     clean_up_tokenization_spaces: bool | None = None) -> list[str]:
        """Texts of a batch of sequences (a list of lists, or a 2-D array or tensor)."""
        rows = [id_list(s) for s in sequences]
        return self._core.batch_decode(rows, skip_special_tokens, clean_up_tokenization_spaces)

    def convert_ids_to_tokens(self, ids):
        if isinstance(ids, int):
            return self._core.id_to_token(ids)
        return self._core.convert_ids_to_tokens(id_list(ids))

    def convert_tokens_to_ids(self, tokens):
        if isinstance(tokens, str):
            return self._core.token_to_id(tokens)
        return [self._core.token_to_id(t) for t in tokens]

    def apply_chat_template(self, conversation: list[dict[str, Any]], tools: list[dict] | None = None,
                            add_generation_prompt: bool = False, tokenize: bool = True,
                            return_tensors: str | None = None, return_dict: bool = True,
                            chat_template: str | None = None, **kwargs):
        """Renders the chat template (the tokenizer's, or `chat_template`) over the messages;
        extra keyword arguments (enable_thinking=False, ...) reach the template. tokenize=False
        gives the text; otherwise the ids, as a BatchEncoding (return_dict=True, Transformers 5's
        default) or as the ids alone."""
        text = self._core.apply_chat_template(json.dumps(conversation), add_generation_prompt,
                                              json.dumps(tools), json.dumps(kwargs), chat_template or "")
        if not tokenize:
            return text
        # The template writes the special tokens itself, as Transformers assumes.
        enc = self(text, add_special_tokens=False, return_tensors=return_tensors)
        return enc if return_dict else enc["input_ids"]

    def __len__(self) -> int:
        return len(self._core)

    @property
    def vocab_size(self) -> int:
        return len(self._core)

    bos_token = property(lambda self: self._core.bos_token or None)
    eos_token = property(lambda self: self._core.eos_token or None)
    unk_token = property(lambda self: self._core.unk_token or None)
    bos_token_id = property(lambda self: self._core.bos_token_id)
    eos_token_id = property(lambda self: self._core.eos_token_id)
    unk_token_id = property(lambda self: self._core.unk_token_id)
    pad_token_id = property(lambda self: self._core.pad_token_id)
    model_max_length = property(lambda self: self._core.model_max_length)
    chat_template = property(lambda self: self._core.chat_template or None)

    @property
    def pad_token(self) -> str | None:
        return self._core.pad_token or None

    @pad_token.setter
    def pad_token(self, token: str) -> None:
        self._core.pad_token = token

    @property
    def padding_side(self) -> str:
        return self._core.padding_side

    @padding_side.setter
    def padding_side(self, side: str) -> None:
        self._core.padding_side = side

    @property
    def init_kwargs(self) -> dict:
        """tokenizer_config.json as read."""
        return json.loads(self._core.config_json)

    def __repr__(self) -> str:
        return f"PreTrainedTokenizerFast(name_or_path={self.name_or_path!r}, vocab_size={len(self)})"


class AutoTokenizer:
    """Transformers' AutoTokenizer: from_pretrained reads a model folder or a Hub id in the local
    cache."""

    def __init__(self):
        raise OSError("AutoTokenizer is instantiated with AutoTokenizer.from_pretrained(path)")

    @staticmethod
    def from_pretrained(pretrained_model_name_or_path, revision: str = "main",
                        padding_side: str | None = None) -> PreTrainedTokenizerFast:
        path = str(pretrained_model_name_or_path)
        tok = PreTrainedTokenizerFast(_core.Tokenizer.from_pretrained(path, revision), path)
        if padding_side is not None:
            tok.padding_side = padding_side
        return tok
