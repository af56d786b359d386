"""Slot finding: the earliest free start for some cards, and the best-connected free set of N cards."""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

from app.gpu.model import Topology

Interval = tuple[int, int]  # half-open [start, end), UTC epoch seconds


def overlaps(a: Interval, b: Interval) -> bool:
    return a[0] < b[1] and b[0] < a[1]


def is_free(busy: Mapping[int, Sequence[Interval]], cards: Iterable[int], wanted: Interval) -> bool:
    return not any(overlaps(wanted, interval) for card in cards for interval in busy.get(card, ()))


def next_free_start(busy: Mapping[int, Sequence[Interval]], cards: Sequence[int], start: int, duration: int) -> int:
    """The earliest start at or after `start` where all `cards` are free for `duration`."""
    for candidate in _candidate_starts(busy, cards, start):
        if is_free(busy, cards, (candidate, candidate + duration)):
            return candidate
    raise AssertionError("unreachable: the last booking's end is always free")


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
) -> tuple[tuple[int, ...], int] | None:
    """The earliest (cards, start) at or after `start` with `count` best-connected free cards, or None."""
    if count > len(eligible):
        return None
    for candidate in _candidate_starts(busy, eligible, start):
        wanted = (candidate, candidate + duration)
        free = [card for card in eligible if is_free(busy, (card,), wanted)]
        if group := best_group(free, count, topology):
            return group, candidate
    return None


def _candidate_starts(busy: Mapping[int, Sequence[Interval]], cards: Iterable[int], start: int) -> list[int]:
    # A slot can only open at the requested start or where some booking ends.
    ends = {end for card in cards for _, end in busy.get(card, ()) if end > start}
    return [start, *sorted(ends)]
