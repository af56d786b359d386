"""Fair share: among waiting bookings of one class, the project that used least against its share goes first.

A project's use is the card-seconds its bookings held up to now, each moment weighted 0.5 ** (age / half-life)
([policy] fair_share_half_life_days), so last month's big run weighs little and yesterday's much; its standing is that
use over its share ([[projects]] share). On a board without [[projects]] every booking is for the one implicit
project: all stand equal, and the queue is first come as it always was.
"""

from __future__ import annotations

import math
from typing import Iterable, Mapping, Sequence

from app.config import CLASSES, Config
from app.core import projects
from app.model import Booking

DAY_S = 86400
LOOKBACK_HALF_LIVES = 10  # use older than this weighs under 1/1024 of today's: the read leaves it out


def half_life_s(config: Config) -> float:
    return config.policy.fair_share_half_life_days * DAY_S


def lookback(config: Config, now: int) -> int:
    """From when the bookings that count are read: those ending after it."""
    return int(now - LOOKBACK_HALF_LIVES * half_life_s(config))


def decayed_use(spans: Iterable[tuple[str, int, int, int]], now: float, half_life: float) -> dict[str, float]:
    """Each project's decayed card-seconds at `now`, from the live bookings' (project, start, end, cards)
    (app.store.bookings.card_spans): the integral of the cards held up to `now`, weighted 2 ** -(age / half_life).
    Exact: over [s, e] the weight integrates to half_life / ln 2 * (2 ** -((now - e) / half_life) -
    2 ** -((now - s) / half_life)). Time after `now` counts nothing."""
    rate = math.log(2) / half_life
    use: dict[str, float] = {}
    for project, start, end, cards in spans:
        until = min(end, now)
        if until <= start:
            continue
        # expm1 keeps a short span exact where the difference of two near-equal powers would lose it
        weight = math.exp(-rate * (now - until)) * -math.expm1(-rate * (until - start)) / rate
        use[project] = use.get(project, 0.0) + weight * cards
    return use


def share(config: Config, project: str) -> float:
    """A project's weight; 1 for a booking of no project (made before [[projects]]) or of one since removed."""
    found = projects.named(config, project)
    return found.share if found is not None else 1.0


def standings(config: Config, spans: Iterable[tuple[str, int, int, int]], now: float) -> dict[str, float]:
    """Each project's decayed use (decayed_use) over its share: the lower, the sooner its waiting bookings go. Empty
    on a board without [[projects]], where every booking stands equal."""
    if not config.projects:
        return {}
    return {name: used / share(config, name) for name, used in decayed_use(spans, now, half_life_s(config)).items()}


_RANK = {klass: i for i, klass in enumerate(CLASSES)}


def queue_order(booking: Booking, standing: Mapping[str, float]) -> tuple:
    """The queue's order: class (online first), then the project's standing (least used against its share first),
    then when it was wanted from (first come), then id."""
    return _RANK.get(booking.klass, len(_RANK)), standing.get(booking.project, 0.0), booking.requested_at, booking.id


def place(booking: Booking, waiting: Sequence[Booking], standing: Mapping[str, float], config: Config) -> str:
    """Where a waiting booking is in its queue and why, for `board wait`: "2nd of 3 in the batch queue: project B
    (used 12.0 h against share 1, decayed) goes before project A (96.0 h against share 2); then first come".
    `waiting`: the queue in its order (queue_order), `booking` among them."""
    ahead = [b for b in waiting if _RANK.get(b.klass, len(_RANK)) < _RANK.get(booking.klass, len(_RANK))]
    mine = [b for b in waiting if b.klass == booking.klass]
    where = next(i for i, b in enumerate(mine) if b.id == booking.id) + 1
    words = f"{ordinal(where)} of {len(mine)} in the {booking.klass} queue: "
    names = list(dict.fromkeys(b.project for b in mine))
    if len(names) > 1:
        first, *rest = names
        words += f"{_label(first)} (used {_stood(config, first, standing)}, decayed) goes before " + ", then ".join(
            f"{_label(name)} ({_stood(config, name, standing)})" for name in rest) + "; then first come"
    else:
        words += "first come"
    if ahead:
        classes = ", ".join(dict.fromkeys(b.klass for b in ahead))
        words += f"; {len(ahead)} waiting {classes} {'booking goes' if len(ahead) == 1 else 'bookings go'} first"
    return words


def _label(project: str) -> str:
    return f"project {project}" if project else "no project"


def _stood(config: Config, project: str, standing: Mapping[str, float]) -> str:
    weight = share(config, project)
    return f"{standing.get(project, 0.0) * weight / 3600:.1f} h against share {weight:g}"


def ordinal(n: int) -> str:
    """1st, 2nd, 3rd, 4th, 11th, 12th, 13th, 21st."""
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"
