"""The report's figures where right and nearly right differ (issue 19, `make mutation` on app/report/compute.py): exact
figures that show each rounding, bookings and samples at the window's and each other's edges, squats before, at and
after a booking, and each verdict's whole line (its value, limit and message) on each side of its threshold."""

from __future__ import annotations

import pytest

from app.core.cardstate import BOOKED, FREE, IN_USE
from app.errors import BadInput
from app.model import Booking
from app.report.compute import WEEK, compute, parse_since

H, D = 3600, 86400
NOW = 1_795_966_200 // 300 * 300
A, B, C, E = "GPU-a", "GPU-b", "GPU-c", "GPU-e"


def booking(id, user, uuid, start, end, wait_s=0, klass="batch"):
    return Booking(id=id, user=user, uid=1000 + id, cards=(id,), card_uuids=(uuid,), start=start, end=end,
                   klass=klass, note="", status="booked", requested_at=start - wait_s)


def waiting(id, requested_at, start):
    """A booking asked for at `requested_at` that starts at `start` (an hour long)."""
    return Booking(id=id, user="wait", uid=1000 + id, cards=(0,), card_uuids=(E,), start=start, end=start + H,
                   klass="batch", note="", status="booked", requested_at=requested_at)


def rollup(uuid, ts, seconds=300, state=IN_USE, util=50, n=30, **more):
    return {"uuid": uuid, "ts": ts, "n": n, "seconds": seconds, "state": state, "util_mean": util, "vram_max": None,
            "temp_max": None, **more}


