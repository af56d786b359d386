"""The report from a real history file with hand-made samples (one per 5-minute bucket, so every rollup is one
sample and every figure is known exactly), and each verdict at its boundary."""

from __future__ import annotations

import pytest

from app.core.cardstate import BOOKED, FREE, IN_USE, SQUATTED
from app.errors import BadInput
from app.history.store import HistoryStore, Sample
from app.model import Booking
from app.report.compute import WEEK, compute, parse_since
from app.report.render import table, to_csv

H = 3600
NOW = 1_795_966_200 // 300 * 300
A, B, C, E = "GPU-a", "GPU-b", "GPU-c", "GPU-e"


def booking(id, user, uuid, start, end, wait_s, klass="batch"):
    return Booking(id=id, user=user, uid=1000 + id, cards=(0 if uuid == A else 1,), card_uuids=(uuid,), start=start,
                   end=end, klass=klass, note="", status="booked", requested_at=start - wait_s)


def fill(store, uuid, start, hours, state, util, users=(), holder=None, **metrics):
    store.add([Sample(ts=t, uuid=uuid, state=state, dt=300, util=util, users=users, holder=holder, **metrics)
               for t in range(start, start + int(hours * H), 300)])


@pytest.fixture
def scene(tmp_path):
    """alice on card a for 4 h (2 h busy at 50 %, 1 h running at 9 %, 1 h booked and idle), waited 20 min; bob on
    card b for 2 h at 90 %, waited 60 min; carol squats card a for 1 h at 40 % between them; card b is free, full
    and hot for the last hour."""
    store = HistoryStore(tmp_path / "board.history.db")
    store.card_id(A, 0, "RTX 5090", 32768)
    store.card_id(B, 1, "RTX 5090", 32768)
    fill(store, A, NOW - 10 * H, 2, IN_USE, 50)
    fill(store, A, NOW - 8 * H, 1, IN_USE, 9)
    fill(store, A, NOW - 7 * H, 1, BOOKED, 0)
    fill(store, A, NOW - 5 * H, 1, SQUATTED, 40, users=(("carol", 100),))
    fill(store, B, NOW - 4 * H, 2, IN_USE, 90, users=(("bob", 100),), holder="bob")
    fill(store, B, NOW - H, 1, FREE, 0, vram=30000, temp=92)  # after bob: full and hot, nobody's
    store.roll_up(NOW + 300)
    bookings = [booking(1, "alice", A, NOW - 10 * H, NOW - 6 * H, 20 * 60),
                booking(2, "bob", B, NOW - 4 * H, NOW - 2 * H, 60 * 60, klass="online")]
    yield store, bookings
    store.close()


def report(scene, by="user", **kw):
    store, bookings = scene
    start = NOW - 86400
    return compute(bookings, store.rollups(start, NOW), store.squats(start, NOW), kw.pop("faults", []), now=NOW,
                   since_s=86400, by=by, cards={A: "0", B: "1"}, pools={A: "big", B: "big+small"},
                   memory_total={A: 32768, B: 32768}, **kw)


def test_by_user_booked_used_idle_squatted_util_and_wait(scene):
    doc = report(scene)
    rows = {r["key"]: r for r in doc["rows"]}
    assert [r["key"] for r in doc["rows"]] == ["alice", "bob", "carol"]  # by booked hours, then name
    assert rows["alice"] == {"key": "alice", "bookings": 1, "booked_h": 4.0, "used_h": 2.0, "idle_h": 1.0,
                             "squatted_h": 0.0, "used_pct": 50.0, "idle_pct": 25.0,
                             "util_mean_pct": round((24 * 50 + 12 * 9) / 48, 1), "wait_n": 1, "wait_mean_min": 20.0,
                             "wait_p90_min": 20.0}
    assert (rows["bob"]["booked_h"], rows["bob"]["used_h"], rows["bob"]["idle_h"], rows["bob"]["util_mean_pct"]) \
        == (2.0, 2.0, 0.0, 90.0)
    assert (rows["carol"]["booked_h"], rows["carol"]["squatted_h"], rows["carol"]["used_pct"]) == (0.0, 1.0, None)
    total = doc["total"]
    assert (total["booked_h"], total["used_h"], total["idle_h"], total["squatted_h"], total["bookings"]) \
        == (6.0, 4.0, 1.0, 1.0, 2)
    assert (total["wait_mean_min"], total["wait_p90_min"], total["wait_n"]) == (40.0, 60.0, 2)


def test_busy_util_is_inclusive(scene):
    # The hour at 9 % counts as used from busy_util 9 on, not at 10.
    assert {r["key"]: r["used_h"] for r in report(scene, busy_util=9)["rows"]}["alice"] == 3.0
    assert {r["key"]: r["used_h"] for r in report(scene, busy_util=10)["rows"]}["alice"] == 2.0


