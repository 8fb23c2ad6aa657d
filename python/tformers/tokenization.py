"""AutoTokenizer and the tokenizer it returns, as Transformers' PreTrainedTokenizerFast: the
encoding, decoding and chat templates are the C++ library's (include/tformers/tokenizer.h)."""

from __future__ import annotations

import json
import os
import shutil
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

    def __call__(self, text, text_pair=None, add_special_tokens: bool = True, padding=False,
                 truncation: bool = False, max_length: int | None = None, pad_to_multiple_of: int | None = None,
                 padding_side: str | None = None, return_tensors: str | None = None,
                 return_attention_mask: bool = True, return_offsets_mapping: bool = False) -> BatchEncoding:
        """input_ids and attention_mask of a text or a list of texts: lists, or numpy arrays with
        return_tensors="np", or torch tensors with return_tensors="pt" (a single text then gives
        one row). text_pair (a text, or a list as long as `text`) encodes pairs with the
        post-processor's pair template, without padding or truncation. return_offsets_mapping
        adds each token's (start, end) characters in its text, (0, 0) for the tokens the
        post-processor and padding add (not with text_pair)."""
        single = isinstance(text, str)
        texts = [text] if single else list(text)
        if not all(isinstance(t, str) for t in texts):
            raise TypeError("the tokenizer takes a str or a list of str")
        if text_pair is not None:
            ids = self._pairs(texts, text_pair, single, add_special_tokens, padding, truncation)
            mask = [[1] * len(row) for row in ids]
        else:
            ids, mask = self._core.batch(texts, add_special_tokens, _padding_name(padding), bool(truncation),
                                         max_length, pad_to_multiple_of, padding_side)
        out = BatchEncoding()
        offsets = None
        if return_offsets_mapping:
            if text_pair is not None:
                raise NotImplementedError("return_offsets_mapping is not available with text_pair in tformers")
            offsets = [self._offsets(t, row, row_mask) for t, row, row_mask in zip(texts, ids, mask)]
        if return_tensors is None:
            out["input_ids"] = ids[0] if single else ids
            if return_attention_mask:
                out["attention_mask"] = mask[0] if single else mask
            if offsets is not None:
                out["offset_mapping"] = offsets[0] if single else offsets
            return out
        if len({len(row) for row in ids}) > 1:
            raise ValueError(f"return_tensors={return_tensors!r} needs rows of one length, got lengths "
                             f"{sorted({len(row) for row in ids})}: pass padding=True")
        out["input_ids"] = convert(np.array(ids, dtype=np.int64).reshape(len(ids), -1), return_tensors)
        if return_attention_mask:
            out["attention_mask"] = convert(np.array(mask, dtype=np.int64).reshape(len(ids), -1), return_tensors)
        if offsets is not None:
            out["offset_mapping"] = convert(np.array(offsets, dtype=np.int64).reshape(len(ids), -1, 2), return_tensors)
        return out

    def _offsets(self, text: str, ids: list[int], mask: list[int]) -> list[tuple[int, int]]:
        """Each token's (start, end) characters in `text`: its bytes are found where the previous
        token's ended (a token that holds part of a character spans the character); (0, 0) for
        padding and for the special tokens the post-processor adds, which the text does not hold."""
        data = text.encode("utf-8")
        char_of = np.repeat(np.arange(len(text)), [len(c.encode("utf-8")) for c in text]).tolist() + [len(text)]
        offsets, at = [], 0
        for token, real in zip(ids, mask):
            piece = self._core.token_bytes(token) if real else b""
            if piece is None:  # an added token: in the text as written, or added by the post-processor
                content = self._core.id_to_token(token)
                # Metaspace tokenizers' added whitespace runs are written with "▁" for the spaces.
                matches = [p for p in (content, content.replace("\u2581", " ")) if data.startswith(p.encode(), at)]
                piece = matches[0].encode() if matches else b""
            elif not data.startswith(piece, at) and piece.startswith(b" ") and data.startswith(piece[1:], at):
                # The space a Metaspace pre-tokenizer puts before the text: it stands on the first
                # character, alone or with the token's other characters.
                piece = piece[1:]
                if not piece and at < len(data):
                    offsets.append((char_of[at], char_of[at] + 1))
                    continue
            elif not data.startswith(piece, at):
                raise NotImplementedError(
                    f"return_offsets_mapping: token {token} does not spell the text at byte {at} (this "
                    "tokenizer's normalizer changes the text), which tformers cannot map back")
            if not piece:
                offsets.append((0, 0))
                continue
            offsets.append((char_of[at], char_of[at + len(piece) - 1] + 1))
            at += len(piece)
        return offsets

    def _pairs(self, texts: list[str], text_pair, single: bool, add_special_tokens: bool, padding,
               truncation) -> list[list[int]]:
        pairs = [text_pair] if isinstance(text_pair, str) else list(text_pair)
        if single != isinstance(text_pair, str) or len(pairs) != len(texts):
            raise ValueError(f"text_pair must be like text: a str for a str, or a list of {len(texts)} str")
        if not all(isinstance(t, str) for t in pairs):
            raise TypeError("text_pair takes a str or a list of str")
        if _padding_name(padding) != "do_not_pad" or truncation:
            raise NotImplementedError("text_pair is encoded without padding or truncation in tformers: "
                                      "pass padding=False and truncation=False")
        return [self._core.encode_pair(a, b, add_special_tokens) for a, b in zip(texts, pairs)]

    def encode(self, text: str, text_pair: str | None = None, add_special_tokens: bool = True) -> list[int]:
        """Token ids of one text (and its pair)."""
        if text_pair is not None:
            return self._core.encode_pair(text, text_pair, add_special_tokens)
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

    def apply_chat_template(self, conversation, tools: list[dict] | None = None,
                            add_generation_prompt: bool = False, continue_final_message: bool | str = False,
                            tokenize: bool = True, padding=False, truncation: bool = False,
                            max_length: int | None = None, return_tensors: str | None = None,
                            return_dict: bool = True, chat_template: str | None = None, **kwargs):
        """Renders the chat template (the tokenizer's, or `chat_template`) over the messages, or
        over each conversation of a list of them; extra keyword arguments (enable_thinking=False,
        ...) reach the template. continue_final_message leaves the last message open for the model
        to continue (True: its content; a field name such as "reasoning_content": that field).
        tokenize=False gives the text (a list of texts for a batch); otherwise the ids, as a
        BatchEncoding (return_dict=True, Transformers 5's default) or as the ids alone."""
        if isinstance(conversation, (list, tuple)) and not conversation:
            raise ValueError("apply_chat_template: the conversation is empty; give at least one message")
        batched = isinstance(conversation, (list, tuple)) and isinstance(conversation[0], (list, tuple))
        if continue_final_message and add_generation_prompt:
            raise ValueError("continue_final_message and add_generation_prompt exclude each other: continue the "
                             "last message, or prompt for a new assistant message")
        template = chat_template or self.chat_template or ""
        texts = [self._render_chat(list(chat), tools, add_generation_prompt, continue_final_message, template,
                                   kwargs) for chat in (conversation if batched else [conversation])]
        text = texts if batched else texts[0]
        if not tokenize:
            return text
        # The template writes the special tokens itself, as Transformers assumes.
        enc = self(text, add_special_tokens=False, padding=padding, truncation=truncation, max_length=max_length,
                   return_tensors=return_tensors)
        return enc if return_dict else enc["input_ids"]

    def _render_chat(self, chat: list, tools, add_generation_prompt: bool, continue_final_message, template: str,
                     kwargs: dict) -> str:
        if not continue_final_message:
            return self._core.apply_chat_template(json.dumps(chat), add_generation_prompt, json.dumps(tools),
                                                  json.dumps(kwargs), template)
        # As Transformers does: a tag after the text to continue, and the rendering cut at the tag.
        field = continue_final_message if isinstance(continue_final_message, str) else "content"
        last = dict(chat[-1]) if chat and isinstance(chat[-1], dict) else {}
        final = last.get(field)
        if final is None:
            raise ValueError(f"continue_final_message is set but the final message has no {field!r} to continue")
        fields = [f for f in _REASONING_FIELDS if last.get(f) == final] if field in _REASONING_FIELDS else [field]
        if not any(f in template for f in fields):
            raise ValueError(f"continue_final_message is set to {field!r}, which the chat template does not read")
        if isinstance(final, (list, tuple)):
            blocks = [dict(b) for b in final]
            text_blocks = [b for b in blocks if "text" in b]
            if not text_blocks:
                raise ValueError("continue_final_message is set but the final message has no text to continue")
            final = text_blocks[-1]["text"]
            text_blocks[-1]["text"] = final + _CONTINUE_TAG
            last[field] = blocks
        else:
            for f in fields:
                last[f] = last[f] + _CONTINUE_TAG
        rendered = self._core.apply_chat_template(json.dumps([*chat[:-1], last]), False, json.dumps(tools),
                                                  json.dumps(kwargs), template)
        if final.strip() not in rendered or _CONTINUE_TAG.strip() not in rendered:
            raise ValueError("continue_final_message is set but the final message does not appear in the chat "
                             "template's output (the template changes it); check the template and the message")
        at = rendered.rindex(_CONTINUE_TAG.strip())
        # A template that strips the message's trailing spaces strips the tag's space too.
        return rendered[:at] if rendered[at:at + len(_CONTINUE_TAG)] == _CONTINUE_TAG else rendered[:at].rstrip()

    def get_vocab(self) -> dict[str, int]:
        """Every token (the model's vocabulary and the added tokens) with its id."""
        tokens = ((self._core.id_to_token(i), i) for i in range(len(self)))
        return {token: i for token, i in tokens if token is not None}

    @property
    def special_tokens_map(self) -> dict[str, str]:
        """The named special tokens (bos_token, eos_token, ...) that are set, as in Transformers 5."""
        config = self.init_kwargs
        named = {"bos_token": self.bos_token, "eos_token": self.eos_token, "unk_token": self.unk_token,
                 "sep_token": _token_text(config.get("sep_token")), "pad_token": self.pad_token,
                 "cls_token": _token_text(config.get("cls_token")),
                 "mask_token": _token_text(config.get("mask_token"))}
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens"))
        # Other "*_token" strings of the config (image_token, ...) are model-specific named tokens.
        specific = {k: v for k, v in config.items() if k.endswith("_token") and k not in named and isinstance(v, str)}
        if isinstance(extra, dict):
            specific.update(extra)
        return {k: v for k, v in {**named, **specific}.items() if v is not None}

    @property
    def all_special_tokens(self) -> list[str]:
        """The named special tokens, then the extra ones (extra_special_tokens, or the older
        additional_special_tokens), each once."""
        config = self.init_kwargs
        extra = config.get("extra_special_tokens", config.get("additional_special_tokens"))
        extra = [_token_text(t) for t in extra] if isinstance(extra, (list, tuple)) else []
        return list(dict.fromkeys([*self.special_tokens_map.values(), *extra]))

    @property
    def all_special_ids(self) -> list[int]:
        return self.convert_tokens_to_ids(self.all_special_tokens)

    def save_pretrained(self, save_directory, **kwargs) -> tuple[str, ...]:
        """Writes tokenizer.json, tokenizer_config.json (with the pad_token and padding_side set
        since loading) and chat_template.jinja into `save_directory`, which from_pretrained (here
        or in Transformers) reads back. Returns the files written."""
        if kwargs:
            raise TypeError(f"save_pretrained: unsupported arguments {sorted(kwargs)}")
        if os.path.isfile(save_directory):
            raise OSError(f"save_pretrained: {save_directory} is a file; give a directory")
        os.makedirs(save_directory, exist_ok=True)
        config = {k: v for k, v in self.init_kwargs.items() if k != "chat_template"}
        config["padding_side"] = self.padding_side
        if self.pad_token is not None:
            config["pad_token"] = self.pad_token
        files = [os.path.join(save_directory, "tokenizer_config.json")]
        with open(files[0], "w", encoding="utf-8") as f:
            f.write(json.dumps(config, indent=2, sort_keys=True, ensure_ascii=False) + "\n")
        if self.chat_template is not None:
            files.append(os.path.join(save_directory, "chat_template.jinja"))
            with open(files[-1], "w", encoding="utf-8") as f:
                f.write(self.chat_template)
        files.append(os.path.join(save_directory, "tokenizer.json"))
        if os.path.abspath(os.path.join(self._core.folder, "tokenizer.json")) != os.path.abspath(files[-1]):
            shutil.copyfile(os.path.join(self._core.folder, "tokenizer.json"), files[-1])
        return tuple(files)

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


# Where a message's reasoning may be (Transformers' _REASONING_FIELDS), and the tag that marks the
# end of the text continue_final_message continues.
_REASONING_FIELDS = ("reasoning_content", "thinking", "reasoning")
_CONTINUE_TAG = "CONTINUE_FINAL_MESSAGE_TAG "


def _token_text(token) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    return token.get("content") if isinstance(token, dict) else token


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