def summed(uuid, booking_id, seconds, state, util=50, busy=True, n=None):
    """A row app.report.gather summed for one booking (or, booking_id None, for no one)."""
    return {**rollup(uuid, NOW - 50 * H, seconds, state, util, n=seconds // 10 if n is None else n),
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
    alice = booking(1, "alice", A, NOW - 100 * H, NOW, wait_s=70)
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
    before = booking(1, "alice", A, NOW - 2 * D, NOW - D)
    last = booking(2, "bob", B, NOW - 1, NOW + H)
    doc = compute([before, last], [rollup(A, NOW - D)], [], [], now=NOW, since_s=D)
    assert [r["key"] for r in doc["rows"]] == ["bob"]
    assert (doc["total"]["bookings"], rows(doc)["bob"]["bookings"], doc["total"]["booked_h"]) == (1, 1, 0.0)


def test_a_card_with_no_pool_or_name_and_unbooked_hours_by_class():
    """Card b is in no pool and has no name in the table; an unbooked hour of card a is no class's."""
    bookings = [booking(1, "alice", A, NOW - 4 * H, NOW - 2 * H, klass="online"),
                booking(2, "bob", B, NOW - 3 * H, NOW - 2 * H)]
    rollups = [rollup(A, NOW - 3 * H, util=80), rollup(A, NOW - H, util=0)]
    kw = {"now": NOW, "since_s": D, "pools": {A: "big"}, "cards": {A: "0"}}
    assert [r["key"] for r in compute(bookings, rollups, [], [], by="pool", **kw)["rows"]] == ["big", "(none)"]
    assert [r["key"] for r in compute(bookings, rollups, [], [], by="card", **kw)["rows"]] == ["0", B]
    by_class = compute(bookings, rollups, [], [], by="class", **kw)
    assert [r["key"] for r in by_class["rows"]] == ["online", "batch"]
    assert (rows(by_class)["online"]["util_mean_pct"], by_class["total"]["util_mean_pct"]) == (80.0, 80.0)


def test_a_squat_is_the_class_of_whoever_held_the_card_then():
    """Card a: a batch booking, a gap, an online one. Squats at the first one's start (its class), at its end (no
    one's), inside the second (its class), and on a card never booked (no one's)."""
    first = booking(1, "alice", A, NOW - 6 * H, NOW - 5 * H, klass="batch")
    second = booking(2, "bob", A, NOW - 3 * H, NOW - 2 * H, klass="online")

    def squat(uuid, ts, seconds):
        return {"ts": ts, "uuid": uuid, "user": "carol", "n": seconds // 10, "seconds": seconds}

    squats = [squat(A, NOW - 6 * H, 360), squat(A, NOW - 5 * H, 720), squat(A, NOW - 3 * H + 100, 1080),
              squat(B, NOW - 4 * H, 1440)]
    doc = compute([second, first], [], squats, [], now=NOW, since_s=D, by="class")
    assert {k: r["squatted_h"] for k, r in rows(doc).items()} == {"batch": 0.1, "(none)": 0.6, "online": 0.3}


def test_a_raw_sample_is_shared_over_its_own_span():
    """Two 10-second samples (not rolled up yet): one IN USE, one BOOKED that alice's booking held from its 5th
    second. She is charged 5 idle seconds of 15, not most of the second sample's 10."""
    alice = booking(1, "alice", A, NOW - H + 5, NOW + H)
    samples = [rollup(A, NOW - H, 10, BOOKED, util=0, n=1, span=10),
               rollup(A, NOW - H + 10, 10, IN_USE, util=5, n=1, span=10)]
    found = verdicts([alice], samples)["utilisation_low"]
    assert found["message"].endswith("; alice's bookings were idle 33 % of their hours")


def test_squat_seconds_from_the_rollup_of_their_own_bucket():
    """A squat counted in samples takes each sample's seconds from its bucket's rollup (20 s here), 10 s where
    there is none, and never from a row summed for a booking (those span many buckets)."""
    alice = booking(1, "alice", A, NOW - 60 * H, NOW - 40 * H)
    rollups = [rollup(B, NOW - 2 * H, 300, FREE, util=0, n=15), summed(A, 1, 600, IN_USE, n=30)]
    squats = [{"ts": NOW - 2 * H, "uuid": B, "user": "carol", "n": 18},
              {"ts": NOW - 50 * H, "uuid": A, "user": "dave", "n": 36},
              {"ts": NOW - H, "uuid": C, "user": "erin", "n": 36}]
    doc = compute([alice], rollups, squats, [], now=NOW, since_s=5 * D)
    assert {k: r["squatted_h"] for k, r in rows(doc).items() if k != "alice"} == {"carol": 0.1, "dave": 0.1,
                                                                                   "erin": 0.1}


def test_a_cards_utilisation_weighs_summed_rows_and_shared_rollups_alike():
    """Card a's unheld time: a summed row at 0 % and a rollup at 90 % of a bucket that no booking held, 300 s
    each: 45 %."""
    doc = compute([], [summed(A, None, 300, FREE, util=0, busy=False), rollup(A, NOW - H, 300, FREE, util=90)], [],
                  [], now=NOW, since_s=5 * D, by="card")
    assert doc["rows"][0]["util_mean_pct"] == 45.0


def test_utilisation_low_each_message():
    assert verdicts()["utilisation_low"] == {"threshold": "utilisation_low", "fires": False, "value": None,
                                             "limit": 30, "message": "utilisation: no history over 7 days"}
    assert verdicts(rollups=[rollup(A, NOW - H, util=30)])["utilisation_low"] == {
        "threshold": "utilisation_low", "fires": False, "value": 30.0, "limit": 30,
        "message": "utilisation 30 % over 7 days (not under 30 %)"}
    assert verdicts(rollups=[rollup(A, NOW - H, util=29.25, state=FREE)], since_s=D)["utilisation_low"] == {
        "threshold": "utilisation_low", "fires": True, "value": 29.2, "limit": 30,
        "message": "utilisation 29 % over 1 day (< 30 %): the cards are cut too fine or booked and idle"}


def idle_note(*held):
    """The low-utilisation verdict's note on whose bookings were idlest; `held`: (user, idle s, in use s), in the
    order their rollups come."""
    bookings, rollups = [], []
    for i, (user, idle, used) in enumerate(held):
        uuid = f"GPU-{i}"
        bookings.append(booking(i + 1, user, uuid, NOW - 2 * H, NOW))
        rollups += [rollup(uuid, NOW - 2 * H, idle, BOOKED, util=0)] if idle else []
        rollups += [rollup(uuid, NOW - H, used, IN_USE, util=5)] if used else []
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
    assert verdicts(queue(), [rollup(A, NOW - H, util=50.33)])["utilisation_high"] == {
        "threshold": "utilisation_high", "fires": False, "value": 50.3, "limit": 85,
        "message": f"utilisation 50 % (high is over 85 % with a growing queue; {said})"}
    assert verdicts(queue(), [rollup(A, NOW - H, util=86.33)])["utilisation_high"] == {
        "threshold": "utilisation_high", "fires": True, "value": 86.3, "limit": 85,
        "message": f"utilisation 86 % over 7 days (> 85 %) with a growing queue ({said}): buy cards or cap the"
                   " bookings"}


def test_utilisation_high_needs_the_wait_to_rise_not_stay():
    same = [waiting(1, NOW - D - 600, NOW - D), waiting(2, NOW - 10 * D - 600, NOW - 10 * D)]
    assert not verdicts(same, [rollup(A, NOW - H, util=90)])["utilisation_high"]["fires"]


def test_wait_each_message():
    assert verdicts()["wait"] == {"threshold": "wait", "fires": False, "value": None, "limit": 30,
                                  "message": "mean wait - over 0 bookings (p90 -) over 7 days (not over 30 min)"}
    assert verdicts([booking(1, "a", A, NOW - H, NOW, wait_s=1850)])["wait"] == {
        "threshold": "wait", "fires": True, "value": 30.8, "limit": 30,
        "message": "mean wait 31 min over 1 booking (p90 31 min) over 7 days (> 30 min): too few cards for the queue"}
    two = [booking(1, "a", A, NOW - 2 * H, NOW - H, wait_s=600), booking(2, "b", A, NOW - H, NOW, wait_s=1200)]
    assert verdicts(two)["wait"]["message"] == "mean wait 15 min over 2 bookings (p90 20 min) over 7 days (not over 30 min)"


def test_vram_and_heat_card_hours_per_card():
    """At exactly 90 % of VRAM and 92 °C: card 3 for 100.05 h, three cards for 2 h each (by name on a tie; card c
    has no name and goes by its uuid); in all 106.0547 card-hours."""
    cards = {A: "1", B: "0", "GPU-d": "3"}
    hours = {A: 7200, B: 7200, C: 7200, "GPU-d": 360197}
    rollups = [rollup(uuid, NOW - D, seconds, FREE, util=0, vram_max=9000, temp_max=92)
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
    found = verdicts(rollups=[rollup(A, NOW - H, vram_max=8999, temp_max=91)], memory_total={A: 10000})
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
    bookings = [booking(1, "alice", A, NOW - 3 * H, NOW - H), booking(2, "bob", B, NOW - 2 * H, NOW - H)]
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
    bookings = [booking(1, "alice", A, NOW - D, NOW - D + H, wait_s=H), booking(2, "bob", B, NOW, NOW + H)]
    doc = compute(bookings, [], [], [], now=NOW, since_s=D)
    assert (doc["total"]["wait_n"], doc["total"]["wait_mean_min"]) == (2, 30.0)
    assert not {v["threshold"]: v for v in doc["verdicts"]}["wait"]["fires"]
