"""The `history` operation's answer: per card, points for the sparklines, from the store.

A simulated fleet is a pure function of the clock, so where the store holds nothing for the window (a
demo, a first start) its past is replayed instead; real GPUs get what the store holds, or nothing.
"""

from __future__ import annotations

from app.errors import BadInput
from app.gpu.fleet import Fleet
from app.gpu.model import sample
from app.gpu.simulated import replay
from app.history.store import HistoryStore, Point

MAX_SECONDS = 400 * 86400
MAX_POINTS = 5000  # per card


def wire_point(point: Point) -> list:
    """[taken_at, VRAM GiB (most), utilisation % (mean), temperature °C (most), power W (most)]: the sparklines'
    shape (app.gpu.model.sample); 0 where the driver said nothing."""
    return [point.ts, (point.vram.max or 0) / 1024, float(point.util.mean or 0), float(point.temp.max or 0),
            float(point.power.max or 0)]


def history_reply(store: HistoryStore, fleet: Fleet, seconds: int, step: int | None = None,
                  uuid: str | None = None) -> dict[str, list]:
    step = step or max(1, int(fleet.refresh_seconds), 5)
    if not 0 < seconds <= MAX_SECONDS or step <= 0:
        raise BadInput(f"history: seconds is 1 to {MAX_SECONDS}, step more than 0")
    if seconds / step > MAX_POINTS:
        raise BadInput(f"history: at most {MAX_POINTS} points a card; take a step of {-(-seconds // MAX_POINTS)} s"
                       " or more")
    now = fleet.latest().taken_at
    cards = [c.uuid for c in fleet.latest().cards if uuid is None or c.uuid == uuid]
    found: dict[str, list] = {}
    if store.path.exists():
        for card in cards:
            points = store.series(card, now - seconds, now + 1, step)
            if points:
                found[card] = [wire_point(p) for p in points]
    if not found and fleet.simulated:
        found = _replay(fleet, now, seconds, step, cards)
    return found


def _replay(fleet: Fleet, now: float, seconds: int, step: int, cards: list[str]) -> dict[str, list]:
    found: dict[str, list] = {}
    for snapshot in replay(fleet.source, now, seconds, step):
        for card in snapshot.cards:
            if card.uuid in cards:
                found.setdefault(card.uuid, []).append(sample(snapshot.taken_at, card))
    return found
