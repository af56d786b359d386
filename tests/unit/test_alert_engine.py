"""The alerts engine (app.alerts.engine) at its edges, one pass at a time on a real database: what each pass records,
pushes, holds back and lists, where `make mutation` found a nearly right engine untold apart from the right one."""

from __future__ import annotations


import pytest
from msgspec import structs

from app.alerts.engine import Engine, Pass, Push, gather, listing, quiet_at
from app.alerts.rules import Card, Crash, Ending, Inputs
from app.config import AlertSettings, Config, HistorySettings, Policy, PowerSettings
from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED, UNKNOWN_USER
from app.core.identity import Identity
from app.gpu.model import CardReading, FleetSnapshot, GpuProcess, Topology
from app.history.store import HistoryStore, Sample
from app.store import bookings as booking_rows
from app.store.db import write

ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)
T0 = 1_795_996_800  # 2026-11-30 00:00 UTC
NOON = T0 + 12 * 3600


def config(timezone: str = "UTC", **alerts) -> Config:
    return Config(policy=Policy(timezone=timezone), alerts=AlertSettings(**{"fire_after_s": 0, **alerts}))


def hot(index: int, temp: int = 93) -> Card:
    return Card(index, f"GPU-{index}", "FREE", temp_c=temp)


def said(index: int, temp: int = 93) -> str:
    return f"GPU {index} at {temp} °C (at or over 92 °C)"


def once(engine: Engine, conn, cfg: Config, now: float, *cards: Card, ending=(), told=frozenset()) -> Pass:
    with write(conn):
        return engine.run(conn, cfg, now, Inputs(now, cards=cards, ending=ending), told=told)


def rows(conn) -> list[tuple]:
    return conn.execute("SELECT id, rule, subject, state, fired_at, resolved_at, last_seen, message, uid, pushed_at,"
                        " held FROM alerts ORDER BY id").fetchall()


def fired_push(id: int, message: str, subject: str, rule: str = "hot") -> Push:
    return Push("alert.firing", message, (("rule", rule), ("subject", subject)), f"alert:{id}:firing")


def resolved_push(id: int, message: str, subject: str, rule: str = "hot") -> Push:
    return Push("alert.resolved", f"resolved: {message}", (("rule", rule), ("subject", subject)), f"alert:{id}:resolved")


class TestOnePass:
    def test_fire_refresh_resolve_each_write_their_row_and_push(self, conn):
        """A fraction of a second into the pass: the row keeps whole seconds. The refresh takes the new message, and
        the resolve says the newest one."""
        engine, cfg, now = Engine(), config(), NOON + 0.75
        first = once(engine, conn, cfg, now, hot(7))
        assert (first.fired, first.pushed, first.resolved, first.notices) == ([1], [1], [], [])
        assert first.pushes == [fired_push(1, said(7), "GPU-7")]
        assert first.ids() == {"fired": [1], "resolved": [], "pushed": [1]}
        assert rows(conn) == [(1, "hot", "GPU-7", "firing", NOON, None, NOON, said(7), None, NOON, None)]
        later = once(engine, conn, cfg, now + 30, hot(7, 95))
        assert later.ids() == {"fired": [], "resolved": [], "pushed": []} and later.pushes == []
        assert rows(conn) == [(1, "hot", "GPU-7", "firing", NOON, None, NOON + 30, said(7, 95), None, NOON, None)]
        cooled = once(engine, conn, cfg, now + 61)
        assert cooled.ids() == {"fired": [], "resolved": [1], "pushed": [1]}
        assert cooled.pushes == [resolved_push(1, said(7, 95), "GPU-7")]
        assert rows(conn) == [(1, "hot", "GPU-7", "resolved", NOON, NOON + 61, NOON + 30, said(7, 95), None, NOON,
                               None)]

    def test_what_one_pass_fires_is_numbered_and_pushed_in_rule_then_subject_order(self, conn):
        lost, full = Card(9, "GPU-9", "LOST"), Card(2, "GPU-2", "FREE", vram_used_mib=95, vram_total_mib=100)
        done = once(Engine(), conn, config(), NOON, hot(3), full, lost, hot(1))
        assert done.fired == done.pushed == [1, 2, 3, 4]
        assert [(p.key, dict(p.fields)["rule"], dict(p.fields)["subject"]) for p in done.pushes] == [
            ("alert:1:firing", "hot", "GPU-1"), ("alert:2:firing", "hot", "GPU-3"), ("alert:3:firing", "lost", "GPU-9"),
            ("alert:4:firing", "vram", "GPU-2")]

    def test_a_finding_fires_once_it_has_held_fire_after_s_unbroken(self, conn):
        engine, cfg = Engine(), config(fire_after_s=60)
        assert once(engine, conn, cfg, NOON, hot(7)).fired == []
        assert once(engine, conn, cfg, NOON + 30).ids() == {"fired": [], "resolved": [], "pushed": []}
        assert once(engine, conn, cfg, NOON + 60, hot(7)).fired == []  # gone for a pass: counts again from here
        assert once(engine, conn, cfg, NOON + 119.5, hot(7)).fired == []
        # 60 s exactly; card 6, new, is not yet (and is looked at first)
        assert once(engine, conn, cfg, NOON + 120, hot(7), hot(6)).fired == [1]
        assert rows(conn)[0][:4] == (1, "hot", "GPU-7", "firing") and len(rows(conn)) == 1
        assert once(engine, conn, cfg, NOON + 180, hot(7), hot(6)).fired == [2]