def test_by_card_class_and_pool(scene):
    cards = {r["key"]: r for r in report(scene, by="card")["rows"]}
    # Card 0's utilisation: every hour it was up, squatted too: (24*50 + 12*9 + 12*0 + 12*40) / 60 buckets.
    assert cards["0"]["util_mean_pct"] == round((24 * 50 + 12 * 9 + 12 * 40) / 60, 1)
    assert (cards["0"]["booked_h"], cards["0"]["squatted_h"], cards["1"]["booked_h"]) == (4.0, 1.0, 2.0)
    classes = {r["key"]: r for r in report(scene, by="class")["rows"]}
    assert (classes["batch"]["booked_h"], classes["online"]["used_h"], classes["(none)"]["squatted_h"]) == (4.0, 2.0, 1.0)
    assert [r["key"] for r in report(scene, by="pool")["rows"]] == ["big", "big+small"]


def test_verdicts_from_the_scene(scene):
    verdicts = {v["threshold"]: v for v in report(scene)["verdicts"]}
    fleet = round((24 * 50 + 12 * 9 + 12 * 40 + 24 * 90) / 96, 1)
    assert verdicts["utilisation_low"]["value"] == fleet and not verdicts["utilisation_low"]["fires"]
    assert verdicts["wait"]["fires"] and verdicts["wait"]["value"] == 40.0
    assert "mean wait 40 min over 2 bookings (p90 60 min)" in verdicts["wait"]["message"]
    assert verdicts["vram"]["fires"] and verdicts["temperature"]["fires"] and not verdicts["faults"]["fires"]
    assert verdicts["vram"]["message"] == ("VRAM at or over 90 % for 1 card-hours over 1 day (card 1 1.0 h): jobs are near"
                                           " out of memory; book bigger cards or more of them")


def rollup(uuid=A, ts=NOW - H, util=50, state=IN_USE, vram=1000, temp=60):
    return {"uuid": uuid, "ts": ts, "n": 1, "seconds": 300, "state": state, "util_mean": util, "vram_max": vram,
            "temp_max": temp}


def verdict(name, bookings=(), rollups=(), faults=(), since_s=7 * 86400):
    doc = compute(list(bookings), list(rollups), [], list(faults), now=NOW, since_s=since_s,
                  memory_total={A: 32768})
    return {v["threshold"]: v for v in doc["verdicts"]}[name]


def test_utilisation_low_under_30():
    assert verdict("utilisation_low", rollups=[rollup(util=29)])["fires"]
    assert not verdict("utilisation_low", rollups=[rollup(util=30)])["fires"]
    found = verdict("utilisation_low", bookings=[booking(1, "alice", A, NOW - 2 * H, NOW, 0)],
                    rollups=[rollup(util=0, state=BOOKED, ts=NOW - 2 * H + 300 * i) for i in range(5)]
                    + [rollup(util=60, ts=NOW - H)])
    assert found["message"] == ("utilisation 10 % over 7 days (< 30 %): the cards are cut too fine or booked and"
                                " idle; alice's bookings were idle 83 % of their hours")


def test_utilisation_high_needs_a_growing_queue():
    busy = [rollup(util=86)]
    waiting = [booking(1, "alice", A, NOW + H, NOW + 2 * H, 2 * H)]  # asked an hour ago, starts in an hour
    assert verdict("utilisation_high", waiting, busy)["fires"]
    assert not verdict("utilisation_high", waiting, [rollup(util=85)])["fires"]
    assert not verdict("utilisation_high", [], busy)["fires"]  # busy but nobody waits
    # Or the mean wait rising: 10 min last week, 50 min this week.
    rising = [booking(1, "a", A, NOW - 10 * 86400, NOW - 10 * 86400 + H, 600),
              booking(2, "b", A, NOW - 86400, NOW - 86400 + H, 3000)]
    assert verdict("utilisation_high", rising, busy)["fires"]
    assert not verdict("utilisation_high", list(reversed([
        booking(1, "a", A, NOW - 10 * 86400, NOW - 10 * 86400 + H, 3000),
        booking(2, "b", A, NOW - 86400, NOW - 86400 + H, 600)])), busy)["fires"]


def test_wait_over_30_minutes():
    assert not verdict("wait", [booking(1, "a", A, NOW - H, NOW, 1800)])["fires"]
    assert verdict("wait", [booking(1, "a", A, NOW - H, NOW, 1801)])["fires"]


def test_vram_at_90_percent():
    assert verdict("vram", rollups=[rollup(vram=29492)])["fires"]  # 90 % of 32768 MiB is 29491.2
    assert not verdict("vram", rollups=[rollup(vram=29491)])["fires"]


