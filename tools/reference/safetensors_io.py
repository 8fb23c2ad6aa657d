"""A minimal safetensors writer and reader (the `safetensors` package is not a Debian package).

File layout (https://huggingface.co/docs/safetensors):
  u64 little-endian N | N bytes of JSON header | raw tensor bytes
The header maps each tensor name to {"dtype", "shape", "data_offsets": [begin, end]}, offsets
relative to the first byte after the header, plus an optional "__metadata__" of string->string.
The header is padded with spaces so that the data starts 8-byte aligned, as the reference
implementation does.
"""

import json
import struct

import numpy as np
import torch

# torch dtype -> (safetensors dtype string, numpy dtype carrying the same bytes)
_TO_ST = {
    torch.float32: ("F32", np.float32),
    torch.float16: ("F16", np.float16),
    torch.bfloat16: ("BF16", np.int16),  # numpy has no bfloat16: move the raw 16-bit patterns
    torch.int32: ("I32", np.int32),
    torch.int64: ("I64", np.int64),
}
_FROM_ST = {st: (torch_dtype, np_dtype) for torch_dtype, (st, np_dtype) in _TO_ST.items()}


def _tensor_bytes(t):
    st, np_dtype = _TO_ST[t.dtype]
    t = t.detach().contiguous().cpu()
    if t.dtype == torch.bfloat16:
        t = t.view(torch.int16)
    return st, t.numpy().astype(np_dtype, copy=False).tobytes(order="C")


def write_safetensors(path, tensors, metadata=None):
    """Writes {name: torch.Tensor} to `path`; tensors are stored in name order."""
    header = {}
    blobs = []
    offset = 0
    for name in sorted(tensors):
        t = tensors[name]
        st, raw = _tensor_bytes(t)
        header[name] = {
            "dtype": st,
            "shape": list(t.shape),
            "data_offsets": [offset, offset + len(raw)],
        }
        blobs.append(raw)
        offset += len(raw)
    if metadata is not None:
        header["__metadata__"] = metadata
    header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
    header_bytes += b" " * ((8 - len(header_bytes) % 8) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header_bytes)))
        f.write(header_bytes)
        for raw in blobs:
            f.write(raw)
    return offset  # payload bytes, for model.safetensors.index.json's total_size


def read_safetensors(path):
    """Reads a safetensors file back into {name: torch.Tensor}, checking every byte range."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    body = data[8 + n :]
    out = {}
    covered = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        torch_dtype, np_dtype = _FROM_ST[info["dtype"]]
        begin, end = info["data_offsets"]
        count = int(np.prod(info["shape"])) if info["shape"] else 1
        assert end - begin == count * np.dtype(np_dtype).itemsize, name
        assert 0 <= begin <= end <= len(body), name
        covered.append((begin, end))
        arr = np.frombuffer(body[begin:end], dtype=np_dtype).reshape(info["shape"]).copy()
        t = torch.from_numpy(arr)
        if torch_dtype == torch.bfloat16:
            t = t.view(torch.bfloat16)
        out[name] = t
    covered.sort()
    pos = 0
    for begin, end in covered:
        assert begin == pos, f"{path}: gap or overlap at byte {begin}"
        pos = end
    assert pos == len(body), f"{path}: {len(body) - pos} trailing bytes"
    return out
