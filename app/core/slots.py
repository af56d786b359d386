"""Slot finding: the earliest free start for some cards, and the best-connected free set of N cards."""

from __future__ import annotations

from bisect import bisect_left
from typing import Iterable, Mapping, Sequence

from app.gpu.model import Topology

Interval = tuple[int, int]  # half-open [start, end), UTC epoch seconds
# `busy` maps a card to its booked intervals, sorted by start. They never overlap on one card
# (the store guarantees it), so they are sorted by end too, and one bisect answers "is it free?".

GROUP_SIZES = (1, 2, 4, 8)  # tensor-parallel groups


def overlaps(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def is_free(busy: Mapping[int, Sequence[Interval]], cards: Iterable[int], wanted: Interval) -> bool:
    start, end = wanted
    for card in cards:
        spans = busy.get(card, ())
        before = bisect_left(spans, (end,))  # spans[:before] start before `end`
        if before and spans[before - 1][1] > start:
            return False
    return True


def next_free_start(
    busy: Mapping[int, Sequence[Interval]], cards: Sequence[int], start: int, duration: int, until: int | None = None
) -> int | None:
    """The earliest start at or after `start` where all `cards` are free for `duration`.

    `until`: `busy` is only known up to there, so a slot must end by then (else None).
    Without it the answer always exists: the end of the last booking.
    """
    for candidate in _candidate_starts(busy, cards, start, duration, until):
        if is_free(busy, cards, (candidate, candidate + duration)):
            return candidate
    return None


def best_group(free: Sequence[int], count: int, topology: Topology) -> tuple[int, ...] | None:
    """The `count` cards among `free` that sit closest together (same PCIe switch / NUMA node first).

    Grows a group from every seed by nearest neighbours and keeps the tightest one; on a tree-shaped
    PCIe topology that is the optimum, and it stays cheap for 64 cards.
    """
    if count > len(free):
        return None
    best_score, best = None, None
    for seed in free:
        others = sorted((c for c in free if c != seed), key=lambda c: (topology.level(seed, c), c))
        group = tuple(sorted([seed, *others[: count - 1]]))
        levels = [topology.level(a, b) for i, a in enumerate(group) for b in group[i + 1 :]]
        score = (max(levels, default=0), sum(levels), group)
        if best_score is None or score < best_score:
            best_score, best = score, group
    return best


def find_slot(
    busy: Mapping[int, Sequence[Interval]],
    eligible: Sequence[int],
    count: int,
    start: int,
    duration: int,
    topology: Topology,
    until: int | None = None,
) -> tuple[tuple[int, ...], int] | None:
    """The earliest (cards, start) at or after `start` with `count` best-connected free cards, or None.

    `until` as for next_free_start.
    """
    if count > len(eligible):
        return None
    for candidate in _candidate_starts(busy, eligible, start, duration, until):
        wanted = (candidate, candidate + duration)
        free = [card for card in eligible if is_free(busy, (card,), wanted)]
        if group := best_group(free, count, topology):
            return group, candidate
    return None


def _candidate_starts(
    busy: Mapping[int, Sequence[Interval]], cards: Iterable[int], start: int, duration: int, until: int | None
) -> list[int]:
    # A slot can only open at the requested start or where some booking ends.
    ends = sorted({end for card in cards for _, end in busy.get(card, ()) if end > start})
    return [c for c in [start, *ends] if until is None or c + duration <= until]