def test_more_than_3_faults_a_month():
    month = 30 * 86400
    three = [{"ts": NOW - 100 * i - 1, "kind": kind} for i, kind in enumerate(("xid", "oom", "xid"))]
    throttle = {"ts": NOW - 50, "kind": "throttle"}  # not a fault the seeds count
    assert not verdict("faults", faults=[*three, throttle], since_s=month)["fires"]
    found = verdict("faults", faults=[*three, {"ts": NOW - 1000, "kind": "oom"}], since_s=month)
    assert found["fires"] and found["value"] == 4.0
    assert found["message"].startswith("2 OOM and 2 Xid faults over 30 days, 4.0 a month (> 3)")
    assert not verdict("faults", faults=[{"ts": NOW - month - 1, "kind": "oom"}] * 5, since_s=month)["fires"]


def test_cards_at_92_degrees():
    assert verdict("temperature", rollups=[rollup(temp=92)])["fires"]
    assert not verdict("temperature", rollups=[rollup(temp=91)])["fires"]


def test_lost_and_free_hours():
    doc = compute([], [rollup(state=FREE, util=0)], [], [], now=NOW, since_s=86400, by="card", cards={A: "0"})
    assert doc["rows"][0]["key"] == "0" and doc["rows"][0]["util_mean_pct"] == 0.0


@pytest.mark.parametrize("text, seconds", [("30d", 30 * 86400), ("12h", 12 * H), ("4w", 28 * 86400), ("400d", 400 * 86400)])
def test_since(text, seconds):
    assert parse_since(text) == seconds


@pytest.mark.parametrize("text", ["", "30", "0d", "401d", "-1d", "30m", "1e3d"])
def test_bad_since(text):
    with pytest.raises(BadInput):
        parse_since(text)


def test_bad_by():
    with pytest.raises(BadInput, match="--by"):
        compute([], [], [], [], now=NOW, since_s=H, by="team")


def test_table_and_csv(scene):
    doc = report(scene)
    doc["rows"][2]["key"] = "car\x1bol"  # a user name is shown inert
    text = table(doc)
    lines = text.splitlines()
    assert lines[2].split() == ["USER", "BOOKED", "h", "USED", "h", "USED", "IDLE", "h", "IDLE", "SQUAT", "h", "UTIL",
                                "WAIT", "WAIT", "p90", "BOOKINGS"]
    assert lines[3].split()[:3] == ["alice", "4.0", "2.0"] and "car\\x1bol" in text and "\x1b" not in text
    assert len({len(line) for line in lines[2:5]}) == 1  # aligned: the name column padded, figures right
    assert lines[7].startswith("TOTAL") and "!!  mean wait 40 min" in text
    csv_lines = to_csv(doc).splitlines()
    assert csv_lines[0].startswith("key,booked_h,used_h,used_pct") and csv_lines[-1].startswith("total,6.0,4.0,66.7")
    assert len(csv_lines) == 5


def test_wait_p90_is_the_nearest_rank():
    # Ten bookings that waited 1..10 minutes: mean 5.5, p90 the 9th.
    bookings = [booking(i, "alice", A, NOW - i * H, NOW - i * H + 60, i * 60) for i in range(1, 11)]
    doc = compute(bookings, [], [], [], now=NOW, since_s=86400)
    assert (doc["total"]["wait_mean_min"], doc["total"]["wait_p90_min"], doc["total"]["wait_n"]) == (5.5, 9.0, 10)
    # One that started before the window, and one not started yet, are not waits of this window.
    late = booking(11, "alice", A, NOW - 2 * 86400, NOW - 2 * 86400 + 60, 60)
    early = booking(12, "alice", A, NOW + H, NOW + 2 * H, 60)
    assert compute([late, early], [], [], [], now=NOW, since_s=86400)["total"]["wait_n"] == 0


def test_busy_util_in_the_config(tmp_path):
    from app.config import ConfigError, load_config

    assert load_config(environ={}).report.busy_util == 10.0
    path = tmp_path / "board.toml"
    path.write_text("[report]\nbusy_util = 25\n")
    assert load_config(environ={"BOARD_CONFIG": str(path)}).report.busy_util == 25
    for bad in ("101", "-1", "true", '"ten"'):
        path.write_text(f"[report]\nbusy_util = {bad}\n")
        with pytest.raises(ConfigError, match=r"\[report\] busy_util"):
            load_config(environ={"BOARD_CONFIG": str(path)})