class TestRepeats:
    def test_a_rule_pushes_again_about_a_subject_only_repeat_min_after_its_newest_push(self, conn):
        engine, cfg = Engine(), config(repeat_min=1)
        once(engine, conn, cfg, NOON, hot(7))  # 1: pushed at NOON
        once(engine, conn, cfg, NOON + 10)
        other = once(engine, conn, cfg, NOON + 20, hot(6))  # 2: card 6 has never pushed
        assert other.pushes == [fired_push(2, said(6), "GPU-6")]
        repeat = once(engine, conn, cfg, NOON + 59, hot(6), hot(7))  # 3: 59 s after card 7's push
        assert repeat.fired == [3] and repeat.pushed == [] and repeat.pushes == []
        gone = once(engine, conn, cfg, NOON + 59.5, hot(6))  # nor is a repeat's resolve pushed
        assert gone.resolved == [3] and gone.pushed == [] and gone.pushes == []
        again = once(engine, conn, cfg, NOON + 60, hot(6), hot(7))  # 4: 60 s after: pushed again
        assert again.fired == again.pushed == [4] and again.pushes == [fired_push(4, said(7), "GPU-7")]
        once(engine, conn, cfg, NOON + 70, hot(6))
        soon = once(engine, conn, cfg, NOON + 119, hot(6), hot(7))  # 5: 59 s after the newest push (4), not 1
        assert soon.fired == [5] and soon.pushed == []

    def test_another_rule_about_the_same_card_is_no_repeat(self, conn):
        engine, cfg = Engine(), config(repeat_min=60)
        once(engine, conn, cfg, NOON, hot(7))
        full = Card(7, "GPU-7", "FREE", vram_used_mib=95, vram_total_mib=100)
        both = once(engine, conn, cfg, NOON + 60, full)
        assert both.fired == [2] and both.pushed == [2, 1] and both.resolved == [1]
        assert both.pushes == [fired_push(2, "GPU 7 VRAM at 95 % (at or over 90 %)", "GPU-7", "vram"),
                               resolved_push(1, said(7), "GPU-7")]


class TestPerUser:
    ENDING = (Ending(12, ALICE.uid, NOON + 300),)

    def test_a_booking_ending_is_told_to_its_holder_alone_and_never_pushed(self, conn):
        engine, cfg = Engine(), config(quiet="00:00-23:59")  # quiet hours hold no notice back
        done = once(engine, conn, cfg, NOON, ending=self.ENDING)
        assert done.notices == [(ALICE.uid, "your booking 12 ends in 5 min")] and done.pushes == []
        assert rows(conn) == [(1, "ending", "booking:12", "firing", NOON, None, NOON, "your booking 12 ends in 5 min",
                               ALICE.uid, None, None)]
        gone = once(engine, conn, cfg, NOON + 60)
        assert gone.resolved == [1] and gone.pushes == [] and rows(conn)[0][9:] == (None, None)
        out = once(engine, conn, config(), NOON + 120)  # and after quiet hours nothing of it is flushed
        assert out.pushes == [] and out.pushed == []

    def test_a_holder_told_already_is_not_told_again(self, conn):
        done = once(Engine(), conn, config(), NOON, ending=self.ENDING, told=frozenset({"booking:12"}))
        assert done.fired == [1] and done.notices == [] and done.pushes == []


