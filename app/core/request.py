"""A booking's request in memory terms, as `book --model` stores it (app.fit.report.request_record).

A member sends it with `book`, and every member's `board list` and card table show it, so the service
checks it like any argument (`check`): known keys only, each with its type and range. Rows stored
before that check may hold anything: readers take the well-formed fields only (`readable`).
"""

from __future__ import annotations

import math

from app.errors import BadInput

CACHE_TYPES = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "iq4_nl")  # as app.fit.estimate sizes them
MAX_CTX = 2**31 - 1  # llama.cpp's n_ctx is a 32-bit integer
MAX_PARALLEL = 256  # llama.cpp's LLAMA_MAX_SEQ: it refuses more sequences
MAX_CARDS = 64
MAX_MIB = 1 << 30  # a PiB: anything larger is junk, not a figure
MAX_PATH = 4096  # PATH_MAX
CARD_USE = ("weights_mib", "kv_mib", "compute_mib", "overhead_mib", "total_mib")  # app.fit.estimate.CardUse.as_dict

# Each field's check: None when the value is good, else what it should be. (No typing: `board list` loads this.)


def _whole(value, low: int, high: int) -> str | None:
    if isinstance(value, int) and not isinstance(value, bool) and low <= value <= high:
        return None
    return f"a whole number from {low} to {high}"


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else "true or false"


def _path(value) -> str | None:
    if isinstance(value, str) and 0 < len(value) <= MAX_PATH and value.isprintable():
        return None
    return f"a file path of 1 to {MAX_PATH} printable characters"


def _cache_type(value) -> str | None:
    return None if isinstance(value, str) and value in CACHE_TYPES else f"one of {', '.join(CACHE_TYPES)}"


def _mib(value) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and 0 <= value <= MAX_MIB)


def _per_card(value) -> str | None:
    if isinstance(value, list) and 0 < len(value) <= MAX_CARDS and all(
            isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_MIB for v in value):
        return None
    return f"a list of 1 to {MAX_CARDS} whole MiB figures, one per card"


def _estimate(value) -> str | None:
    if isinstance(value, list) and 0 < len(value) <= MAX_CARDS and all(
            isinstance(card, dict) and set(card) == set(CARD_USE) and all(_mib(v) for v in card.values())
            for card in value):
        return None
    return f"a list of 1 to {MAX_CARDS} cards, each {{{', '.join(CARD_USE)}}} in MiB"


FIELDS = {
    "model": _path,
    "ctx": lambda value: _whole(value, 1, MAX_CTX),
    "parallel": lambda value: _whole(value, 1, MAX_PARALLEL),
    "cache_type_k": _cache_type,
    "cache_type_v": _cache_type,
    "flash_attn": _flag,
    "unified": _flag,
    "cards_planned": lambda value: _whole(value, 1, MAX_CARDS),
    "per_card_mib": _per_card,
    "estimate": _estimate,
}
REQUIRED = ("model", "ctx", "parallel")


def check(request: object) -> dict:
    """The request to store; BadInput (one line) for an unknown key or a field out of its type or range."""
    if not isinstance(request, dict):
        raise BadInput("book: request must be an object")
    for key in request:
        if key not in FIELDS:
            raise BadInput(f"book: request has an unknown key {str(key)[:40]!r}; known: {', '.join(FIELDS)}")
    for key in REQUIRED:
        if key not in request:
            raise BadInput(f"book: request needs {key!r}")
    for key, value in request.items():
        if (wrong := FIELDS[key](value)) is not None:
            raise BadInput(f"book: request {key} must be {wrong}")
    planned = request.get("cards_planned")
    for key in ("per_card_mib", "estimate"):
        if key in request and planned is not None and len(request[key]) != planned:
            raise BadInput(f"book: request {key} has {len(request[key])} cards, not cards_planned ({planned})")
    return dict(request)


def readable(request: object) -> dict:
    """The well-formed fields of a stored request, each as `check` would take it; the others left out."""
    if not isinstance(request, dict):
        return {}
    return {key: value for key, value in request.items() if key in FIELDS and FIELDS[key](value) is None}
