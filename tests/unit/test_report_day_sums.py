"""The report's day sums (app.history.store.summarise, app.report.gather): a finished day's rollups summed per card,
stretch and what the report tests, so a year's report does not read 841 k rollups again; the figures are those of
the rollups one by one, whatever the bookings did, and an older file without the sums loses nothing."""

from __future__ import annotations

import random

import pytest

from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED
from app.history.store import BUCKET_S, DAY_BUCKETS, EPOCH, STATES, SUM_BITS, HistoryStore, Sample, _bucket_id
from app.model import Booking
from app.report.compute import compute
from app.report.gather import summed_rollups

DAYS = 12
NOW = EPOCH + 700 * 86400 + 7 * 3600 + 1200  # a day and a bucket cut by the window's ends
UUIDS = ("GPU-a", "GPU-b", "GPU-c")
MEMORY = 32768


def _year(store: HistoryStore, seed: int = 3) -> list[Booking]:
    """DAYS days of rollups up to NOW for three cards, from a seeded schedule of bookings: starting and ending
    anywhere in a bucket, now and then back to back; booked cards idle or in use (now and then lost), free ones
    now and then squatted; utilisation on both sides of the thresholds, some cards full or hot, some metrics
    unknown. Returns the bookings."""
    rng = random.Random(seed)
    for i, uuid in enumerate(UUIDS):
        store.card_id(uuid, i, "RTX 5090", MEMORY if i < 2 else None)
    ids = store.cards()
    start = (NOW - DAYS * 86400) // BUCKET_S * BUCKET_S
    bookings, rows = [], []
    for index, uuid in enumerate(UUIDS):
        t, spans = start, []
        while t < NOW:
            t += 0 if spans and rng.random() < 0.3 else rng.randint(0, 20 * 3600)  # back to back, or a gap
            end = t + rng.randint(600, 40 * 3600)
            spans.append((t, end, len(bookings) + len(spans) + 1))
            t = end
        for begin, end, id in spans:
            bookings.append(Booking(id=id, user=rng.choice(("alice", "bob", "carol")), uid=1000 + id, cards=(index,),
                                    card_uuids=(uuid,), start=begin, end=end, klass=rng.choice(("batch", "online")),
                                    note="", status="booked", requested_at=begin - rng.randint(0, 3600)))
        at = 0
        for bucket in range(start, NOW - NOW % BUCKET_S, BUCKET_S):
            while at < len(spans) and spans[at][1] <= bucket + BUCKET_S // 2:
                at += 1
            booked = at < len(spans) and spans[at][0] <= bucket + BUCKET_S // 2
            state = (LOST if rng.random() < 0.02 else IN_USE if rng.random() < 0.7 else BOOKED) if booked else \
                (SQUATTED if rng.random() < 0.05 else FREE)
            util = rng.choice((0, 5, 9, 10, 11, 50, 51, 90)) if state in (IN_USE, SQUATTED) else 0
            row = {"id": _bucket_id(bucket, ids[uuid]), "n": 30, "dt": 10, "state": STATES.index(state),
                   "n_throttled": 0, "throttle": 0}
            if state != LOST:
                vram = rng.choice((1000, 29000, 29491, 29492, 32000))
                temp = rng.choice((60, 91, 92, 95))
                row |= {"util_min": util // 2, "util_mean_d": util - util // 2, "util_max_d": util,
                        "vram_min": vram - 500, "vram_mean_d": 100, "vram_max_d": 500,
                        "temp_min": temp - 3, "temp_mean_d": 1, "temp_max_d": 3}
            rows.append(row)
    store.db["rollups"].insert_all(rows, batch_size=2000)
    store.db["meta"].upsert({"key": "rolled_to", "value": NOW - NOW % BUCKET_S}, pk="key")
    return bookings


@pytest.fixture
def year(tmp_path):
    store = HistoryStore(tmp_path / "board.history.db")
    bookings = _year(store)
    yield store, bookings
    store.close()


def _doc(bookings, rollups, by, busy_util, since_s, now=NOW):
    return compute(bookings, rollups, [], [], now=now, since_s=since_s, by=by, busy_util=busy_util,
                   cards={u: str(i) for i, u in enumerate(UUIDS)}, pools={UUIDS[0]: "big", UUIDS[1]: "big+small"},
                   memory_total={u: MEMORY for u in UUIDS[:2]})  # as the history has them


def _steps(store, call) -> tuple[object, int]:
    """call() and the SQLite virtual machine's steps it took (in thousands): the work of its reads."""
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    store.db.conn.set_progress_handler(count, 1000)
    try:
        return call(), steps[0]
    finally:
        store.db.conn.set_progress_handler(None, 0)


@pytest.mark.parametrize("busy_util", [10, 51])
def test_summed_days_give_the_report_of_the_rollups_one_by_one(year, busy_util):
    store, bookings = year
    assert store.summarise(busy_util, days=None) == DAYS  # every finished day (today's is not)
    assert store.summarise(busy_util, days=None) == 0
    since_s = (DAYS - 2) * 86400 + 5000  # starts inside a day and a bucket
    start = NOW - since_s
    one_by_one = store.rollups(start, NOW)
    summed = summed_rollups(store, start, NOW, bookings, busy_util)
    for by in ("user", "class", "pool", "card"):
        assert _doc(bookings, summed, by, busy_util, since_s) == _doc(bookings, one_by_one, by, busy_util, since_s)
    # And the rows themselves are those of the one pass over the rollups (their first bucket aside).
    store.db.execute("DELETE FROM summed_days")
    unsummed = summed_rollups(store, start, NOW, bookings, busy_util)
    assert [{**r, "ts": 0} for r in summed] == [{**r, "ts": 0} for r in unsummed]


