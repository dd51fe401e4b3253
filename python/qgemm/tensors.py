"""Checkpoint tensors as stored: their safetensors dtype and their raw storage, without torch.

numpy has no bfloat16 and no 8-bit floats, and an importer must know the stored type exactly (a
BF16 scale is a bf16 scale grid, an F8_E4M3 weight is e4m3 codes). A `StoredTensor` holds the
safetensors dtype name and the raw storage as a numpy array: BF16 as uint16, F8_E4M3 / F8_E5M2
/ F8_E8M0 as uint8 codes, the others as their numpy types. `as_stored` takes a StoredTensor, a
numpy array (ml_dtypes' bfloat16 / float8 types too) or a torch tensor; `read_safetensors` reads a
file's tensors with the standard library and numpy only.

The safetensors file format: an 8-byte little-endian header length, a JSON header mapping each
name to {"dtype", "shape", "data_offsets": [begin, end]} (offsets into the data that follows the
header), then the data, row-major and little-endian.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import struct
from typing import Dict, Iterable, Optional

import numpy as np

from ._core import Error

# safetensors dtype -> the numpy type of its raw storage.
STORAGE = {
    "F64": np.dtype("<f8"), "F32": np.dtype("<f4"), "F16": np.dtype("<f2"),
    "BF16": np.dtype("<u2"),
    "I64": np.dtype("<i8"), "I32": np.dtype("<i4"), "I16": np.dtype("<i2"), "I8": np.dtype("i1"),
    "U64": np.dtype("<u8"), "U32": np.dtype("<u4"), "U16": np.dtype("<u2"), "U8": np.dtype("u1"),
    "BOOL": np.dtype("?"),
    "F8_E4M3": np.dtype("u1"), "F8_E5M2": np.dtype("u1"), "F8_E8M0": np.dtype("u1"),
}
FLOAT_TYPES = ("F64", "F32", "F16", "BF16", "F8_E4M3", "F8_E5M2", "F8_E8M0")
INT_TYPES = ("I64", "I32", "I16", "I8", "U64", "U32", "U16", "U8", "BOOL")

# numpy / ml_dtypes / torch dtype names -> safetensors dtype.
_BY_NAME = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2", "float8_e8m0fnu": "F8_E8M0",
}


@dataclasses.dataclass(frozen=True)
class StoredTensor:
    dtype: str         # the safetensors dtype name (F32, BF16, F8_E4M3, I32, U8, ...)
    data: np.ndarray   # the raw storage, of STORAGE[dtype]

    @property
    def shape(self) -> tuple:
        return tuple(self.data.shape)

    def values(self) -> np.ndarray:
        """The values: float64 for 8-bit floats, float32 for BF16, the storage otherwise."""
        if self.dtype == "BF16":
            return (self.data.astype(np.uint32) << np.uint32(16)).view(np.float32)
        if self.dtype == "F8_E4M3":
            return E4M3_VALUES[self.data]
        if self.dtype == "F8_E5M2":
            return E5M2_VALUES[self.data]
        if self.dtype == "F8_E8M0":
            return E8M0_VALUES[self.data]
        return self.data


def _float8_table(exponent_bits: int, mantissa_bits: int, fn: bool) -> np.ndarray:
    """All 256 values of an 8-bit float (fn: e4m3fn, no infinities, only S.1111.111 is NaN;
    otherwise IEEE-like: the top exponent holds inf and NaN)."""
    bias = (1 << (exponent_bits - 1)) - 1
    table = np.empty(256, np.float64)
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e = (code >> mantissa_bits) & ((1 << exponent_bits) - 1)
        m = code & ((1 << mantissa_bits) - 1)
        top = (1 << exponent_bits) - 1
        if fn and e == top and m == (1 << mantissa_bits) - 1:
            value = np.nan
        elif not fn and e == top:
            value = np.inf if m == 0 else np.nan
        elif e == 0:
            value = m / (1 << mantissa_bits) * 2.0 ** (1 - bias)
        else:
            value = (1 + m / (1 << mantissa_bits)) * 2.0 ** (e - bias)
        table[code] = sign * value
    return table


E4M3_VALUES = _float8_table(4, 3, fn=True)
E5M2_VALUES = _float8_table(5, 2, fn=False)
E8M0_VALUES = np.array([2.0 ** (c - 127) for c in range(255)] + [np.nan])


def as_stored(x, name: str = "tensor") -> StoredTensor:
    """A StoredTensor from a StoredTensor, a numpy array or a torch tensor (moved to the host)."""
    if isinstance(x, StoredTensor):
        return x
    if type(x).__module__.startswith("torch"):
        import torch

        t = x.detach().to("cpu").contiguous()
        dtype_name = str(t.dtype).replace("torch.", "")
        if dtype_name not in _BY_NAME:
            raise Error(f"{name}: torch dtype {t.dtype} has no safetensors counterpart")
        dtype = _BY_NAME[dtype_name]
        if dtype == "BF16":  # (through 1-D: torch does not view 0-d tensors as another type)
            raw = t.reshape(-1).view(torch.int16).numpy().view(np.uint16)
            return StoredTensor(dtype, raw.reshape(tuple(t.shape)))
        if dtype.startswith("F8_"):
            return StoredTensor(dtype, t.reshape(-1).view(torch.uint8).numpy().reshape(
                tuple(t.shape)))
        return StoredTensor(dtype, t.numpy())
    array = np.asarray(x)
    dtype = _BY_NAME.get(array.dtype.name)
    if dtype is None:
        raise Error(f"{name}: numpy dtype {array.dtype} has no safetensors counterpart")
    array = np.ascontiguousarray(array)
    storage = STORAGE[dtype]
    if array.dtype != storage:  # ml_dtypes' bfloat16 / float8: their bytes are the codes
        array = array.view(storage) if array.dtype.itemsize == storage.itemsize else \
            array.astype(storage)
    return StoredTensor(dtype, array)


MAX_DIMS = 32  # numpy's limit before 2.0 (64 since); checkpoints' tensors have a few


def _is_count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


class SafetensorsFile:
    """One .safetensors file, read lazily: `keys()`, `get(name)` (a StoredTensor, copied).

    The header is checked when the file is opened: a JSON object whose entries (but
    "__metadata__") are {"dtype": a name, "shape": [non-negative integers], "data_offsets":
    [begin, end]} with 0 <= begin <= end <= the size of the data after the header. A file that
    breaks a rule raises qgemm.Error naming the tensor and the rule; a dtype qgemm does not
    read, or a size that does not match the shape, raises it when that tensor is read."""

    def __init__(self, path: str):
        self.path = path
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) != 8:
                raise Error(f"{path}: not a safetensors file (shorter than its 8-byte header "
                            "length)")
            (length,) = struct.unpack("<Q", head)
            if length > size - 8:
                raise Error(f"{path}: the safetensors header length {length} runs past the end "
                            f"of the file (rule: 8 + header length <= the file's {size} bytes)")
            text = f.read(length)
        try:
            header = json.loads(text)
        except (ValueError, RecursionError) as error:  # JSONDecodeError, UnicodeDecodeError
            raise Error(f"{path}: the safetensors header is not JSON ({type(error).__name__}: "
                        f"{error})") from None
        if not isinstance(header, dict):
            raise Error(f"{path}: the safetensors header is a JSON {type(header).__name__} "
                        "(rule: an object mapping tensor names to {dtype, shape, data_offsets})")
        header.pop("__metadata__", None)
        data_size = size - 8 - length
        for name, entry in header.items():
            self._check_entry(name, entry, data_size)
        self.header: Dict[str, dict] = header
        self.data_start = 8 + length

    def _check_entry(self, name: str, entry, data_size: int) -> None:
        where = f"{self.path}: tensor {name!r}"
        if not isinstance(entry, dict):
            raise Error(f"{where} is a JSON {type(entry).__name__} (rule: an object "
                        "{dtype, shape, data_offsets})")
        for key in ("dtype", "shape", "data_offsets"):
            if key not in entry:
                raise Error(f"{where} has no {key} (rule: every tensor has dtype, shape and "
                            "data_offsets)")
        if not isinstance(entry["dtype"], str):
            raise Error(f"{where} has dtype {entry['dtype']!r} (rule: a dtype name, e.g. F32)")
        shape = entry["shape"]
        if not (isinstance(shape, list) and len(shape) <= MAX_DIMS and
                all(_is_count(d) for d in shape)):
            raise Error(f"{where} has shape {shape!r} (rule: a list of at most {MAX_DIMS} "
                        "non-negative integers)")
        offsets = entry["data_offsets"]
        if not (isinstance(offsets, list) and len(offsets) == 2 and
                all(_is_count(v) for v in offsets) and offsets[0] <= offsets[1] <= data_size):
            raise Error(f"{where} has data_offsets {offsets!r} (rule: [begin, end], 0 <= begin "
                        f"<= end <= {data_size}, the bytes of data after the header)")

    def keys(self) -> Iterable[str]:
        return self.header.keys()

    def get(self, name: str) -> StoredTensor:
        if name not in self.header:
            raise Error(f"{self.path}: no tensor named {name!r}")
        entry = self.header[name]
        dtype = entry["dtype"]
        if dtype not in STORAGE:
            raise Error(f"{self.path}: tensor {name} has dtype {dtype}, which qgemm does not read")
        begin, end = entry["data_offsets"]
        shape = tuple(entry["shape"])
        storage = STORAGE[dtype]
        count = math.prod(shape)
        if end - begin != count * storage.itemsize:
            raise Error(f"{self.path}: tensor {name} holds {end - begin} bytes; its shape "
                        f"{list(shape)} of {dtype} needs {count * storage.itemsize}")
        with open(self.path, "rb") as f:
            f.seek(self.data_start + begin)
            raw = f.read(end - begin)
        if len(raw) != end - begin:
            raise Error(f"{self.path}: tensor {name}: the file ends {end - begin - len(raw)} "
                        "bytes before its data does")
        return StoredTensor(dtype, np.frombuffer(raw, dtype=storage).reshape(shape).copy())


def read_safetensors(path: str, names: Optional[Iterable[str]] = None) -> Dict[str, StoredTensor]:
    """The tensors of a .safetensors file (all, or those named)."""
    f = SafetensorsFile(path)
    return {name: f.get(name) for name in (f.keys() if names is None else names)}


def write_safetensors(path: str, tensors: Dict[str, StoredTensor],
                      metadata: Optional[Dict[str, str]] = None) -> None:
    """Writes StoredTensors (or anything as_stored takes) as a .safetensors file."""
    header, chunks, offset = {}, [], 0
    for name, tensor in tensors.items():
        t = as_stored(tensor, name)
        raw = np.ascontiguousarray(t.data, dtype=STORAGE[t.dtype]).tobytes()
        header[name] = {"dtype": t.dtype, "shape": list(t.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        chunks.append(raw)
        offset += len(raw)
    if metadata:
        header["__metadata__"] = dict(metadata)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * ((-len(text)) % 8)  # the data starts 8-byte aligned
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for chunk in chunks:
            f.write(chunk)
