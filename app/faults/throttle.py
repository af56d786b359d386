"""Thermal throttling as spells: a card's clocks slowed for heat from one reading until the first reading without.

The tracker sees every snapshot's throttle reasons; a spell is recorded once, when it ends (or when the service
stops while it goes on), with its duration, so the table holds one row per spell rather than one per sample.
"""

from __future__ import annotations

from dataclasses import dataclass

from app.gpu.model import (
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_HW_THERMAL,
    THROTTLE_SW_THERMAL,
    THROTTLE_THERMAL,
    FleetSnapshot,
)

_NAMES = ((THROTTLE_HW_SLOWDOWN, "HW slowdown"), (THROTTLE_HW_THERMAL, "HW thermal"), (THROTTLE_SW_THERMAL, "SW thermal"))


@dataclass(frozen=True, slots=True)
class Spell:
    card_uuid: str
    started: float
    duration_s: float
    reasons: int  # the thermal bits seen during the spell, OR-ed
    ongoing: bool = False  # still throttling when the service stopped

    @property
    def detail(self) -> str:
        names = [name for bit, name in _NAMES if self.reasons & bit]
        return ", ".join(names) + (" (still on when the service stopped)" if self.ongoing else "")


class ThrottleTracker:
    def __init__(self) -> None:
        self._open: dict[str, tuple[float, int]] = {}  # card uuid -> (started, reasons so far)

    def observe(self, snapshot: FleetSnapshot) -> list[Spell]:
        """The spells that ended with this snapshot. A card that is lost or cannot say ends its spell too."""
        ended = []
        now = snapshot.taken_at
        for card in snapshot.cards:
            bits = (card.throttle_reasons or 0) & THROTTLE_THERMAL
            spell = self._open.get(card.uuid)
            if bits and not card.lost:
                self._open[card.uuid] = (now, bits) if spell is None else (spell[0], spell[1] | bits)
            elif spell is not None:
                del self._open[card.uuid]
                ended.append(Spell(card.uuid, spell[0], now - spell[0], spell[1]))
        return ended

    def close(self, now: float) -> list[Spell]:
        """The spells still on: recorded at shutdown, with the time so far."""
        spells = [Spell(uuid, started, now - started, bits, ongoing=True) for uuid, (started, bits) in self._open.items()]
        self._open.clear()
        return spells
