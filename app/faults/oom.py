"""Out of memory in llama.cpp's own words: the lines a server logs when it cannot allocate on a card."""

from __future__ import annotations

import re
from collections.abc import Iterable

from app.core.cardstate import FULL_FRACTION
from app.faults import store
from app.store import bookings as rows

# ggml-cuda: "cudaMalloc failed: out of memory"; llama.cpp: "failed to allocate CUDA0 buffer of size ...",
# "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer", "CUDA error: out of memory".
_OOM = re.compile(r"cudaMalloc failed: out of memory|failed to allocate|CUDA error: out of memory", re.IGNORECASE)


def oom_line(lines: Iterable[str]) -> str | None:
    """The first line that says the server ran out of GPU memory, or None."""
    for line in lines:
        if _OOM.search(line):
            return line.strip()
    return None


def record_server_oom(conn, *, ts: float, booking_id: int | None, user: str | None, server_id: int,
                      card_uuids: Iterable[str], tail: Iterable[str]) -> int | None:
    """A server that ended with an out-of-memory line in its log is an OOM fault; its id, or None. Call inside the
    write transaction that records the server's end."""
    line = oom_line(tail)
    if line is None:
        return None
    cards = list(card_uuids)
    # One card: that card. A server split over several cannot say which one ran out: the fault names none.
    return store.record(conn, ts=ts, kind="oom", card_uuid=cards[0] if len(cards) == 1 else None,
                        detail=f"server {server_id}: {line}", booking_id=booking_id, user=user)


# ggml-cuda, when the build has no code for the card: "CUDA error: no kernel image is available for execution on the
# device".
_NO_KERNEL = re.compile(r"no kernel image is available", re.IGNORECASE)
REBUILD_HINT = ("rebuild llama.cpp for these cards: cmake -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=<compute capability"
                " without the dot, 120 for an RTX 5090>; board doctor checks the build")


def record_server_build(conn, *, ts: float, booking_id: int | None, user: str | None, server_id: int,
                        card_uuids: Iterable[str], tail: Iterable[str]) -> int | None:
    """A server whose log says "no kernel image is available" was built without its cards' architecture: a `build`
    fault with the rebuild hint; its id, or None. Call inside the write transaction that records the server's end."""
    line = next((line.strip() for line in tail if _NO_KERNEL.search(line)), None)
    if line is None:
        return None
    cards = list(card_uuids)
    return store.record(conn, ts=ts, kind="build", card_uuid=cards[0] if len(cards) == 1 else None,
                        detail=f"server {server_id}: {line}; {REBUILD_HINT}", booking_id=booking_id, user=user)


def full_cards(snapshot, card_uuids: Iterable[str]) -> list[str]:
    """Those of the cards that the snapshot shows FULL (VRAM at 90 % or more, app.core.cardstate's rule)."""
    wanted = set(card_uuids)
    return [c.uuid for c in snapshot.cards if c.uuid in wanted and c.memory_used_mib is not None
            and c.memory_total_mib and c.memory_used_mib >= FULL_FRACTION * c.memory_total_mib]


def record_job_oom(conn, *, ts: float, snapshot, card_uuids: Iterable[str], booking_id: int | None,
                   pid: int) -> int | None:
    """A `board run` job that exited while its card was FULL (in the last reading before it went) counts as an
    OOM: its exit status is not ours to see, so a full card is the evidence. Call inside a write transaction."""
    if snapshot is None:
        return None
    full = full_cards(snapshot, card_uuids)
    if not full:
        return None
    booking = rows.get(conn, booking_id) if booking_id is not None else None
    return store.record(conn, ts=ts, kind="oom", card_uuid=full[0], booking_id=booking_id,
                        user=booking.user if booking is not None else None,
                        detail=f"board run job {pid} exited while card {', '.join(full)} was FULL")
