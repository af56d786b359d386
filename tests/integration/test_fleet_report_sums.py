"""The report's rollups from a PostgreSQL store (app.report.gather.fleet_sums): summed in the database per booking, card,
state and what the verdicts test, so a year of a fleet does not move its millions of rollups to Python; the report is
the one the rollups one by one give. The rollups are the seeded schedule of tests/unit/test_report_day_sums.py (three
cards, twelve days, bookings starting and ending anywhere in a bucket, metrics on both sides of each threshold, some
unknown), written to the store as a host's pusher writes them. The `postgresql` tier."""

from __future__ import annotations

import json

import pytest
from msgspec import structs

from app.config import Config, FleetSettings
from app.history.fleet import push
from app.history.store import BUCKET_S, STATES, HistoryStore
from app.report.gather import fleet_sums, report_reply
from app.store.pg import PgConnection
from tests.conftest import postgresql_only
from tests.unit.test_report_day_sums import DAYS, MEMORY, NOW, UUIDS, _doc, _year


@pytest.fixture
def fleet_store(tmp_path, store):
    """(a connection as host gpu1's, the bookings): the schedule's rollups in the store as host gpu2's."""
    history = HistoryStore(tmp_path / "gpu2.history.db")
    bookings = _year(history)
    conn = PgConnection(structs.replace(store, host="gpu1"))
    assert push(history, conn, "gpu2") > 0
    history.close()
    yield conn, bookings
    conn.close()


def one_by_one(conn, start: int, end: int) -> list[dict]:
    """The store's rollups one by one, as compute takes a raw rollup (what the report read before it summed)."""
    return [{"ts": ts, "uuid": uuid, "n": n, "seconds": n * dt, "span": BUCKET_S, "state": STATES[state],
             "util_mean": None if util is None or util_d is None else util + util_d,
             "vram_max": None if vram is None or vram_d is None else vram + vram_d,
             "temp_max": None if temp is None or temp_d is None else temp + temp_d}
            for ts, uuid, n, dt, state, util, util_d, vram, vram_d, temp, temp_d in conn.execute(
                "SELECT ts, card_uuid, n, dt, state, util_min, util_mean_d, vram_min, vram_max_d, temp_min, temp_max_d"
                " FROM rollups WHERE ts >= ? AND ts < ? ORDER BY ts, card_uuid", [start, end])]


@postgresql_only
@pytest.mark.parametrize("busy_util", [10, 51])
def test_the_stores_sums_give_the_report_of_the_rollups_one_by_one(fleet_store, busy_util):
    conn, bookings = fleet_store
    memory = {u: MEMORY for u in UUIDS[:2]}
    for since_s in ((DAYS - 2) * 86400 + 5000, DAYS * 86400 + 3 * 3600):  # from inside a bucket; from before the first
        start = NOW - since_s
        rollups = one_by_one(conn, start, NOW)
        summed = fleet_sums(conn, start, {}, NOW, bookings, busy_util, memory)
        assert len(summed) < len(rollups) / 4, (len(summed), len(rollups))
        for by in ("user", "class", "pool", "card"):
            # the same document, to the byte
            assert json.dumps(_doc(bookings, summed, by, busy_util, since_s)) == \
                json.dumps(_doc(bookings, rollups, by, busy_util, since_s)), (by, since_s)
    # this host's own rollups end where its history file takes over; other hosts' at now
    start = NOW - 3 * 86400
    cut = NOW - 86400
    here = fleet_sums(conn, start, {"gpu2": cut}, NOW, bookings, busy_util, memory)
    assert json.dumps(_doc(bookings, here, "card", busy_util, 3 * 86400)) == \
        json.dumps(_doc(bookings, one_by_one(conn, start, cut), "card", busy_util, 3 * 86400))


class Counted:
    """A store connection that counts the rows its reads hand to Python."""

    def __init__(self, conn) -> None:
        self.conn, self.rows = conn, 0

    def __getattr__(self, name):
        return getattr(self.conn, name)

    def execute(self, sql, params=None):
        found = self.conn.execute(sql, params).fetchall()
        self.rows += len(found)
        return Rows(found)


class Rows(list):
    def fetchone(self):
        return self.pop(0) if self else None

    def fetchall(self):
        return list(self)


@postgresql_only
def test_the_report_moves_sums_from_the_store_not_its_rollups(fleet_store, tmp_path):
    conn, _ = fleet_store
    (count,) = conn.execute("SELECT count(*) FROM rollups").fetchone()
    assert count == DAYS * 86400 // BUCKET_S * len(UUIDS)  # 10,368
    counted = Counted(conn)
    config = Config(fleet=FleetSettings(host="gpu1"))
    doc = report_reply(counted, HistoryStore(tmp_path / "absent.history.db"), config, [], NOW, DAYS * 86400, "card")
    assert {r["key"] for r in doc["rows"]} == set(UUIDS) and doc["total"]["util_mean_pct"] is not None
    # per card, state and what the verdicts test (no bookings here), and the store's cards and marks: not 10,368
    assert counted.rows < 200, counted.rows