class TestQuietHours:
    def test_quiet_hours_are_the_policys_local_time_and_what_they_hold_is_pushed_in_order_after(self, conn):
        """22:00-08:00 in Berlin (UTC+1): 21:30 UTC is quiet there. Held back: the resolves of two alerts pushed
        before (1, 2) and two fires (3, 4); one fired and resolved within them (5) is only recorded. When they end,
        the fires go first, each kind in id order, then the resolves; and a pass later, nothing again. (One new
        finding a pass: the ids follow the passes.)"""
        engine = Engine()
        berlin = config(timezone="Europe/Berlin", quiet="22:00-08:00")
        evening = T0 + 20 * 3600  # 21:00 in Berlin
        assert once(engine, conn, berlin, evening, hot(1)).pushed == [1]
        assert once(engine, conn, berlin, evening + 60, hot(1), hot(2)).pushed == [2]
        night = T0 + 21 * 3600 + 1800
        held = once(engine, conn, berlin, night, hot(3))
        assert (held.fired, sorted(held.resolved), held.pushed, held.pushes) == ([3], [1, 2], [], [])
        once(engine, conn, berlin, night + 60, hot(3), hot(4))
        once(engine, conn, berlin, night + 120, hot(3), hot(4), hot(5))
        assert [(id, state, what) for id, _, _, state, *_, what in rows(conn)] == [
            (1, "resolved", "resolve"), (2, "resolved", "resolve"), (3, "firing", "fire"), (4, "firing", "fire"),
            (5, "firing", "fire")]
        once(engine, conn, berlin, night + 3600, hot(3), hot(4))  # 5 cooled within quiet hours: never told
        assert rows(conn)[4] == (5, "hot", "GPU-5", "resolved", night + 120, night + 3600, night + 120, said(5), None,
                                 None, None)
        morning = T0 + 86400 + 7 * 3600  # 08:00 in Berlin
        flushed = once(engine, conn, berlin, morning, hot(3), hot(4))
        assert flushed.pushes == [fired_push(3, said(3), "GPU-3"), fired_push(4, said(4), "GPU-4"),
                                  resolved_push(1, said(1), "GPU-1"), resolved_push(2, said(2), "GPU-2")]
        assert flushed.pushed == [3, 4, 1, 2] and flushed.fired == flushed.resolved == []
        assert [(id, pushed_at, what) for id, *_, pushed_at, what in rows(conn)] == [
            (1, evening, None), (2, evening + 60, None), (3, morning, None), (4, morning, None), (5, None, None)]
        assert once(engine, conn, berlin, morning + 60, hot(3), hot(4)).pushes == []
        cooled = once(engine, conn, berlin, morning + 120, hot(4))  # pushed when quiet hours ended: so is its resolve
        assert cooled.pushes == [resolved_push(3, said(3), "GPU-3")]

    def test_utc_2130_is_not_quiet_in_utc(self, conn):
        assert once(Engine(), conn, config(quiet="22:00-08:00"), T0 + 21 * 3600 + 1800, hot(3)).pushed == [1]

    @pytest.mark.parametrize("hhmm, quiet", [("11:59", False), ("12:00", True), ("12:59", True), ("13:00", False),
                                             ("00:00", False)])
    def test_quiet_hours_within_one_day(self, hhmm, quiet):
        from datetime import timezone

        h, m = map(int, hhmm.split(":"))
        assert quiet_at(T0 + h * 3600 + m * 60, (12 * 60, 13 * 60), timezone.utc) is quiet
        assert quiet_at(T0 + h * 3600 + m * 60, (12 * 60, 12 * 60), timezone.utc) is False  # an empty range


