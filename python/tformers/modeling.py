"""AutoModelForCausalLM and the model it returns, as in Transformers: from_pretrained,
generate(**inputs, ...), model(input_ids).logits, model.config, model.device. Loading,
generation and the forward pass are the C++ library's (include/tformers/model.h)."""

from __future__ import annotations

import contextlib
import json
import os
import struct
import threading
from typing import Any

import numpy as np

from . import _core
from ._tensors import as_id_array, convert, is_torch_tensor, torch_module
from .distributed import DistributedConfig
from .generation import BaseStreamer, GenerationConfig
from .kernels import kernelize
from .modeling_outputs import CausalLMOutput, GenerateBeamDecoderOnlyOutput, GenerateDecoderOnlyOutput


class PretrainedConfig:
    """config.json as the model read it, read-only: every field as an attribute
    (config.hidden_size, config.model_type, config.architectures), and to_dict()."""

    def __init__(self, fields: dict[str, Any]):
        object.__setattr__(self, "_fields", fields)

    def __getattr__(self, name: str):
        try:
            return self._fields[name]
        except KeyError:
            raise AttributeError(f"config.json has no field {name!r}") from None

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"model.config is read-only (the model was built from it): cannot set {name!r}")

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(self._fields))

    def __repr__(self) -> str:
        return f"PretrainedConfig({json.dumps(self._fields, indent=2)})"


def _dtype_name(dtype) -> str | None:
    """The dtype as the library names it: a string ("bfloat16", "auto") or a torch.dtype."""
    if dtype is None or dtype == "auto":
        return None
    if isinstance(dtype, str):
        return dtype
    torch = torch_module()
    if torch is not None and isinstance(dtype, torch.dtype):
        return str(dtype)  # "torch.bfloat16", which the library accepts
    raise TypeError(f"dtype must be a string such as \"bfloat16\" or a torch.dtype, got {dtype!r}")


