"""Which GPU architectures a llama.cpp build carries: the CUDA fat binaries embedded in llama-server and the
libggml-cuda beside it, read without running anything (no card, no CUDA toolkit needed).

A fat binary (nvcc's .nv_fatbin section) is a 16-byte header (magic 0xBA55ED50, version 1, header size, size of
the entries) followed by entries: kind (1 PTX, 2 ELF/SASS), the entry's header size, its payload size, ..., and the
architecture as an integer (120 for sm_120) at byte 28. SASS for X.y runs on cards X.z with z >= y; PTX for any
older architecture can be compiled by the driver at start (PTX JIT: slow to start, and slower than native SASS).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

MAGIC = struct.pack("<I", 0xBA55ED50)
_HEADER = struct.Struct("<IHHQ")  # magic, version, header size, size of the entries
_ENTRY = struct.Struct("<HHIQIIHHI")  # kind, -, header size, payload size, compressed size, -, minor, major, arch
PTX, SASS = 1, 2


@dataclass(frozen=True)
class Build:
    sass: frozenset[int] = field(default_factory=frozenset)  # 120 for sm_120
    ptx: frozenset[int] = field(default_factory=frozenset)

    @property
    def has_cuda(self) -> bool:
        return bool(self.sass or self.ptx)


def scan(data: bytes) -> Build:
    """Every fat binary's entries in `data` (an executable or a shared library)."""
    sass: set[int] = set()
    ptx: set[int] = set()
    at = data.find(MAGIC)
    while at != -1:
        if at + _HEADER.size <= len(data):
            _, version, header_size, size = _HEADER.unpack_from(data, at)
            if version == 1 and header_size == _HEADER.size:
                entry, end = at + header_size, min(len(data), at + header_size + size)
                while entry + _ENTRY.size <= end:
                    kind, _, entry_header, payload, _, _, _, _, arch = _ENTRY.unpack_from(data, entry)
                    if entry_header < _ENTRY.size:
                        break  # not a real entry: stop reading this container
                    (sass if kind == SASS else ptx if kind == PTX else set()).add(arch)
                    entry += entry_header + payload
        at = data.find(MAGIC, at + 1)
    return Build(frozenset(sass), frozenset(ptx))


def build_of(server_bin: str | Path) -> Build:
    """What llama-server and the ggml CUDA libraries beside it carry (a shared build keeps CUDA in libggml-cuda.so)."""
    binary = Path(server_bin)
    files = [binary, *sorted(binary.parent.glob("libggml-cuda*.so*"))]
    found = Build()
    for path in files:
        try:
            part = scan(path.read_bytes())
        except OSError:
            continue
        found = Build(found.sass | part.sass, found.ptx | part.ptx)
    return found


def arch_number(capability: str) -> int:
    """ "12.0" -> 120, as nvcc and CMAKE_CUDA_ARCHITECTURES name it."""
    major, minor = capability.split(".")
    return int(major) * 10 + int(minor)


def coverage(build: Build, capability: str) -> str:
    """"sass" (native code for the card), "ptx" (the driver compiles at start: slow), or "none" (no kernel image)."""
    want = arch_number(capability)
    if any(arch // 10 == want // 10 and arch <= want for arch in build.sass):
        return "sass"
    if any(arch <= want for arch in build.ptx):
        return "ptx"
    return "none"


def build_checks(build: Build, capabilities: Iterable[str], where: str) -> list[tuple[bool | None, str]]:
    """One line per architecture among the cards: does this build run on it, and at full speed?"""
    checks: list[tuple[bool | None, str]] = []
    archs = ",".join(f"sm_{a}" for a in sorted(build.sass)) or "none"
    for capability in sorted(set(capabilities), key=arch_number):
        arch = arch_number(capability)
        fix = f"rebuild llama.cpp with cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES={arch}"
        if not build.has_cuda:
            checks.append((False, f"{where} has no CUDA code (a CPU build): it cannot use the cards; {fix}"))
            continue
        found = coverage(build, capability)
        if found == "sass":
            checks.append((True, f"{where} carries native code for compute capability {capability} ({archs})"))
        elif found == "ptx":
            checks.append((None, f"{where} has no sm_{arch} code, only PTX ({archs}): it runs through PTX JIT, slow"
                                 f" to start and slower; {fix}"))
        else:
            checks.append((False, f"{where} has no code for compute capability {capability} ({archs}): it fails with"
                                  f" \"no kernel image is available\"; {fix}"))
    return checks
