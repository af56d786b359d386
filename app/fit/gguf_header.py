"""The GGUF header and tensor index, read without touching the tensor data or walking big arrays.

gguf.GGUFReader builds a numpy view for every array element: a 128k-token vocabulary with its scores,
types and merges costs it 10-20 s. This reader keeps scalars, strings and the small per-layer arrays
and only counts the others (the vocabulary's size is its length); the format's constants and the
size of each tensor type come from the gguf package. Every read is bounds-checked: a damaged or
truncated header is a ValueError, never a wild allocation.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
from dataclasses import dataclass
from pathlib import Path

# (struct code, bytes) of each scalar GGUFValueType
_SCALARS = {0: ("B", 1), 1: ("b", 1), 2: ("H", 2), 3: ("h", 2), 4: ("I", 4), 5: ("i", 4), 6: ("f", 4), 7: ("?", 1),
            10: ("Q", 8), 11: ("q", 8), 12: ("d", 8)}
_STRING, _ARRAY = 8, 9
SMALL_ARRAY = 4096  # numeric arrays up to this long are kept (per-layer values); longer ones only counted
MAX_DIMS = 8


@dataclass(frozen=True)
class Counted:
    """An array that was skipped: only its length is known."""
    length: int


@dataclass(frozen=True)
class TensorInfo:
    name: str
    type_name: str
    n_bytes: int


class _Cursor:
    def __init__(self, data, offset: int):
        self.data, self.offset = data, offset

    def take(self, size: int) -> int:
        start = self.offset
        if size < 0 or start + size > len(self.data):
            raise ValueError(f"the header runs past the end of the file at byte {start}")
        self.offset += size
        return start

    def unpack(self, code: str, count: int = 1):
        size = struct.calcsize(f"<{count}{code}")
        return struct.unpack_from(f"<{count}{code}", self.data, self.take(size))

    def string(self) -> str:
        (length,) = self.unpack("Q")
        start = self.take(length)
        return bytes(self.data[start:start + length]).decode("utf-8", "replace")

    def skip_strings(self, count: int) -> None:
        for _ in range(count):
            (length,) = self.unpack("Q")
            self.take(length)


def read_header(path: Path) -> tuple[dict, list[TensorInfo]]:
    """(metadata, tensors) of one GGUF file. OSError for a file that can't be read, ValueError for one
    that is not GGUF or is damaged."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType  # the format's type table

    with open(path, "rb", opener=_without_waiting) as f:
        if not stat.S_ISREG(os.fstat(f.fileno()).st_mode) or f.read(4) != b"GGUF":
            raise ValueError("not a GGUF file")
        data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    try:
        cursor = _Cursor(data, 4)
        (version,) = cursor.unpack("I")
        if version not in (2, 3):
            raise ValueError(f"GGUF version {version} is not one llama.cpp reads")
        n_tensors, n_fields = cursor.unpack("Q", 2)
        fields = {}
        for _ in range(n_fields):
            key = cursor.string()
            (kind,) = cursor.unpack("I")
            fields[key] = _value(cursor, kind)
        tensors, ends = [], []
        for _ in range(n_tensors):
            name = cursor.string()
            (n_dims,) = cursor.unpack("I")
            if n_dims > MAX_DIMS:
                raise ValueError(f"tensor {name[:40]!r} claims {n_dims} dimensions")
            dims = cursor.unpack("Q", n_dims)
            (type_id,), (offset,) = cursor.unpack("I"), cursor.unpack("Q")
            try:
                kind = GGMLQuantizationType(type_id)
            except ValueError:
                raise ValueError(f"tensor {name[:40]!r} has an unknown type {type_id}") from None
            block, size = GGML_QUANT_SIZES[kind]
            elements = 1
            for d in dims:
                elements *= d
            tensors.append(TensorInfo(name, kind.name, elements // block * size))
            ends.append(offset + tensors[-1].n_bytes)
        # The data section starts at the next multiple of general.alignment; a cut-off file ends before it does.
        alignment = fields.get("general.alignment", 32)
        if not isinstance(alignment, int) or alignment <= 0:
            raise ValueError("general.alignment is not a positive number")
        start = -(-cursor.offset // alignment) * alignment
        if ends and start + max(ends) > len(data):
            raise ValueError(f"the tensor data is cut off: {start + max(ends)} bytes needed, {len(data)} in the file")
        return fields, tensors
    finally:
        data.close()


def _without_waiting(path, flags: int) -> int:
    """os.open that does not wait: a FIFO named like a model would hold open() until something writes to it."""
    return os.open(path, flags | os.O_NONBLOCK)


def _value(cursor: _Cursor, kind: int):
    if kind in _SCALARS:
        return cursor.unpack(_SCALARS[kind][0])[0]
    if kind == _STRING:
        return cursor.string()
    if kind != _ARRAY:
        raise ValueError(f"unknown GGUF value type {kind}")
    (element,) = cursor.unpack("I")
    (count,) = cursor.unpack("Q")
    if element == _STRING:
        cursor.skip_strings(count)
        return Counted(count)
    if element not in _SCALARS:
        raise ValueError(f"unknown GGUF array element type {element}")
    code, size = _SCALARS[element]
    if count > SMALL_ARRAY:
        cursor.take(count * size)
        return Counted(count)
    return list(cursor.unpack(code, count))
