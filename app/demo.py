"""The demo database: the seeds' standing plan on the simulated fleet, seeded around now.

Prod (cards 0-3) serves online inference as one TP4 group 09:00-19:00 on weekdays and fine-tunes at
night and over the weekend; lab (cards 4-7) takes experiments and one-off jobs. The demo's pools say
the same (`demo_config`), so the board shows the rules and the service keeps them.
"""

from __future__ import annotations

import os
import sqlite3
import time
from datetime import date, datetime, timedelta
from pathlib import Path

from msgspec.structs import replace

from typing import Iterable, Sequence

from app.config import ClassWindow, Config, Pool
from app.gpu.model import CardReading
from app.gpu.simulated import DEMO_UIDS, demo_uid
from app.store import bookings as rows
from app.store import events
from app.store.db import write

HOUR = 3600
PROD, LAB = (0, 1, 2, 3), (4, 5, 6, 7)
DAY_START, NIGHT_START = 9, 19  # prod's online day, local hours

# The example pools of docs/configuration.md: prod takes finetune only at night and at weekends, lab caps a booking at 12 h.
DEMO_POOLS = (
    Pool("prod", PROD, classes=("online", "batch", "finetune"),
         windows={"finetune": ClassWindow(NIGHT_START * 60, DAY_START * 60, weekends=True)}),
    Pool("lab", LAB, max_hours=12),
)

# One-off lab bookings (user, cards, start offset h, duration h, class, note), beside the simulated fleet's
# processes: carol's card BOOKED idle, dave SQUATTED on 5 before his booking, card 7 FREE (and hot).
SEED = (
    ("carol", (4,), -1, 3, "experiment", "kv-cache quantisation tests"),
    ("erin", (7,), 2, 4, "batch", "nightly embeddings"),
    ("dave", (5, 6), 4, 6, "experiment", "eval shards 1-4"),
    ("frank", LAB, 20, 10, "finetune", "70B full fine-tune, run 2"),
    ("alice", (4, 5), 30, 8, "batch", "eval harness"),
)


def demo_person(conn: sqlite3.Connection, cards: Sequence[CardReading], name: str) -> tuple[str, int] | None:
    """(name, uid) of one of the demo's made-up people, who have no account on this machine: whoever holds a
    booking in the demo database (with the uid it carries), the demo team, or a user of the simulated cards."""
    row = conn.execute('SELECT uid FROM bookings WHERE "user" = ? ORDER BY id DESC LIMIT 1', (name,)).fetchone()
    if row is not None:
        return name, row[0]
    if name in DEMO_UIDS or any(p.user == name for c in cards for p in c.processes):
        return name, demo_uid(name)
    return None


def demo_db_path(environ=os.environ) -> Path:
    state = Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    directory = state / "board"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "demo.db"


def demo_config(config: Config) -> Config:
    """The demo's pools, unless the config names its own."""
    return config if config.pools else replace(config, pools=DEMO_POOLS)


def _at(day: date, hour: int) -> int:
    return int(datetime(day.year, day.month, day.day, hour).timestamp())  # naive: local time, DST included


def standing_plan(now: float, days: int = 7) -> list[tuple[str, tuple[int, ...], int, int, str, str]]:
    """Prod's standing arrangement from the last weekend before `now` to `days` ahead, as
    (user, cards, start, end, class, note): bob's TP4 online service 09:00-19:00 on weekdays, alice's
    finetune every weeknight, and one finetune from Friday 19:00 to Monday 09:00. Prod is never idle."""
    today = datetime.fromtimestamp(now).date()
    plan: list[tuple[str, tuple[int, ...], int, int, str, str]] = []
    for n in range(-3, days + 1):  # three days back: last Friday's weekend booking still covers a Monday morning
        day = today + timedelta(days=n)
        if day.weekday() >= 5:
            continue
        plan.append(("bob", PROD, _at(day, DAY_START), _at(day, NIGHT_START), "online", "prod TP4: qwen2.5-72b chat"))
        if day.weekday() == 4:
            end, note = _at(day + timedelta(days=3), DAY_START), "weekend finetune: llama3-8b LoRA sweep"
        else:
            end, note = _at(day + timedelta(days=1), DAY_START), "nightly finetune: llama3-8b LoRA"
        plan.append(("alice", PROD, _at(day, NIGHT_START), end, "finetune", note))
    return plan


def seed_if_empty(
    conn: sqlite3.Connection, cards: Sequence[CardReading], now: float | None = None,
    bookings: Iterable[tuple] | None = None,
) -> bool:
    """Fill an empty demo database; True when it seeded. By default the standing plan on prod and SEED on
    lab; `bookings` (shaped as SEED) replaces both. Offsets count from the hour, so the calendar reads
    well. A booking keeps the cards the fleet has (a two-card scenario still has prod's plan on 0-1)."""
    now = int(time.time() if now is None else now)
    base = now - now % HOUR
    if bookings is None:
        found = [*standing_plan(now), *_absolute(SEED, base)]
    else:
        found = _absolute(bookings, base)
    with write(conn):
        if conn.execute("SELECT count(*) FROM bookings").fetchone()[0]:
            return False
        rows.sync_cards(conn, cards, now)
        uuid = {c.index: c.uuid for c in cards}
        for user, wanted, start, end, klass, note in found:
            held = tuple(c for c in wanted if c in uuid)
            if not held:
                continue
            booking_id = rows.insert(
                conn, user=user, uid=demo_uid(user), uuids=[uuid[c] for c in held], start=start,
                end=end, klass=klass, note=note, request=None, now=now, created_by=0,
            )
            events.record(conn, ts=now, uid=0, actor="demo", action="create", booking_id=booking_id, ok=True,
                          details={"cards": list(held), "seeded": True})
    return True


def _absolute(bookings: Iterable[tuple], base: int) -> list[tuple]:
    return [(user, cards, base + offset * HOUR, base + (offset + hours) * HOUR, klass, note)
            for user, cards, offset, hours, klass, note in bookings]