class CausalLM:
    """A causal language model. Make one with AutoModelForCausalLM.from_pretrained."""

    def __init__(self, core: _core.CausalLM, name_or_path: str):
        self._core = core
        self.name_or_path = name_or_path
        self.config = PretrainedConfig(json.loads(core.config_json))
        # generation_config.json as a GenerationConfig, which callers may change, as in
        # Transformers; the library applies the file itself, so generate() passes on only what
        # differs from it.
        has_file = os.path.exists(os.path.join(core.folder, "generation_config.json"))
        self.generation_config = GenerationConfig.from_pretrained(core.folder) if has_file else GenerationConfig()
        self._file_generation_fields = self.generation_config.to_dict()
        # One KV cache per model: calls from several threads take turns (the engine runs without
        # the GIL, so without this they would share the cache).
        self._lock = threading.Lock()
        self._owner = None
        # What the last kernelize() chose for each layer it mapped: (layer, kernel, note).
        self.kernel_layers = []

    @contextlib.contextmanager
    def _exclusive(self):
        if self._owner == threading.get_ident():
            raise RuntimeError("the model was called again from its own streamer; a model runs one call "
                               "at a time (use a second model)")
        with self._lock:
            self._owner = threading.get_ident()
            try:
                yield
            finally:
                self._owner = None

    @property
    def device(self) -> str:
        """The backend the model runs on ("cpu", "tpu", "cuda"); inputs stay on the host."""
        return self._core.device

    @property
    def dtype(self):
        """The weights' dtype: a torch.dtype when torch is installed, else its name."""
        torch = torch_module()
        return getattr(torch, self._core.dtype) if torch is not None else self._core.dtype

    def generate(self, input_ids=None, attention_mask=None, generation_config: GenerationConfig | None = None,
                 streamer: BaseStreamer | None = None, tokenizer=None, **kwargs):
        """Generates from input_ids (batch, sequence_length), left-padded where attention_mask is 0,
        with GenerationConfig's fields as keyword arguments over `generation_config` and the
        model's generation_config.json. Returns (batch * num_return_sequences, length) int64 ids:
        each row the given input row followed by its new tokens (rows that finish early are
        filled with pad_token_id), a torch tensor when input_ids is one, else numpy.
        return_dict_in_generate=True returns a GenerateDecoderOnlyOutput (or, with num_beams > 1,
        a GenerateBeamDecoderOnlyOutput) with .sequences, and .scores / .logits per step with
        output_scores / output_logits. `tokenizer` is needed for stop_strings. `assistant_model`,
        another tformers model of the same vocabulary, proposes tokens that this model checks
        several at a time (assisted generation: greedy search of one sequence, the same tokens).
        Ctrl-C raises KeyboardInterrupt at the next token, or the next step of a beam search."""
        if input_ids is None:
            raise ValueError("generate() needs input_ids (model.generate(**tokenizer(text, return_tensors=\"pt\")))")
        return_tensors = "pt" if is_torch_tensor(input_ids) else "np"
        ids = as_id_array(input_ids, "input_ids", self._core.vocab_size)
        mask = None if attention_mask is None else as_id_array(attention_mask, "attention_mask")
        if mask is not None and mask.shape != ids.shape:
            raise ValueError(f"attention_mask has shape {mask.shape}, input_ids {ids.shape}: they must match")
        prompts = [_prompt(ids[b], None if mask is None else mask[b], b) for b in range(len(ids))]
        changed = {k: v for k, v in self.generation_config.to_dict().items()
                   if k not in self._file_generation_fields or self._file_generation_fields[k] != v}
        assistant = kwargs.pop("assistant_model", None)
        if assistant is not None and not isinstance(assistant, CausalLM):
            raise TypeError("assistant_model must be a tformers model (AutoModelForCausalLM.from_pretrained), "
                            f"got {type(assistant).__name__}")
        fields = {**changed, **(generation_config.to_dict() if generation_config is not None else {}), **kwargs}
        # The output's form is the Python layer's choice; the library computes scores only when
        # they are returned (a generation_config.json that asks for them without the dict would
        # otherwise keep every step's logits for nothing).
        return_dict = bool(fields.pop("return_dict_in_generate", False))
        output_scores = return_dict and bool(fields.get("output_scores", False))
        fields.update(output_scores=output_scores, output_logits=return_dict and bool(fields.get("output_logits", False)))
        config = GenerationConfig(**fields)
        on_token = None
        if streamer is not None:
            if len(ids) > 1 or int(config.to_dict().get("num_return_sequences", 1)) > 1:
                raise ValueError("a streamer only supports batch size 1 (one prompt, one sequence)")
            streamer.put(convert(ids.astype(np.int64), return_tensors))
            on_token = lambda row, token: streamer.put(convert(np.array([token], dtype=np.int64), return_tensors))
        try:
            with self._exclusive():
                result = self._core.generate(prompts, config.to_json_string(), on_token,
                                             None if tokenizer is None else tokenizer._core,
                                             None if assistant is None else assistant._core)
        finally:
            if streamer is not None:
                streamer.end()
        rows = result["sequences"]
        repeat = len(rows) // len(prompts)
        out = [np.concatenate([ids[i // repeat], row[len(prompts[i // repeat]):]]) for i, row in enumerate(rows)]
        sequences = convert(np.array(out, dtype=np.int64), return_tensors)
        if not return_dict:
            return sequences

        def per_step(steps):  # (steps, rows, vocab) as Transformers' tuple of (rows, vocab)
            return None if steps is None else tuple(convert(step, return_tensors) for step in steps)

        scores, logits = per_step(result["scores"]), per_step(result["logits"])
        if result["sequences_scores"] is None:
            return GenerateDecoderOnlyOutput(sequences=sequences, scores=scores, logits=logits)
        sequences_scores = convert(np.array(result["sequences_scores"], dtype=np.float32), return_tensors)
        return GenerateBeamDecoderOnlyOutput(sequences=sequences, sequences_scores=sequences_scores if output_scores
                                             else None, scores=scores, logits=logits)

    def __call__(self, input_ids, attention_mask=None, **kwargs) -> CausalLMOutput:
        """One forward pass: .logits (batch, sequence_length, vocab_size) float32 for every
        position, a torch tensor when input_ids is one."""
        if kwargs:
            raise TypeError(f"model() takes input_ids and attention_mask; not supported: {sorted(kwargs)}")
        return_tensors = "pt" if is_torch_tensor(input_ids) else "np"
        ids = as_id_array(input_ids, "input_ids", self._core.vocab_size)
        mask = None if attention_mask is None else as_id_array(attention_mask, "attention_mask")
        with self._exclusive():
            logits = self._core.forward(ids, mask)
        return CausalLMOutput(logits=convert(logits, return_tensors))

    forward = __call__

    def eval(self) -> "CausalLM":
        """The model itself: it always runs in inference mode (no dropout)."""
        return self

    def to(self, *args, **kwargs) -> "CausalLM":
        """The model itself when asked for the device and dtype it already has (model.to("cpu"),
        model.to(torch.bfloat16)); the device and dtype are chosen when loading, so asking for
        others is a ValueError saying which from_pretrained argument to use. nn.Module.to's other
        arguments (non_blocking, copy, memory_format) change nothing here."""
        asked = [*args, kwargs.get("device"), kwargs.get("dtype")]
        for value in (v for v in asked if v is not None and not isinstance(v, bool)):
            if _is_dtype(value):
                have = self._core.dtype
                want = _dtype_name(value).removeprefix("torch.")
                if want != have:
                    raise ValueError(f"the model's weights are {have}; load them as {want} with "
                                     f"from_pretrained(..., dtype={want!r}) instead of .to()")
                continue
            device = str(value).split(":")[0] if not isinstance(value, int) else "cuda"
            if device != self.device:
                raise ValueError(f"the model runs on {self.device!r}; load it there with from_pretrained(..., "
                                 f"device_map={device!r}) instead of .to() (inputs may stay on the host)")
        return self

    @classmethod
    def can_generate(cls) -> bool:
        """True: every model tformers loads is a causal LM with generate()."""
        return True

    def num_parameters(self, only_trainable: bool = False, exclude_embeddings: bool = False) -> int:
        """The parameters of the checkpoint read (a tied output head counted once, as Transformers
        counts it); exclude_embeddings leaves out the input embeddings. All are trainable. Left out
        as Transformers leaves them out: the layers after num_hidden_layers (GLM-4.5's
        multi-token-prediction layers, which neither loads), the multi-token-prediction module of
        Qwen3.5 and Qwen3-Next ("mtp."), the vision tower of a multimodal checkpoint run as its
        text model ("model.visual."), and the buffers saved with the weights there
        (e_score_correction_bias of GLM-4.5's router, Gemma 4's layer_scalar). Gemma 4's table of
        per-layer embeddings is an embedding too."""
        layers = self.config.to_dict().get("num_hidden_layers", 0)
        sizes = {name: size for name, size in _checkpoint_sizes(self._core.folder).items()
                 if not name.endswith((".e_score_correction_bias", ".layer_scalar"))
                 and _layer_of(name) < layers and not name.startswith(("mtp.", "model.visual."))}
        if self.config.to_dict().get("tie_word_embeddings", False) and any(n.endswith("embed_tokens.weight")
                                                                           for n in sizes):
            sizes.pop("lm_head.weight", None)
        return sum(size for name, size in sizes.items()
                   if not (exclude_embeddings
                           and name.endswith(("embed_tokens.weight", "embed_tokens_per_layer.weight"))))

    def compute_transition_scores(self, sequences, scores, beam_indices=None, normalize_logits: bool = False):
        """Each generated token's score, as Transformers computes it: sequences and scores from
        generate(..., return_dict_in_generate=True, output_scores=True), and beam_indices for
        beam search. normalize_logits takes the log-softmax of each step's scores first.
        Returns (batch, new tokens) float32, a torch tensor when scores are."""
        return_tensors = "pt" if is_torch_tensor(scores[0]) else "np"
        steps = np.stack([_numpy(s) for s in scores]).astype(np.float32)  # (steps, rows, vocab)
        if normalize_logits:
            shifted = steps - steps.max(-1, keepdims=True)
            steps = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        seqs = _numpy(sequences)
        if beam_indices is None:
            beams = np.broadcast_to(np.arange(steps.shape[1])[:, None], (steps.shape[1], len(scores)))
        else:
            beams = _numpy(beam_indices)
        finished = beams < 0
        length = int((~finished).sum(-1).max())
        beams, finished = np.where(finished, 0, beams)[:, :length], finished[:, :length]
        tokens = seqs[:, seqs.shape[-1] - length:]
        out = steps[np.arange(length)[None, :], beams, tokens]
        out[finished] = 0
        return convert(np.ascontiguousarray(out, dtype=np.float32), return_tensors)

    def __repr__(self) -> str:
        return f"{self.config.architectures[0]}(name_or_path={self.name_or_path!r}, device={self.device!r})"


def _is_dtype(value) -> bool:
    torch = torch_module()
    return (torch is not None and isinstance(value, torch.dtype)) or value in ("float32", "bfloat16", "float16")


def _numpy(x) -> np.ndarray:
    return x.detach().cpu().numpy() if is_torch_tensor(x) else np.asarray(x)


def _layer_of(name: str) -> int:
    """The decoder layer of a tensor "model.layers.N. ...", or -1 for one outside the layers."""
    parts = name.split(".")
    return int(parts[2]) if len(parts) > 3 and parts[:2] == ["model", "layers"] and parts[2].isdigit() else -1


def _checkpoint_sizes(folder: str) -> dict[str, int]:
    """Every weight's element count in a folder's .safetensors files, read from their headers: an
    MXFP4 weight (gpt-oss's experts, "<name>_blocks" of two values a byte and "<name>_scales")
    counts its values, as Transformers counts the weight it dequantizes them into."""
    sizes = {}
    for name in sorted(os.listdir(folder)):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            (length,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(length))
        for tensor, info in header.items():
            if tensor == "__metadata__" or tensor.endswith("_scales"):
                continue
            count = int(np.prod(info["shape"], dtype=np.int64))
            if tensor.endswith("_blocks"):
                tensor, count = tensor[:-len("_blocks")], 2 * count
            sizes[tensor] = count
    return sizes


def _prompt(row: np.ndarray, mask: np.ndarray | None, b: int) -> list[int]:
    """Row b's tokens without its left padding."""
    if mask is None:
        return row.tolist()
    real = np.flatnonzero(mask)
    if len(real) == 0:
        raise ValueError(f"attention_mask row {b} is all zeros: every prompt needs at least one token")
    if real[-1] != len(row) - 1 or len(real) != real[-1] - real[0] + 1:
        raise ValueError(f"attention_mask row {b} is not left padding (zeros, then ones): decoder-only models "
                         "generate after the last token, so pad on the left (tokenizer.padding_side = \"left\")")
    return row[real[0]:].tolist()


class AutoModelForCausalLM:
    """Transformers' AutoModelForCausalLM: the architecture comes from config.json."""

    def __init__(self):
        raise OSError("AutoModelForCausalLM is instantiated with AutoModelForCausalLM.from_pretrained(path)")

    @staticmethod
    def from_pretrained(pretrained_model_name_or_path, dtype=None, device_map: str | None = "auto",
                        distributed_config: DistributedConfig | None = None, attn_implementation: str | None = None,
                        revision: str = "main", quantize: str | None = None, load_mode: str = "copy",
                        tp_plan: str | None = None, torch_dtype=None, use_kernels: bool = False,
                        kernel_config=None) -> CausalLM:
        """Loads a model folder or a Hub id in the local cache. dtype: "auto" (config.json's),
        "bfloat16", "float16", "float32" or a torch.dtype. device_map: "auto", "cpu", "tpu",
        "cuda". distributed_config splits the model over the ranks of `tformers launch` (tp_plan
        ="auto" does the same with the defaults). attn_implementation: None, "eager", "sdpa" or
        "static" all run the library's one attention. quantize: None, "int8" or "int4".
        torch_dtype is Transformers' older name for dtype. use_kernels swaps layers for hub
        kernels (tformers.kernels.kernelize) with kernel_config's mapping, or the default one."""
        if kernel_config is not None and not use_kernels:
            raise ValueError("kernel_config is applied with use_kernels=True; pass both")
        if torch_dtype is not None:
            if dtype is not None:
                raise ValueError("give dtype or torch_dtype (its older name), not both")
            dtype = torch_dtype
        if attn_implementation not in (None, "eager", "sdpa", "static"):
            raise ValueError(f"attn_implementation={attn_implementation!r} is not available: tformers runs one "
                             "attention (as \"sdpa\"); pass None, \"eager\" or \"sdpa\"")
        if tp_plan not in (None, "auto"):
            raise ValueError(f"tp_plan={tp_plan!r}: from_pretrained takes tp_plan=\"auto\"; give rules with "
                             "distributed_config=DistributedConfig(tp_plan={...})")
        if tp_plan == "auto" and distributed_config is None:
            distributed_config = DistributedConfig()
        if device_map is not None and not isinstance(device_map, str):
            raise ValueError(f"device_map={device_map!r}: tformers places the whole model on one device; "
                             "pass \"auto\", \"cpu\", \"tpu\" or \"cuda\"")
        dc = distributed_config
        path = str(pretrained_model_name_or_path)
        core = _core.CausalLM.from_pretrained(
            path, _dtype_name(dtype), device_map or "auto", revision, dc is not None,
            None if dc is None else dc.tp_size, {} if dc is None else dict(dc.tp_plan),
            None if dc is None else dc.timeout, quantize or "", load_mode)
        model = CausalLM(core, path)
        if use_kernels:
            kernelize(model, kernel_mapping=None if kernel_config is None else kernel_config.kernel_mapping)
        return model
