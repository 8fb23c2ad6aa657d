"""GenerationConfig and the streamers, as in Transformers. The fields are checked and applied by
the C++ library (include/tformers/generation.h), which gets them as JSON."""

from __future__ import annotations

import json
import queue
from typing import Any

import numpy as np

from . import _core
from ._tensors import is_torch_tensor


class GenerationConfig:
    """generate()'s settings, named as Transformers' GenerationConfig (max_new_tokens, do_sample,
    temperature, top_k, top_p, num_beams, eos_token_id, cache_implementation="static",
    disable_compile, seed, ...). Fields left unset take the model's generation_config.json, then
    Transformers' defaults. Values are checked when generate() runs, with errors naming the field."""

    def __init__(self, **kwargs: Any):
        self.__dict__["_fields"] = dict(kwargs)

    def __getattr__(self, name: str):
        try:
            return self.__dict__["_fields"][name]
        except KeyError:
            raise AttributeError(f"GenerationConfig has no field {name!r} set") from None

    def __setattr__(self, name: str, value: Any) -> None:
        self._fields[name] = value

    def update(self, **kwargs: Any) -> None:
        self._fields.update(kwargs)

    def to_dict(self) -> dict[str, Any]:
        return dict(self._fields)

    def to_json_string(self) -> str:
        return json.dumps(self._fields, default=_json_value)

    @classmethod
    def from_pretrained(cls, path: str, config_file_name: str = "generation_config.json") -> "GenerationConfig":
        """The fields of a model folder's generation_config.json."""
        import os

        file = os.path.join(str(path), config_file_name)
        try:
            with open(file, encoding="utf-8") as f:
                return cls(**json.load(f))
        except json.JSONDecodeError as e:
            raise ValueError(f"{file}: not valid JSON ({e})") from None

    def __repr__(self) -> str:
        return f"GenerationConfig({', '.join(f'{k}={v!r}' for k, v in self._fields.items())})"


def _json_value(value):
    """numpy and torch scalars and arrays as JSON numbers and lists."""
    if hasattr(value, "tolist"):
        return value.tolist()
    raise TypeError(f"generate(): a value of type {type(value).__name__} is not a number, string or list")


class BaseStreamer:
    """What generate() calls: put(ids) with the prompt and then each new token, end() at the end."""

    def put(self, value) -> None:
        raise NotImplementedError

    def end(self) -> None:
        raise NotImplementedError


class TextStreamer(BaseStreamer):
    """Prints text to stdout as soon as it is final (never half a UTF-8 character), as
    Transformers' TextStreamer. skip_prompt=True leaves the prompt out; decode_kwargs take
    skip_special_tokens. Batch size 1 only."""

    def __init__(self, tokenizer, skip_prompt: bool = False, **decode_kwargs):
        self.tokenizer = tokenizer
        self.skip_prompt = skip_prompt
        self.skip_special_tokens = bool(decode_kwargs.pop("skip_special_tokens", False))
        if decode_kwargs:
            raise TypeError(f"TextStreamer: unsupported decode arguments {sorted(decode_kwargs)}; "
                            "only skip_special_tokens is taken")
        self._reset()

    def _reset(self) -> None:
        self._decoder = _core.TokenStreamer(self.tokenizer._core, self.skip_special_tokens)
        self.next_tokens_are_prompt = True

    def put(self, value) -> None:
        if is_torch_tensor(value):
            value = value.detach().cpu().numpy()
        ids = np.asarray(value)
        if ids.ndim > 1 and ids.shape[0] > 1:
            raise ValueError("TextStreamer only supports batch size 1")
        if self.skip_prompt and self.next_tokens_are_prompt:
            self.next_tokens_are_prompt = False
            return
        self.next_tokens_are_prompt = False
        text = "".join(self._decoder.put(int(i)) for i in ids.reshape(-1))
        if text:
            self.on_finalized_text(text)

    def end(self) -> None:
        text = self._decoder.end()
        self._reset()
        self.on_finalized_text(text, stream_end=True)

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        print(text, flush=True, end="" if not stream_end else None)


class TextIteratorStreamer(TextStreamer):
    """Text as an iterator, for a consumer in another thread than generate():

        streamer = TextIteratorStreamer(tokenizer, skip_prompt=True)
        Thread(target=model.generate, kwargs=dict(**inputs, streamer=streamer)).start()
        for text in streamer: ...

    `timeout` (seconds) bounds each wait for the next text (queue.Empty past it)."""

    def __init__(self, tokenizer, skip_prompt: bool = False, timeout: float | None = None, **decode_kwargs):
        super().__init__(tokenizer, skip_prompt, **decode_kwargs)
        self.text_queue: queue.Queue = queue.Queue()
        self.stop_signal = None
        self.timeout = timeout

    def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
        if text:
            self.text_queue.put(text, timeout=self.timeout)
        if stream_end:
            self.text_queue.put(self.stop_signal, timeout=self.timeout)

    def __iter__(self):
        return self

    def __next__(self) -> str:
        value = self.text_queue.get(timeout=self.timeout)
        if value is self.stop_signal:
            raise StopIteration
        return value