def test_a_summed_year_is_not_read_again_from_its_rollups(year):
    """The report reads the summed days' sums, and the rollups only where no sum answers (the days the window
    cuts, today, a stretch a booking held in part): a fraction of the work of the one pass over them all."""
    store, bookings = year
    start = NOW - DAYS * 86400
    unsummed, before = _steps(store, lambda: summed_rollups(store, start, NOW, bookings, 10))
    store.summarise(10, days=None)
    summed, after = _steps(store, lambda: summed_rollups(store, start, NOW, bookings, 10))
    assert _doc(bookings, summed, "user", 10, DAYS * 86400) == _doc(bookings, unsummed, "user", 10, DAYS * 86400)
    # (3 cards for 12 days, a third of the bookings back to back, whose stretches are read again: a year of 8
    # cards does better, bench/bench_report.py)
    assert after * 4 < before, (after, before)


def test_a_day_summed_for_another_busy_util_or_pruned_is_read_from_its_rollups(year):
    store, bookings = year
    since_s = DAYS * 86400
    start = NOW - since_s
    one_by_one = {u: _doc(bookings, store.rollups(start, NOW), "user", u, since_s) for u in (10, 50)}
    store.summarise(50, days=None)
    assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "user", 10, since_s) == one_by_one[10]
    assert store.summarise(10, days=3) == 3  # the newest three again, for 10 %
    for util in (10, 50):
        assert _doc(bookings, summed_rollups(store, start, NOW, bookings, util), "user", util, since_s) \
            == one_by_one[util]
    # Pruning half a day: that day's sums go with it, and it is summed again from what is left.
    cut = NOW - (DAYS - 1) * 86400
    store.prune(NOW, raw_hours=48, rollup_days=(NOW - cut) / 86400)
    day = (cut - EPOCH) // BUCKET_S // DAY_BUCKETS
    assert store.db.execute("SELECT count(*) FROM summed_days WHERE day <= ?", [day]).fetchone()[0] == 0
    left = _doc(bookings, store.rollups(start, NOW), "user", 10, since_s)
    assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "user", 10, since_s) == left
    store.summarise(10, days=None)
    assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "user", 10, since_s) == left


def test_a_file_from_before_the_day_sums_gains_them_and_loses_nothing(tmp_path):
    """A history written before the day sums (no day_sums, no summed_days): opened, it gains the tables, empty;
    its report reads the rollups until the sampler has summed its days, and is the same after."""
    path = tmp_path / "board.history.db"
    store = HistoryStore(path)
    bookings = _year(store)
    store.db.execute("DROP TABLE day_sums")
    store.db.execute("DROP TABLE summed_days")
    rollups = store.db.execute("SELECT * FROM rollups ORDER BY id").fetchall()
    store.close()

    store = HistoryStore(path)
    try:
        assert {"day_sums", "summed_days"} <= set(store.db.table_names())
        assert store.db["day_sums"].count == 0
        start = NOW - DAYS * 86400
        expected = _doc(bookings, store.rollups(start, NOW), "card", 10, DAYS * 86400)
        assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "card", 10, DAYS * 86400) == expected
        assert store.summarise(10) == 7  # a week at a time, newest first
        assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "card", 10, DAYS * 86400) == expected
        assert store.summarise(10) == DAYS - 7
        assert _doc(bookings, summed_rollups(store, start, NOW, bookings, 10), "card", 10, DAYS * 86400) == expected
        assert store.db.execute("SELECT * FROM rollups ORDER BY id").fetchall() == rollups
    finally:
        store.close()


def test_back_to_back_bookings_are_cut_where_the_samples_change_holder(tmp_path):
    """The sampler sums a day while its raw samples are kept: its stretches end where the samples' booking
    changes, so two bookings back to back in one state are two stretches, each taken whole by the report."""
    store = HistoryStore(tmp_path / "board.history.db")
    try:
        store.card_id(UUIDS[0], 0, "RTX 5090", MEMORY)
        day = EPOCH + 700 * 86400
        first, second = day + 6 * 3600, day + 9 * 3600  # 3 h each, back to back, both in use
        store.add([Sample(ts=t, uuid=UUIDS[0], state=IN_USE if first <= t < second + 3 * 3600 else FREE, dt=300,
                          util=50 if first <= t < second + 3 * 3600 else 0,
                          booking=1 if first <= t < second else 2 if second <= t < second + 3 * 3600 else None)
                   for t in range(day, day + 86400, BUCKET_S)])
        store.roll_up(day + 86400 + BUCKET_S)
        assert store.summarise(10) == 1
        starts = {key >> SUM_BITS for key, in store.db.execute("SELECT id FROM day_sums")}
        assert (second - EPOCH) // BUCKET_S in starts
        bookings = [Booking(id=i, user=user, uid=1000 + i, cards=(0,), card_uuids=(UUIDS[0],), start=begin,
                            end=begin + 3 * 3600, klass="batch", note="", status="booked", requested_at=begin)
                    for i, user, begin in ((1, "alice", first), (2, "bob", second))]
        summed = summed_rollups(store, day, day + 86400, bookings, 10)
        assert {r["booking_id"]: r["seconds"] for r in summed if r["booking_id"]} == {1: 3 * 3600, 2: 3 * 3600}
        one_by_one = store.rollups(day, day + 86400)
        assert _doc(bookings, summed, "user", 10, 86400, day + 86400) \
            == _doc(bookings, one_by_one, "user", 10, 86400, day + 86400)
    finally:
        store.close()
