"""What models and generate() return, as Transformers' ModelOutput classes: fields read as
attributes (None when not computed) and, the computed ones, as dict items in field order."""

from __future__ import annotations

from typing import Any


class ModelOutput(dict):
    """Transformers' ModelOutput: out.logits, out["logits"], out[0] (the first computed field)
    and out.to_tuple() (the computed fields in order). Subclasses name their fields."""

    _fields: tuple[str, ...] = ()

    def __init__(self, **values: Any):
        unknown = sorted(set(values) - set(self._fields))
        if unknown:
            raise TypeError(f"{type(self).__name__} has no field {unknown[0]!r}; its fields are {list(self._fields)}")
        super().__init__((name, values[name]) for name in self._fields if values.get(name) is not None)
        for name in self._fields:
            object.__setattr__(self, name, values.get(name))

    def __getitem__(self, key):
        return super().__getitem__(key) if isinstance(key, str) else self.to_tuple()[key]

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is read-only: cannot set {name!r}")

    def to_tuple(self) -> tuple:
        return tuple(self.values())


class CausalLMOutput(ModelOutput):
    """What model(input_ids) returns: .logits (batch, sequence_length, vocab_size), float32."""

    _fields = ("logits",)


class GenerateDecoderOnlyOutput(ModelOutput):
    """generate(..., return_dict_in_generate=True) without beam search: .sequences as generate()
    returns them; with output_scores=True, .scores, one (batch * num_return_sequences,
    vocab_size) float32 array per new token, the logits after the logits processors (and
    warpers when sampling); with output_logits=True, .logits, the raw logits, likewise. The
    attention, hidden-state and cache fields are always None."""

    _fields = ("sequences", "scores", "logits", "attentions", "hidden_states", "past_key_values")


class GenerateBeamDecoderOnlyOutput(ModelOutput):
    """generate(..., return_dict_in_generate=True) with beam search: .sequences; with
    output_scores=True, .sequences_scores (each returned hypothesis' sum(log p) / length **
    length_penalty) and .scores, one (batch * num_beams, vocab_size) array of processed log
    probabilities per step; with output_logits=True, .logits, the raw logits per step.
    beam_indices, attentions, hidden states and the cache are always None."""

    _fields = ("sequences", "sequences_scores", "scores", "logits", "beam_indices", "attentions", "hidden_states",
               "past_key_values")