class TestListing:
    def insert(self, conn, rule, subject, state, fired_at, uid=None) -> int:
        return conn.execute(
            "INSERT INTO alerts (rule, subject, state, fired_at, resolved_at, last_seen, message, uid)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (rule, subject, state, fired_at, fired_at + 60 if state == "resolved" else None, fired_at + 30,
             f"{rule} {subject}", uid)).lastrowid

    def test_newest_first_firing_only_unless_all_and_anothers_own_alert_is_skipped(self, conn):
        self.insert(conn, "hot", "GPU-1", "firing", NOON)
        self.insert(conn, "lost", "GPU-2", "resolved", NOON + 10)
        self.insert(conn, "hot", "GPU-3", "firing", NOON)  # fired with 1: the newer id first
        self.insert(conn, "ending", "booking:9", "firing", NOON + 20, uid=BOB.uid)  # bob's own, the newest
        assert listing(conn, ALICE) == [
            {"id": 3, "rule": "hot", "subject": "GPU-3", "state": "firing", "fired_at": NOON, "resolved_at": None,
             "last_seen": NOON + 30, "message": "hot GPU-3", "uid": None},
            {"id": 1, "rule": "hot", "subject": "GPU-1", "state": "firing", "fired_at": NOON, "resolved_at": None,
             "last_seen": NOON + 30, "message": "hot GPU-1", "uid": None}]
        assert listing(conn, ALICE, all=False) == listing(conn, ALICE)
        everything = listing(conn, ALICE, all=True)
        assert [a["id"] for a in everything] == [2, 3, 1]
        assert everything[0] == {"id": 2, "rule": "lost", "subject": "GPU-2", "state": "resolved",
                                 "fired_at": NOON + 10, "resolved_at": NOON + 70, "last_seen": NOON + 40,
                                 "message": "lost GPU-2", "uid": None}
        assert [a["id"] for a in listing(conn, BOB, all=True)] == [4, 2, 3, 1]
        assert listing(conn, BOB)[0]["uid"] == BOB.uid

    def test_the_limit_counts_only_what_is_shown(self, conn):
        for i in range(3):
            self.insert(conn, "hot", f"GPU-{i}", "firing", NOON + i)
        self.insert(conn, "ending", "booking:9", "firing", NOON + 10, uid=BOB.uid)
        assert [a["id"] for a in listing(conn, ALICE, limit=2)] == [3, 2]
        assert [a["id"] for a in listing(conn, ALICE, limit=3)] == [3, 2, 1]
        assert [a["id"] for a in listing(conn, BOB, limit=1)] == [4]

    def test_200_by_default(self, conn):
        conn.executemany("INSERT INTO alerts (rule, subject, state, fired_at, last_seen, message)"
                         " VALUES ('hot', ?, 'resolved', ?, ?, 'hot')", [(f"GPU-{i}", i, i) for i in range(201)])
        assert len(listing(conn, ALICE, all=True)) == 200


