"""Token ids from Python reach the engine as int32: each is checked before it is narrowed, so an
id past 32 bits is refused rather than taken for another token (2**32 + 5 generated as 5), a
float is a TypeError rather than cut to an integer, and a forward pass longer than the model's
positions is refused as generate() refuses it."""

import numpy as np
import pytest


def test_ids_past_32_bits_are_refused_not_wrapped(kjv_model):
    for big in (2**32 + 5, 2**63, 2**64, -(2**63) - 1):
        with pytest.raises(ValueError, match=str(big)):
            kjv_model.generate([[big]], max_new_tokens=1)
    with pytest.raises(ValueError, match="outside the vocabulary"):
        kjv_model(np.array([[2**32 + 5]]))
    with pytest.raises(ValueError, match="outside the vocabulary"):
        kjv_model([[5, -1]])
    # In range, the same ids still work.
    assert kjv_model.generate([[5]], do_sample=False, max_new_tokens=1).shape == (1, 2)


def test_forward_refuses_ids_outside_the_vocabulary(kjv_model):
    vocab = kjv_model.config.vocab_size
    with pytest.raises(ValueError, match=f"token id {vocab}, outside the vocabulary"):
        kjv_model(np.array([[1, vocab]]))


def test_floats_where_ids_belong_are_a_type_error(kjv_model, kjv_tokenizer):
    with pytest.raises(TypeError, match="integer token ids"):
        kjv_model.generate(np.array([[5.0, 6.0]]), max_new_tokens=1)
    with pytest.raises(TypeError, match="integer token ids"):
        kjv_model([[1.5]])
    with pytest.raises(TypeError, match="integer token ids"):
        kjv_tokenizer.decode([1.5])
    with pytest.raises(ValueError, match="int32"):
        kjv_tokenizer.decode([2**40])


def test_a_pad_id_outside_the_vocabulary_is_refused(kjv_model):
    with pytest.raises(ValueError, match="pad_token_id"):
        kjv_model.generate([[5, 6]], pad_token_id=2**32, max_new_tokens=1)


def test_forward_longer_than_the_positions_is_refused(kjv_model):
    positions = kjv_model.config.max_position_embeddings
    with pytest.raises(ValueError, match=f"{positions} positions"):
        kjv_model(np.ones((1, positions + 1), dtype=np.int64))
    assert kjv_model(np.ones((1, 4), dtype=np.int64)).logits.shape[:2] == (1, 4)
