"""The entities every layer shares, with no behaviour beyond what they are: a leaf module."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Booking:
    id: int
    user: str
    uid: int
    cards: tuple[int, ...]  # NVML indexes, in the same order as card_uuids
    card_uuids: tuple[str, ...]
    start: int  # UTC epoch seconds, half-open [start, end)
    end: int
    klass: str
    note: str
    status: str  # booked | cancelled
    request: dict[str, Any] | None = None
    created_at: int = 0

    def active(self, now: float) -> bool:
        return self.status == "booked" and self.start <= now < self.end
