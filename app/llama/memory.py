"""llama.cpp's own memory figures, read from a llama-server's log: what it allocated for weights, KV cache and compute.

Two sources, in order of preference:
- "lines": at `-lv 4` llama.cpp logs each buffer it allocates, in MiB with two decimals (plain text, or as the `msg`
  of `{"type":"log",...}` lines with --log-jsonl):
      load_tensors:   CPU_Mapped model buffer size =     0.41 MiB
      llama_context:        CPU  output buffer size =     0.00 MiB
      llama_kv_cache:        CPU KV buffer size =     0.50 MiB
      llama_kv_cache: size =    0.50 MiB (  1024 cells,   2 layers,  2/2 seqs), K (f16):    0.25 MiB, V (f16):    0.25 MiB
      sched_reserve:        CPU compute buffer size =     2.14 MiB
- "breakdown": with --log-jsonl (and -lv 4), `{"type":"fit_memory_breakdown","data":{"unit":"MiB","rows":[...]}}`,
  whole MiB per device ("CUDA0"), the host ("Host") and any other buffer type. llama.cpp prints one before loading
  (the --fit projection) and one on a clean exit (what was allocated); the last one counts.

Nothing here raises on odd input: a line that does not parse is skipped.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, fields, replace
from typing import Any

# "<buffer> <kind> buffer size = <MiB> MiB". A destructor's "compute buffer size is ..." check does not match.
# The name's length is bounded so that a long run of non-blanks (a prompt at -lv 4) costs linear time, not quadratic.
_BUFFER = re.compile(r"(?P<name>\S{1,64}) {1,4}(?P<kind>model|KV|RS|output|compute) buffer size = *(?P<mib>\d+(?:\.\d+)?) MiB")
_KV_SIZE = re.compile(
    r"size =\s*(?P<mib>\d+(?:\.\d+)?) MiB \(\s*(?P<cells>\d+) cells,\s*(?P<layers>\d+) layers,\s*(?P<seqs>\d+)/(?P<streams>\d+)"
    r" seqs\), K \((?P<type_k>\w+)\):\s*(?P<k>\d+(?:\.\d+)?) MiB, V \((?P<type_v>\w+)\):\s*(?P<v>\d+(?:\.\d+)?) MiB")
_N_CTX = re.compile(r"llama_context: (?P<key>n_ctx|n_ctx_seq)\s+= (?P<value>\d+)\s*$")
_RESERVING = "sched_reserve: reserving ..."
_FIELD = {"model": "weights_mib", "KV": "kv_mib", "RS": "kv_mib", "output": "output_mib", "compute": "compute_mib"}
SOURCES = ("lines", "breakdown")


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """MiB in one buffer (CUDA0, CUDA_Host, CPU, CPU_Mapped, CPU_REPACK, ...) or, from a breakdown, one device
    or the host. kv_mib includes recurrent state; output_mib (the logits) only comes from log lines."""

    weights_mib: float = 0.0
    kv_mib: float = 0.0
    compute_mib: float = 0.0
    output_mib: float = 0.0

    @property
    def total_mib(self) -> float:
        return self.weights_mib + self.kv_mib + self.compute_mib + self.output_mib


@dataclass(frozen=True, slots=True)
class KvCache:
    """One `llama_kv_cache: size = ...` line: cells per stream, layers, n_seq_max and streams (1 when unified)."""

    mib: float
    cells: int
    layers: int
    seqs: int
    streams: int
    type_k: str
    type_v: str
    k_mib: float
    v_mib: float


@dataclass(frozen=True)
class Measured:
    """What llama.cpp reported. `source` is "lines" (decimal MiB per buffer) or "breakdown" (whole MiB per device).
    kv_cells is the largest cache's cells per stream and kv_seqs its n_seq_max, when a KV size line was seen."""

    devices: dict[str, DeviceMemory]
    source: str
    kv_cells: int | None = None
    kv_seqs: int | None = None
    kv_caches: tuple[KvCache, ...] = ()
    n_ctx: int | None = None
    n_ctx_seq: int | None = None

    @property
    def weights_mib(self) -> float:
        return sum(d.weights_mib for d in self.devices.values())

    @property
    def kv_mib(self) -> float:
        return sum(d.kv_mib for d in self.devices.values())

    @property
    def compute_mib(self) -> float:
        return sum(d.compute_mib for d in self.devices.values())

    @property
    def total_mib(self) -> float:
        return sum(d.total_mib for d in self.devices.values())

    def to_json(self) -> dict:
        """A JSON-ready dict, MiB rounded to two decimals (the log's own precision)."""
        return {
            "source": self.source,
            "devices": {name: _rounded(memory) for name, memory in self.devices.items()},
            "kv_cells": self.kv_cells,
            "kv_seqs": self.kv_seqs,
            "kv_caches": [_rounded(cache) for cache in self.kv_caches],
            "n_ctx": self.n_ctx,
            "n_ctx_seq": self.n_ctx_seq,
        }

    @classmethod
    def from_json(cls, data: object) -> Measured | None:
        """The inverse of to_json; None when `data` is not such a dict."""
        if not isinstance(data, dict) or data.get("source") not in SOURCES or not isinstance(data.get("devices"), dict):
            return None
        try:
            devices = {name: DeviceMemory(**{key: _number(value[key]) for key in DeviceMemory.__dataclass_fields__})
                       for name, value in data["devices"].items()}
            caches = tuple(KvCache(_number(c["mib"]), _count(c["cells"]), _count(c["layers"]), _count(c["seqs"]),
                                   _count(c["streams"]), _text(c["type_k"]), _text(c["type_v"]), _number(c["k_mib"]),
                                   _number(c["v_mib"])) for c in data.get("kv_caches") or ())
            counts = [None if data.get(key) is None else _count(data[key])
                      for key in ("kv_cells", "kv_seqs", "n_ctx", "n_ctx_seq")]
        except (KeyError, TypeError, ValueError):
            return None
        kv_cells, kv_seqs, n_ctx, n_ctx_seq = counts
        return cls(devices, data["source"], kv_cells, kv_seqs, caches, n_ctx, n_ctx_seq)