class TestGather:
    """What the rules read, from a real database and history file and a fleet snapshot made by hand (the fleet is
    the one thing simulated): each input one step either side of its edge."""

    def settings(self, tmp_path, **history) -> Config:
        return Config(policy=Policy(timezone="UTC"), alerts=AlertSettings(window_min=10),
                      power=PowerSettings(limit_w=250.0, cards={1: 200.0}), history=HistorySettings(**history))

    def book(self, conn, uuids, start, end, *, user="alice", uid=1001, created=None, requested=None,
             queued=None) -> int:
        return booking_rows.insert(conn, user=user, uid=uid, uuids=uuids, start=start, end=end, klass="experiment", note="",
                           request=None, now=start - 7200 if created is None else created, created_by=uid,
                           requested_at=requested, queued=queued)

    def gathered(self, tmp_path, conn, readings, now, config=None) -> Inputs:
        snapshot = FleetSnapshot(now, True, tuple(readings), Topology())
        return gather(conn, snapshot, HistoryStore(tmp_path / "board.history.db"), config or self.settings(tmp_path),
                      now)

    def test_each_card_its_holder_squatters_and_their_containers(self, tmp_path, conn):
        """alice holds card 0; eve, a process nobody can name and mallory squat it, eve and the unnamed one in
        containers (alice's own container is hers, not a squatter's). Card 1 is free, booked later by bob."""
        readings = (
            CardReading(0, "GPU-0", memory_total_mib=1000, memory_used_mib=500, temperature_c=50, power_limit_w=300.0,
                        processes=(GpuProcess(1, 100, "alice", 1001, "python", container="c-alice"),
                                   GpuProcess(2, 100, "eve", 1005, "python", container="c-eve"),
                                   GpuProcess(3, 100, None, None, "?", container="c-x"),
                                   GpuProcess(4, 100, "eve", 1005, "python", container="c-eve"),
                                   GpuProcess(5, 100, "mallory", 1006, "python"))),
            CardReading(1, "GPU-1", memory_total_mib=1000, memory_used_mib=0, temperature_c=95))
        booking_rows.sync_cards(conn, readings, NOON)
        self.book(conn, ["GPU-0"], NOON - 600, NOON + 3600)
        self.book(conn, ["GPU-1"], NOON + 600, NOON + 1200, user="bob", uid=1002)
        inputs = self.gathered(tmp_path, conn, readings, NOON + 0.5)
        assert inputs.cards == (
            Card(0, "GPU-0", SQUATTED, 500, 1000, 50, "alice", ("eve", UNKNOWN_USER, "mallory"), None, ("c-eve", "c-x"),
                 300.0, 250.0),
            Card(1, "GPU-1", FREE, 0, 1000, 95, None, (), None, (), None, 200.0))
        assert inputs.now == NOON + 0.5

    def test_the_queue_then_and_now_and_the_waits_of_the_bookings_started_in_the_window(self, tmp_path, conn):
        """window_min = 10. Each booking on a card of its own."""
        now, then = NOON, NOON - 600
        made = [  # (start, end, created, requested, queued)
            (now + 3600, now + 7200, then, None, "time"),  # queued then and now
            (now + 3600, now + 7200, then + 1, None, "time"),  # queued since
            (now + 60, now + 7200, now, None, "cards"),  # queued since, just now
            (then + 1, now + 7200, then - 100, None, "time"),  # was queued then; started since (and waited 0)
            (then, now + 7200, then - 100, None, "time"),  # started as the window opened
            (now + 3600, now + 7200, then - 100, None, None),  # never queued
            (now + 3600, now + 7200, then - 100, None, "time"),  # cancelled below
            (now, now + 60, None, now - 100, None),  # waited 100 s, started just now
            (then + 1, now + 60, None, then - 199, None),  # waited 200 s
            (then, now + 60, None, then - 1000, None),  # started before the window
            (now - 60, now + 60, None, 0, None),  # from before requests were recorded
            (now - 30, now + 60, None, now - 5000, None)]  # cancelled below
        booking_rows.sync_cards(conn, tuple(CardReading(i, f"GPU-{i}") for i in range(len(made))), now)
        ids = [self.book(conn, [f"GPU-{i}"], start, end, created=created, requested=requested, queued=queued)
               for i, (start, end, created, requested, queued) in enumerate(made)]
        for id in (ids[6], ids[11]):
            conn.execute("UPDATE bookings SET status = 'cancelled' WHERE id = ?", (id,))
        inputs = self.gathered(tmp_path, conn, (), now)
        assert (inputs.queued_before, inputs.queued_now) == (2, 3)
        assert sorted(inputs.waits_s) == [0, 100, 200]

    def test_faults_of_30_days_crashes_of_the_hour_and_bookings_ending_in_10_minutes(self, tmp_path, conn):
        now = NOON
        for ts, kind in ((now - 30 * 86400, "xid"), (now - 30 * 86400 - 1, "xid"), (now, "oom"), (now, "throttle")):
            conn.execute("INSERT INTO faults (ts, kind) VALUES (?, ?)", (ts, kind))
        booking_rows.sync_cards(conn, tuple(CardReading(i, f"GPU-{i}") for i in range(4)), now)
        booking = self.book(conn, ["GPU-0"], now - 7200, now + 600)  # ends in 10 min exactly
        self.book(conn, ["GPU-1"], now - 7200, now + 601, user="bob", uid=1002)
        self.book(conn, ["GPU-2"], now - 7200, now)  # ended just now
        just = self.book(conn, ["GPU-2"], now, now + 300, user="bob", uid=1002)  # started just now
        self.book(conn, ["GPU-3"], now + 1, now + 60)  # not started yet
        for state, ended, model in (("crashed", now - 3600, "/models/qwen/qwen-7b.gguf"), ("crashed", now, "bare.gguf"),
                                    ("crashed", now - 3601, "old.gguf"), ("stopped", now, "stopped.gguf")):
            conn.execute(
                'INSERT INTO servers (booking_id, "user", uid, cards, card_uuids, model, host, port, cmdline, state,'
                " created_at, ended_at) VALUES (?, 'carol', 1003, '0', 'GPU-0', ?, '127.0.0.1', 8100, 'llama-server',"
                " ?, ?, ?)", (booking, model, state, now - 7200, ended))
        inputs = self.gathered(tmp_path, conn, (), now)
        assert inputs.faults_month == 2
        assert inputs.crashes == (Crash(1, "carol", now - 3600, "qwen-7b.gguf"), Crash(2, "carol", now, "bare.gguf"))
        assert inputs.ending == (Ending(booking, 1001, now + 600), Ending(just, 1002, now + 300))

    def test_the_fleets_mean_utilisation_and_since_when_each_booked_card_has_been_idle(self, tmp_path, conn):
        """window_min = 10, idle_booked_min = 30, sample_s = 10: the samples read go back 30 min + 20 s + 60 s
        (1880 s), the utilisation's 600 s. Card 9 (free) carries the utilisation; cards 0-2 are BOOKED now."""
        now = NOON
        readings = tuple(CardReading(i, f"GPU-{i}") for i in (0, 1, 2, 3, 9))
        booking_rows.sync_cards(conn, readings, now)
        for i in (0, 1, 2, 3):
            self.book(conn, [f"GPU-{i}"], now - 7200, now + 3600)
        history = HistoryStore(tmp_path / "board.history.db")
        history.add([Sample(ts, uuid, state, 10, util=util, booking=booking) for ts, uuid, state, util, booking in (
            (now - 1881, "GPU-0", BOOKED, None, 10), (now - 1880, "GPU-0", BOOKED, None, 10),
            (now - 1000, "GPU-0", BOOKED, None, 10), (now, "GPU-0", BOOKED, None, 10),
            (now - 900, "GPU-1", BOOKED, None, 11), (now - 700, "GPU-1", BOOKED, None, 99),
            (now - 500, "GPU-1", BOOKED, None, 11), (now, "GPU-1", BOOKED, None, 11),
            (now - 200, "GPU-2", BOOKED, None, 12), (now - 100, "GPU-2", IN_USE, None, 12),
            (now, "GPU-2", BOOKED, None, 12), (now + 1, "GPU-2", IN_USE, None, 12),
            (now - 601, "GPU-9", FREE, 100, None), (now - 600, "GPU-9", FREE, 20, None),
            (now - 300, "GPU-9", LOST, 100, None), (now - 200, "GPU-9", FREE, None, None),
            (now, "GPU-9", FREE, 40, None))])
        inputs = gather(conn, FleetSnapshot(now, True, readings, Topology()), history, self.settings(tmp_path), now)
        assert inputs.util_mean == 30
        assert {c.uuid: c.idle_booked_since for c in inputs.cards} == {
            "GPU-0": now - 1880, "GPU-1": now - 500, "GPU-2": now, "GPU-3": None, "GPU-9": None}
        off = gather(conn, FleetSnapshot(now, True, readings, Topology()), history,
                     self.settings(tmp_path, enabled=False), now)
        assert off.util_mean is None and {c.idle_booked_since for c in off.cards} == {None}

    def test_a_longer_window_reads_the_history_that_far_back(self, tmp_path, conn):
        now = NOON
        readings = (CardReading(0, "GPU-0"),)
        booking_rows.sync_cards(conn, readings, now)
        self.book(conn, ["GPU-0"], now - 7200, now + 3600)
        history = HistoryStore(tmp_path / "board.history.db")
        history.add([Sample(ts, "GPU-0", BOOKED, 10, util=util, booking=10)
                     for ts, util in ((now - 3601, 90), (now - 3600, 10), (now, 20))])
        config = structs.replace(self.settings(tmp_path), alerts=AlertSettings(window_min=60))
        inputs = gather(conn, FleetSnapshot(now, True, readings, Topology()), history, config, now)
        assert (inputs.util_mean, inputs.cards[0].idle_booked_since) == (15, now - 3600)
