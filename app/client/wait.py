"""Waiting for a booking to start: `board wait ID` and `board run --booking ID --wait`.

Polls the booking rather than holding a subscription: a start moved earlier by the backfill or an
admin is seen within POLL_S, and the start itself is slept to exactly. Progress goes to stderr.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO

from app.core.text import format_cards, format_when, inert
from app.errors import Conflict

POLL_S = 5.0


def wait_for_start(client, booking_id: int, *, timeout: float | None = None, clock: Callable[[], float] = time.time,
                   sleep: Callable[[float], None] = time.sleep, progress: TextIO | None = None) -> dict:
    """The booking once it has started; Conflict (exit 3) when it is cancelled, over, or `timeout` runs out."""
    progress = progress or sys.stderr
    deadline = None if timeout is None else clock() + timeout
    shown = None
    while True:
        booking = client.call("get", id=booking_id)
        now = clock()
        why = f" ({inert(booking['notice'], 80)})" if booking.get("notice") else ""
        if booking["status"] == "cancelled":
            by = why if why.startswith(" (cancelled") else ""
            raise Conflict(f"booking {booking_id} was cancelled{by}; nothing to wait for")
        if booking["end"] <= now:
            raise Conflict(f"booking {booking_id} ended {format_when(booking['end'], now)}; nothing to wait for")
        if booking["start"] <= now:
            return booking
        if deadline is not None and now >= deadline:
            raise Conflict(f"booking {booking_id} has not started: it starts {format_when(booking['start'], now)}")
        if (booking["start"], booking["cards"], booking.get("place")) != shown:
            shown = (booking["start"], booking["cards"], booking.get("place"))
            # a queued booking's place and why: its class, then its project's fair share, then first come
            place = f"; {inert(booking['place'], 300)}" if booking.get("place") else ""
            print(f"board: waiting for booking {booking_id}: starts {format_when(booking['start'], now)} on cards"
                  f" {format_cards(booking['cards'])}{why}{place}", file=progress, flush=True)
        pause = min(POLL_S, booking["start"] - now)
        if deadline is not None:
            pause = min(pause, deadline - now)
        sleep(max(pause, 0.05))