def read_memory(lines: Iterable[str]) -> Measured | None:
    """llama.cpp's memory figures in a server log (plain or --log-jsonl lines); None when it has none.

    The decimal lines win once a compute buffer was logged (llama.cpp reserves compute last); before that, a JSON
    breakdown if there is one. A model buffer logged after KV or compute figures starts over: that is a second
    load (at -lv 5 the --fit dry run logs its own, with empty KV buffers, before the real one). A new
    `sched_reserve: reserving` replaces the compute figures, since each reserve logs whole buffers.
    """
    state = _LineState()
    breakdown: dict[str, DeviceMemory] | None = None
    for text, event in _events(lines):
        if event is not None:
            breakdown = _breakdown(event) or breakdown
        elif text is not None:
            state.feed(text)
    figures = dict(state.figures)
    context: dict[str, Any] = {"kv_cells": max((c.cells for c in state.caches), default=None),
               "kv_seqs": max((c.seqs for c in state.caches), default=None),
               "kv_caches": tuple(state.caches), "n_ctx": state.n_ctx.get("n_ctx"), "n_ctx_seq": state.n_ctx.get("n_ctx_seq")}
    if figures and (state.saw_compute or breakdown is None):
        return Measured(figures, "lines", **context)
    if breakdown:
        return Measured(breakdown, "breakdown", **context)
    return None


@dataclass
class _LineState:
    figures: dict[str, DeviceMemory] = field(default_factory=dict)
    caches: list[KvCache] = field(default_factory=list)
    n_ctx: dict[str, int] = field(default_factory=dict)
    after_model: bool = False
    saw_compute: bool = False

    def feed(self, text: str) -> None:
        if _RESERVING in text:
            self.figures = {name: replace(memory, compute_mib=0.0) for name, memory in self.figures.items()}
            return
        # A substring test first: most lines are none of these, and `in` is much cheaper than a search.
        if " buffer size =" in text and (match := _BUFFER.search(text)):
            kind, mib = match["kind"], float(match["mib"])
            if kind == "model" and self.after_model:
                self.reset()  # a second load: keep only the last one
            self.after_model = self.after_model or kind != "model"
            self.saw_compute = self.saw_compute or kind == "compute"
            memory = self.figures.get(match["name"], DeviceMemory())
            key = _FIELD[kind]
            self.figures[match["name"]] = replace(memory, **{key: getattr(memory, key) + mib})
        elif " cells, " in text and (match := _KV_SIZE.search(text)):
            self.after_model = True
            self.caches.append(KvCache(float(match["mib"]), int(match["cells"]), int(match["layers"]), int(match["seqs"]),
                                       int(match["streams"]), match["type_k"], match["type_v"], float(match["k"]),
                                       float(match["v"])))
        elif "llama_context: n_ctx" in text and (match := _N_CTX.search(text)):
            self.after_model = True
            self.n_ctx[match["key"]] = int(match["value"])

    def reset(self) -> None:
        self.figures, self.caches, self.n_ctx = {}, [], {}
        self.after_model = self.saw_compute = False


def _events(lines: Iterable[str]) -> Iterator[tuple[str | None, dict | None]]:
    """(text line, None) for each log text line, (None, data) for each fit_memory_breakdown."""
    for line in lines:
        if not isinstance(line, str):
            continue
        stripped = line.strip()
        if stripped.startswith("{"):
            try:
                record = json.loads(stripped)
            except (ValueError, RecursionError):  # RecursionError: nesting too deep for the decoder
                record = None
            if isinstance(record, dict):
                if record.get("type") == "fit_memory_breakdown":
                    yield None, record.get("data")
                elif isinstance(record.get("msg"), str):
                    for text in record["msg"].splitlines():
                        yield text, None
                continue
        yield line.rstrip("\n"), None


def _breakdown(data: object) -> dict[str, DeviceMemory] | None:
    if not isinstance(data, dict) or data.get("unit") != "MiB" or not isinstance(data.get("rows"), list):
        return None
    devices: dict[str, DeviceMemory] = {}
    for row in data["rows"]:
        if not isinstance(row, dict) or not isinstance(row.get("name"), str):
            continue
        try:
            devices[row["name"]] = DeviceMemory(_number(row["model"]), _number(row["context"]), _number(row["compute"]))
        except (KeyError, ValueError):
            continue
    return devices or None


def _rounded(item: DeviceMemory | KvCache) -> dict:
    return {key: round(value, 2) if isinstance(value, float) else value
            for key, value in ((f.name, getattr(item, f.name)) for f in fields(item))}


def _number(value: object) -> float:
    """A size in MiB from JSON: a finite number >= 0."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        raise ValueError(f"not a size: {value!r}")
    return float(value)


def _count(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"not a count: {value!r}")
    return value


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise ValueError(f"not text: {value!r}")
    return value
