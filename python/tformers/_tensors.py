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


def as_id_array(x, name: str) -> np.ndarray:
    """A 2-D int32 array of token ids from a list, a list of rows, numpy or torch (1-D is one row)."""
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
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must hold integer token ids, got dtype {a.dtype}")
    return np.ascontiguousarray(a, dtype=np.int32)


def id_list(x) -> list[int]:
    """One sequence of ids (int, list, numpy or torch) as a list, for decoding."""
    if is_torch_tensor(x):
        x = x.detach().cpu().numpy()
    a = np.asarray(x)
    if a.ndim > 1:
        raise ValueError(f"decode() takes one sequence of ids, got shape {a.shape}; use batch_decode() for a batch")
    return a.reshape(-1).astype(np.int64).tolist()


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
