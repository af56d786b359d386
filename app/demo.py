"""The demo database: a realistic day on the simulated fleet, seeded relative to now."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from typing import Iterable, Sequence

from app.gpu.model import CardReading
from app.gpu.simulated import demo_uid
from app.store import bookings as rows
from app.store import events
from app.store.db import write

HOUR = 3600

# (user, cards, start offset h, duration h, class, note): matches the simulated fleet's processes,
# so every card state shows up: alice IN USE, bob IN USE, carol BOOKED idle, dave SQUATTED on 5.
SEED = (
    ("alice", (0, 1), -2, 6, "finetune", "llama3-8b LoRA sweep"),
    ("bob", (2,), -20, 44, "online", "qwen2.5-14b chat endpoint"),
    ("carol", (3,), -1, 3, "experiment", "kv-cache quantisation tests"),
    ("erin", (7,), 2, 4, "batch", "nightly embeddings"),
    ("frank", (4, 5, 6, 7), 20, 10, "finetune", "70B full fine-tune, run 2"),
    ("alice", (0, 1), 30, 8, "batch", "eval harness"),
)


def demo_db_path(environ=os.environ) -> Path:
    state = Path(environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    directory = state / "board"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / "demo.db"


def seed_if_empty(
    conn: sqlite3.Connection, cards: Sequence[CardReading], now: float | None = None, bookings: Iterable[tuple] = SEED
) -> bool:
    """Fill an empty demo database with `bookings` (as SEED); True when it seeded. Hours are aligned so the
    calendar reads well; bookings on cards the fleet lacks are skipped."""
    now = int(time.time() if now is None else now)
    base = now - now % HOUR
    with write(conn):
        if conn.execute("SELECT count(*) FROM bookings").fetchone()[0]:
            return False
        rows.sync_cards(conn, cards, now)
        uuid = {c.index: c.uuid for c in cards}
        for user, cards, offset, hours, klass, note in bookings:
            if any(c not in uuid for c in cards):
                continue
            start = base + offset * HOUR
            booking_id = rows.insert(
                conn, user=user, uid=demo_uid(user), uuids=[uuid[c] for c in cards], start=start,
                end=start + hours * HOUR, klass=klass, note=note, request=None, now=now, created_by=0,
            )
            events.record(conn, ts=now, uid=0, actor="demo", action="create", booking_id=booking_id, ok=True,
                          details={"cards": list(cards), "seeded": True})
    return True