@pytest.mark.parametrize("by", ["user", "class", "pool", "card"])
@pytest.mark.parametrize("busy_util", [9, 10, 50, 51])
def test_rollups_summed_in_sql_give_the_same_report(scene, by, busy_util):
    """The service sums a year's rollups per booking in SQL (app.report.gather); the figures are those of the
    rollups one by one."""
    from app.report.gather import SQUATS, summed_rollups
    from app.history.store import SLOT_BITS, _bucket_id

    store, bookings = scene
    start = NOW - 86400
    squats = [{"ts": ts, "uuid": u, "user": user, "n": n, "seconds": sec} for ts, u, user, n, sec in
              store.db.execute(SQUATS, [_bucket_id(start, 0) << SLOT_BITS, _bucket_id(NOW, 0) << SLOT_BITS])]
    summed = summed_rollups(store, start, NOW, bookings, busy_util)
    assert len(summed) < len(store.rollups(start, NOW))
    kw = {"now": NOW, "since_s": 86400, "by": by, "busy_util": busy_util, "cards": {A: "0", B: "1"},
          "pools": {A: "big", B: "big+small"}, "memory_total": {A: 32768, B: 32768}}
    assert compute(bookings, summed, squats, [], **kw) == report(scene, by=by, busy_util=busy_util)


@pytest.mark.parametrize("by", ["user", "card"])
def test_a_booking_on_two_cards_is_summed_per_card(scene, by):
    """One read of a booking's span serves all its cards; each card's rollups still go to that card."""
    from app.report.gather import summed_rollups

    store, _ = scene
    both = [Booking(id=3, user="dave", uid=1003, cards=(0, 1), card_uuids=(A, B), start=NOW - 9 * H, end=NOW - 3 * H,
                    klass="batch", note="", status="booked", requested_at=NOW - 9 * H)]
    start = NOW - 86400
    kw = {"now": NOW, "since_s": 86400, "by": by, "busy_util": 10, "cards": {A: "0", B: "1"},
          "pools": {}, "memory_total": {A: 32768, B: 32768}}
    summed = summed_rollups(store, start, NOW, both, 10)
    assert {row["uuid"] for row in summed if row["booking_id"] == 3} == {A, B}
    one_by_one = compute(both, store.rollups(start, NOW), [], [], **kw)
    assert compute(both, summed, [], [], **kw) == one_by_one
    assert one_by_one["total"]["booked_h"] == 12.0


@pytest.mark.parametrize("by", ["user", "card"])
def test_a_booking_that_holds_buckets_in_part_is_charged_for_its_part(scene, by):
    """Bookings that start and end inside 5-minute buckets (an admin's split at now, say): each bucket's seconds
    are shared by how long each booking held it, alike one by one and summed in SQL, so neither the used nor the
    idle hours exceed the booked ones."""
    from app.report.gather import summed_rollups

    store, _ = scene
    # alice's card a is BOOKED and idle from 7 h to 6 h ago; the first piece ends 2 min into a bucket, the
    # second starts there (on the same card) and ends 7 min later, 4 min into the next bucket.
    split = NOW - 7 * H + 420
    pieces = [booking(1, "alice", A, NOW - 7 * H, split, 0), booking(2, "bob", A, split, split + 420, 0)]
    start = NOW - 86400
    kw = {"now": NOW, "since_s": 86400, "by": by, "busy_util": 10, "cards": {A: "0", B: "1"},
          "pools": {}, "memory_total": {A: 32768, B: 32768}}
    one_by_one = compute(pieces, store.rollups(start, NOW), [], [], **kw)
    assert compute(pieces, summed_rollups(store, start, NOW, pieces, 10), [], [], **kw) == one_by_one
    rows = {r["key"]: r for r in one_by_one["rows"]}
    if by == "user":
        assert (rows["alice"]["booked_h"], rows["alice"]["idle_h"]) == (0.12, 0.12)
        assert (rows["bob"]["booked_h"], rows["bob"]["idle_h"]) == (0.12, 0.12)
    else:  # the card's hours outside the two pieces are no one's idle time
        assert (rows["0"]["booked_h"], rows["0"]["idle_h"]) == (0.23, 0.23)


def test_the_rollups_are_read_in_one_pass_however_many_bookings(scene):
    """A year's report reads each rollup once: one pass over the window, not a read of each booking's span (the
    rollups of every card interleave there, so that read 8 cards' rows for each). Each bucket held in part is
    read once more, through the same one statement."""
    from app.report.gather import summed_rollups

    store, bookings = scene
    # alice's 4 h cut into 48 five-minute bookings, a piece of them starting 2 minutes into a bucket
    pieces = [booking(10 + i, "alice", A, NOW - 10 * H + i * 300 + 120, NOW - 10 * H + (i + 1) * 300 + 120, 0)
              for i in range(47)] + bookings[1:]
    statements: list[str] = []
    store.db.conn.set_trace_callback(statements.append)
    try:
        summed = summed_rollups(store, NOW - 86400, NOW, pieces, 10)
    finally:
        store.db.conn.set_trace_callback(None)
    reads = [s for s in statements if "FROM rollups" in s or "JOIN rollups" in s]
    assert len(reads) == 2
    kw = {"now": NOW, "since_s": 86400, "by": "user", "busy_util": 10, "cards": {A: "0", B: "1"},
          "pools": {}, "memory_total": {A: 32768, B: 32768}}
    assert compute(pieces, summed, [], [], **kw) == compute(pieces, store.rollups(NOW - 86400, NOW), [], [], **kw)


