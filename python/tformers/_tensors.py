"""Token ids between numpy, torch and lists: the engine takes and gives lists of rows; callers
get numpy arrays, or torch tensors when they gave torch tensors or asked for return_tensors="pt"."""

from __future__ import annotations

import numpy as np


def torch_module():
    """torch, or None when it is not installed (it is an optional dependency)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def is_torch_tensor(x) -> bool:
    torch = torch_module()
    return torch is not None and isinstance(x, torch.Tensor)


def as_id_array(x, name: str, vocab_size: int | None = None) -> np.ndarray:
    """A 2-D int32 array of token ids from a list, a list of rows, numpy or torch (1-D is one row).
    Every value is checked before it is narrowed to int32 (which turned 2**32 + 5 into 5):
    against [0, vocab_size) when vocab_size is given (ids), else against int32 (masks)."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    try:
        a = np.asarray(x)
    except ValueError as e:  # ragged lists
        raise ValueError(f"{name}: rows of different lengths; pad them (tokenizer(..., padding=True))") from e
    if a.ndim == 1:
        a = a[None, :]
    if a.ndim != 2:
        raise ValueError(f"{name} must have shape (batch, sequence_length), got shape {a.shape}")
    if a.size:
        _check_ids(a, name, vocab_size)
    return np.ascontiguousarray(a, dtype=np.int32)


def _check_ids(a: np.ndarray, name: str, vocab_size: int | None) -> None:
    """Raises unless every value of `a` is an integer within its use's range: TypeError for
    other values (1.5 was taken as 1), ValueError for integers outside it."""
    if a.dtype == object and all(isinstance(v, int) and not isinstance(v, bool) for v in a.flat):
        raise ValueError(f"{name} holds {max(a.flat, key=abs)}, which does not fit in 64 bits")
    if not (np.issubdtype(a.dtype, np.integer) or a.dtype == np.bool_):
        raise TypeError(f"{name} must hold integer token ids, got dtype {a.dtype}")
    low, high = int(a.min()), int(a.max())
    if vocab_size is not None and (low < 0 or high >= vocab_size):
        raise ValueError(f"{name} has token id {low if low < 0 else high}, outside the vocabulary "
                         f"[0, {vocab_size}); use ids of this model's tokenizer")
    limits = np.iinfo(np.int32)
    if low < limits.min or high > limits.max:
        raise ValueError(f"{name} holds {low if low < limits.min else high}, outside int32")


def id_list(x) -> list[int]:
    """One sequence of ids (int, list, numpy or torch) as a list, for decoding."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim > 1:
        raise ValueError(f"decode() takes one sequence of ids, got shape {a.shape}; use batch_decode() for a batch")
    a = a.reshape(-1)
    if a.size:
        _check_ids(a, "token_ids", None)
    return a.astype(np.int64).tolist()


def convert(array: np.ndarray, return_tensors: str | None):
    """`array` as return_tensors asks: "np" (numpy), "pt" (torch), None (lists)."""
    if return_tensors is None:
        return array.tolist()
    if return_tensors == "np":
        return array
    if return_tensors == "pt":
        torch = torch_module()
        if torch is None:
            raise ImportError(
                'return_tensors="pt" needs torch, which is not installed: install it '
                '(pip install "tformers[torch]") or use return_tensors="np" for numpy arrays')
        return torch.from_numpy(array)
    raise ValueError(f'return_tensors={return_tensors!r} is not supported: use "pt" (torch), "np" (numpy) or None (lists)')