# Exact figures that show each rounding, bookings and samples at the window's and each other's edges, squats
# before, at and after a booking, and each verdict's whole line on each side of its threshold (`make mutation`).

H, D = 3600, 86400
A, B, C, E = "GPU-a", "GPU-b", "GPU-c", "GPU-e"


def placed(id, user, uuid, start, end, wait_s=0, klass="batch"):
    return Booking(id=id, user=user, uid=1000 + id, cards=(id,), card_uuids=(uuid,), start=start, end=end,
                   klass=klass, note="", status="booked", requested_at=start - wait_s)


def waiting(id, requested_at, start):
    """A booking asked for at `requested_at` that starts at `start` (an hour long)."""
    return Booking(id=id, user="wait", uid=1000 + id, cards=(0,), card_uuids=(E,), start=start, end=start + H,
                   klass="batch", note="", status="booked", requested_at=requested_at)


def bucket(uuid, ts, seconds=300, state=IN_USE, util=50, n=30, **more):
    return {"uuid": uuid, "ts": ts, "n": n, "seconds": seconds, "state": state, "util_mean": util, "vram_max": None,
            "temp_max": None, **more}


def summed(uuid, booking_id, seconds, state, util=50, busy=True, n=None):
    """A row app.report.gather summed for one booking (or, booking_id None, for no one)."""
    return {**bucket(uuid, NOW - 50 * H, seconds, state, util, n=seconds // 10 if n is None else n),
            "busy": busy, "booking_id": booking_id}


def rows(doc):
    return {r["key"]: r for r in doc["rows"]}


def verdicts(bookings=(), rollups=(), faults=(), since_s=WEEK, **kw):
    doc = compute(list(bookings), list(rollups), [], list(faults), now=NOW, since_s=since_s, **kw)
    return {v["threshold"]: v for v in doc["verdicts"]}


def test_since_takes_one_hour_and_says_what_it_takes():
    assert (parse_since("1h"), parse_since(" 400D ")) == (H, 400 * D)
    with pytest.raises(BadInput) as error:
        parse_since("59m")
    assert str(error.value) == "--since '59m': say how far back as 12h, 30d or 4w (1 hour to 400 days)"
    with pytest.raises(BadInput) as error:
        parse_since("1234567890123456789012345")
    assert str(error.value).startswith("--since '12345678901234567890': say")


def test_a_bad_by_names_the_choices():
    with pytest.raises(BadInput) as error:
        compute([], [], [], [], now=NOW, since_s=H, by="departments-and-teams")
    assert str(error.value) == "--by 'departments-and-team': one of user, class, pool, card"


def test_each_figure_of_a_row_is_rounded_as_documented():
    """100 h booked, 420 s used, 1200 s idle, 420 s squatted, a 70 s wait: hours to 0.01, percentages and minutes
    to 0.1."""
    alice = placed(1, "alice", A, NOW - 100 * H, NOW, wait_s=70)
    doc = compute([alice], [summed(A, 1, 420, IN_USE), summed(A, 1, 1200, BOOKED, util=0, busy=False)],
                  [{"ts": NOW - H, "uuid": B, "user": "carol", "n": 42, "seconds": 420}], [], now=NOW,
                  since_s=5 * D)
    assert rows(doc)["alice"] == {
        "key": "alice", "bookings": 1, "booked_h": 100.0, "used_h": 0.12, "idle_h": 0.33, "squatted_h": 0.0,
        "used_pct": 0.1, "idle_pct": 0.3, "util_mean_pct": round((420 * 50) / 1620, 1), "wait_n": 1,
        "wait_mean_min": 1.2, "wait_p90_min": 1.2}
    assert (rows(doc)["carol"]["squatted_h"], doc["total"]["squatted_h"]) == (0.12, 0.12)


def test_the_window_edges_of_booked_hours():
    """A booking that ended as the window began is not in it, not even by a rollup of the bucket that starts there;
    one that began a second before now is, for that second."""
    before = placed(1, "alice", A, NOW - 2 * D, NOW - D)
    last = placed(2, "bob", B, NOW - 1, NOW + H)
    doc = compute([before, last], [bucket(A, NOW - D)], [], [], now=NOW, since_s=D)
    assert [r["key"] for r in doc["rows"]] == ["bob"]
    assert (doc["total"]["bookings"], rows(doc)["bob"]["bookings"], doc["total"]["booked_h"]) == (1, 1, 0.0)


def test_a_card_with_no_pool_or_name_and_unbooked_hours_by_class():
    """Card b is in no pool and has no name in the table; an unbooked hour of card a is no class's."""
    bookings = [placed(1, "alice", A, NOW - 4 * H, NOW - 2 * H, klass="online"),
                placed(2, "bob", B, NOW - 3 * H, NOW - 2 * H)]
    rollups = [bucket(A, NOW - 3 * H, util=80), bucket(A, NOW - H, util=0)]
    kw = {"now": NOW, "since_s": D, "pools": {A: "big"}, "cards": {A: "0"}}
    assert [r["key"] for r in compute(bookings, rollups, [], [], by="pool", **kw)["rows"]] == ["big", "(none)"]
    assert [r["key"] for r in compute(bookings, rollups, [], [], by="card", **kw)["rows"]] == ["0", B]
    by_class = compute(bookings, rollups, [], [], by="class", **kw)
    assert [r["key"] for r in by_class["rows"]] == ["online", "batch"]
    assert (rows(by_class)["online"]["util_mean_pct"], by_class["total"]["util_mean_pct"]) == (80.0, 80.0)


def test_a_squat_is_the_class_of_whoever_held_the_card_then():
    """Card a: a batch booking, a gap, an online one. Squats at the first one's start (its class), at its end (no
    one's), inside the second (its class), and on a card never booked (no one's)."""
    first = placed(1, "alice", A, NOW - 6 * H, NOW - 5 * H, klass="batch")
    second = placed(2, "bob", A, NOW - 3 * H, NOW - 2 * H, klass="online")

    def squat(uuid, ts, seconds):
        return {"ts": ts, "uuid": uuid, "user": "carol", "n": seconds // 10, "seconds": seconds}

    squats = [squat(A, NOW - 6 * H, 360), squat(A, NOW - 5 * H, 720), squat(A, NOW - 3 * H + 100, 1080),
              squat(B, NOW - 4 * H, 1440)]
    doc = compute([second, first], [], squats, [], now=NOW, since_s=D, by="class")
    assert {k: r["squatted_h"] for k, r in rows(doc).items()} == {"batch": 0.1, "(none)": 0.6, "online": 0.3}


def test_a_raw_sample_is_shared_over_its_own_span():
    """Two 10-second samples (not rolled up yet): one IN USE, one BOOKED that alice's booking held from its 5th
    second. She is charged 5 idle seconds of 15, not most of the second sample's 10."""
    alice = placed(1, "alice", A, NOW - H + 5, NOW + H)
    samples = [bucket(A, NOW - H, 10, BOOKED, util=0, n=1, span=10),
               bucket(A, NOW - H + 10, 10, IN_USE, util=5, n=1, span=10)]
    found = verdicts([alice], samples)["utilisation_low"]
    assert found["message"].endswith("; alice's bookings were idle 33 % of their hours")


def test_squat_seconds_from_the_rollup_of_their_own_bucket():
    """A squat counted in samples takes each sample's seconds from its bucket's rollup (20 s here), 10 s where
    there is none, and never from a row summed for a booking (those span many buckets)."""
    alice = placed(1, "alice", A, NOW - 60 * H, NOW - 40 * H)
    rollups = [bucket(B, NOW - 2 * H, 300, FREE, util=0, n=15), summed(A, 1, 600, IN_USE, n=30)]
    squats = [{"ts": NOW - 2 * H, "uuid": B, "user": "carol", "n": 18},
              {"ts": NOW - 50 * H, "uuid": A, "user": "dave", "n": 36},
              {"ts": NOW - H, "uuid": C, "user": "erin", "n": 36}]
    doc = compute([alice], rollups, squats, [], now=NOW, since_s=5 * D)
    assert {k: r["squatted_h"] for k, r in rows(doc).items() if k != "alice"} == {"carol": 0.1, "dave": 0.1,
                                                                                   "erin": 0.1}


def test_a_cards_utilisation_weighs_summed_rows_and_shared_rollups_alike():
    """Card a's unheld time: a summed row at 0 % and a rollup at 90 % of a bucket that no booking held, 300 s
    each: 45 %."""
    doc = compute([], [summed(A, None, 300, FREE, util=0, busy=False), bucket(A, NOW - H, 300, FREE, util=90)], [],
                  [], now=NOW, since_s=5 * D, by="card")
    assert doc["rows"][0]["util_mean_pct"] == 45.0


def test_utilisation_low_each_message():
    assert verdicts()["utilisation_low"] == {"threshold": "utilisation_low", "fires": False, "value": None,
                                             "limit": 30, "message": "utilisation: no history over 7 days"}
    assert verdicts(rollups=[bucket(A, NOW - H, util=30)])["utilisation_low"] == {
        "threshold": "utilisation_low", "fires": False, "value": 30.0, "limit": 30,
        "message": "utilisation 30 % over 7 days (not under 30 %)"}
    assert verdicts(rollups=[bucket(A, NOW - H, util=29.25, state=FREE)], since_s=D)["utilisation_low"] == {
        "threshold": "utilisation_low", "fires": True, "value": 29.2, "limit": 30,
        "message": "utilisation 29 % over 1 day (< 30 %): the cards are cut too fine or booked and idle"}


def idle_note(*held):
    """The low-utilisation verdict's note on whose bookings were idlest; `held`: (user, idle s, in use s), in the
    order their rollups come."""
    bookings, rollups = [], []
    for i, (user, idle, used) in enumerate(held):
        uuid = f"GPU-{i}"
        bookings.append(placed(i + 1, user, uuid, NOW - 2 * H, NOW))
        rollups += [bucket(uuid, NOW - 2 * H, idle, BOOKED, util=0)] if idle else []
        rollups += [bucket(uuid, NOW - H, used, IN_USE, util=5)] if used else []
    message = verdicts(bookings, rollups)["utilisation_low"]["message"]
    return message[message.index("idle;") + 6:] if "idle;" in message else message


def test_whose_bookings_were_idlest():
    assert idle_note(("bob", 100, 100), ("alice", 300, 0)) == "alice's bookings were idle 100 % of their hours"
    assert idle_note(("alice", 50, 50), ("bob", 100, 100)) == "bob's bookings were idle 50 % of their hours"
    assert idle_note(("alice", 0, 50)) == "alice's bookings were idle 0 % of their hours"
    assert idle_note(("alice", 50, 0)) == "alice's bookings were idle 100 % of their hours"


def queue():
    """Who waits when, at the edges of this week and the last: waits of 10 min this week, 20 min the week before;
    2 waiting now (one asked for it at now exactly, one a week and a day ago), 1 a week ago."""
    return [waiting(1, NOW - 600, NOW),  # started at now: this week's, not waiting now
            waiting(2, NOW, NOW + H),  # asked for at now: waiting
            waiting(3, NOW - WEEK - 1200, NOW - WEEK),  # started a week ago exactly: the week before's
            waiting(4, NOW - 2 * WEEK - 3000, NOW - 2 * WEEK),  # two weeks ago exactly: neither week's
            waiting(5, NOW - 8 * D, NOW + 2 * H)]  # waiting now and a week ago, not in a week


def test_utilisation_high_its_queue_at_the_week_edges():
    said = "2 waiting now against 1 a week ago; mean wait 10 min this week against 20 min the week before"
    assert verdicts(queue())["utilisation_high"] == {
        "threshold": "utilisation_high", "fires": False, "value": None, "limit": 85,
        "message": f"utilisation - (high is over 85 % with a growing queue; {said})"}
    assert verdicts(queue(), [bucket(A, NOW - H, util=50.33)])["utilisation_high"] == {
        "threshold": "utilisation_high", "fires": False, "value": 50.3, "limit": 85,
        "message": f"utilisation 50 % (high is over 85 % with a growing queue; {said})"}
    assert verdicts(queue(), [bucket(A, NOW - H, util=86.33)])["utilisation_high"] == {
        "threshold": "utilisation_high", "fires": True, "value": 86.3, "limit": 85,
        "message": f"utilisation 86 % over 7 days (> 85 %) with a growing queue ({said}): buy cards or cap the"
                   " bookings"}


def test_utilisation_high_needs_the_wait_to_rise_not_stay():
    same = [waiting(1, NOW - D - 600, NOW - D), waiting(2, NOW - 10 * D - 600, NOW - 10 * D)]
    assert not verdicts(same, [bucket(A, NOW - H, util=90)])["utilisation_high"]["fires"]


def test_wait_each_message():
    assert verdicts()["wait"] == {"threshold": "wait", "fires": False, "value": None, "limit": 30,
                                  "message": "mean wait - over 0 bookings (p90 -) over 7 days (not over 30 min)"}
    assert verdicts([placed(1, "a", A, NOW - H, NOW, wait_s=1850)])["wait"] == {
        "threshold": "wait", "fires": True, "value": 30.8, "limit": 30,
        "message": "mean wait 31 min over 1 booking (p90 31 min) over 7 days (> 30 min): too few cards for the queue"}
    two = [placed(1, "a", A, NOW - 2 * H, NOW - H, wait_s=600), placed(2, "b", A, NOW - H, NOW, wait_s=1200)]
    assert verdicts(two)["wait"]["message"] == "mean wait 15 min over 2 bookings (p90 20 min) over 7 days (not over 30 min)"


def test_vram_and_heat_card_hours_per_card():
    """At exactly 90 % of VRAM and 92 °C: card 3 for 100.05 h, three cards for 2 h each (by name on a tie; card c
    has no name and goes by its uuid); in all 106.0547 card-hours."""
    cards = {A: "1", B: "0", "GPU-d": "3"}
    hours = {A: 7200, B: 7200, C: 7200, "GPU-d": 360197}
    rollups = [bucket(uuid, NOW - D, seconds, FREE, util=0, vram_max=9000, temp_max=92)
               for uuid, seconds in hours.items()]
    found = verdicts(rollups=rollups, cards=cards, memory_total=dict.fromkeys(hours, 10000))
    listed = "card 3 100.1 h, card 0 2.0 h, card 1 2.0 h, card GPU-c 2.0 h"
    assert found["vram"] == {"threshold": "vram", "fires": True, "value": 106.05, "limit": 90,
                             "message": f"VRAM at or over 90 % for 106.05 card-hours over 7 days ({listed}): jobs are"
                                        " near out of memory; book bigger cards or more of them"}
    assert found["temperature"] == {"threshold": "temperature", "fires": True, "value": 106.05, "limit": 92,
                                    "message": f"cards at 92 °C or more for 106.05 card-hours over 7 days ({listed}):"
                                               " check the airflow"}


def test_vram_and_heat_when_neither():
    found = verdicts(rollups=[bucket(A, NOW - H, vram_max=8999, temp_max=91)], memory_total={A: 10000})
    assert found["vram"] == {"threshold": "vram", "fires": False, "value": 0.0, "limit": 90,
                             "message": "VRAM never at or over 90 % over 7 days"}
    assert found["temperature"] == {"threshold": "temperature", "fires": False, "value": 0.0, "limit": 92,
                                    "message": "no card at 92 °C over 7 days"}


def test_faults_counted_from_the_window_start_up_to_now():
    faults = [{"ts": NOW - WEEK, "kind": "xid"}, {"ts": NOW - 100, "kind": "oom"}, {"ts": NOW - 50, "kind": "xid"},
              {"ts": NOW - 10, "kind": "throttle"}, {"ts": NOW, "kind": "oom"}]
    assert verdicts(faults=faults)["faults"] == {
        "threshold": "faults", "fires": True, "value": 12.86, "limit": 3,
        "message": "1 OOM and 2 Xid faults over 7 days, 12.9 a month (> 3): a card or its jobs are failing; see board"
                   " faults"}
    faults[0]["ts"] = NOW - 30 * D
    assert verdicts(faults=faults, since_s=30 * D)["faults"] == {
        "threshold": "faults", "fires": False, "value": 3.0, "limit": 3,
        "message": "1 OOM and 2 Xid faults over 30 days, 3.0 a month (not over 3)"}


def test_by_card_the_document_names_each_cards_host_and_its_window():
    """In a fleet each card's row says its host, by its name in the table (or its uuid, where it has none); the
    window is given as its two ends and in days to 0.01."""
    bookings = [placed(1, "alice", A, NOW - 3 * H, NOW - H), placed(2, "bob", B, NOW - 2 * H, NOW - H)]
    since_s = 144 * D + 4 * H
    doc = compute(bookings, [], [], [], now=NOW, since_s=since_s, by="card", busy_util=25, cards={A: "gpu1:0"},
                  hosts={A: "gpu1", B: "gpu2"})
    assert [list(r)[:3] for r in doc["rows"]] == [["key", "host", "bookings"]] * 2
    assert [(r["key"], r["host"]) for r in doc["rows"]] == [("gpu1:0", "gpu1"), (B, "gpu2")]
    assert {k: v for k, v in doc.items() if k not in ("rows", "total", "verdicts")} == {
        "by": "card", "since": NOW - since_s, "until": NOW, "days": 144.17, "busy_util_pct": 25}


def test_waits_of_bookings_that_started_at_either_edge_of_the_window():
    """One started as the window began (after an hour's wait), one at now without waiting: both are the window's,
    a mean of 30 min exactly, which is not over 30."""
    bookings = [placed(1, "alice", A, NOW - D, NOW - D + H, wait_s=H), placed(2, "bob", B, NOW, NOW + H)]
    doc = compute(bookings, [], [], [], now=NOW, since_s=D)
    assert (doc["total"]["wait_n"], doc["total"]["wait_mean_min"]) == (2, 30.0)
    assert not {v["threshold"]: v for v in doc["verdicts"]}["wait"]["fires"]
