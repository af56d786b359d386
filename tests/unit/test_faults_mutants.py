"""Faults at their boundaries: what `make mutation` found no test in test_faults.py told apart."""

from __future__ import annotations

import sqlite3
import threading

import pytest

from app.faults import store
from app.faults.oom import REBUILD_HINT, full_cards, record_job_oom, record_server_build, record_server_oom
from app.faults.throttle import ThrottleTracker
from app.faults.watcher import FaultWatcher, record_all, start_watcher
from app.faults.xid import meaning
from app.gpu.model import THROTTLE_HW_SLOWDOWN, THROTTLE_SW_THERMAL, CardReading, FleetSnapshot, GpuEvent, Topology
from app.store import bookings as rows
from app.store.db import connect, write
from tests.conftest import FROZEN_NOW
from tests.unit.test_faults import reading, snap

OOM = "ggml_cuda: cudaMalloc failed: out of memory"


def book(conn, uuid: str, start: int, end: int, user: str = "alice") -> int:
    with write(conn):
        rows.sync_cards(conn, [CardReading(0, uuid)], start)
        return rows.insert(conn, user=user, uid=1001, uuids=[uuid], start=start, end=end, klass="experiment", note="",
                           request=None, now=start, created_by=1001)


def test_an_unknown_xid_points_to_nvidias_table():
    assert meaning(99999) == "see NVIDIA's Xid table"


def test_a_card_at_exactly_90_percent_is_full():
    snapshot = FleetSnapshot(FROZEN_NOW, True, (CardReading(0, "GPU-a", memory_total_mib=1000, memory_used_mib=900),),
                             Topology())
    assert full_cards(snapshot, ["GPU-a"]) == ["GPU-a"]


def test_ooms_name_their_booking_and_every_full_card(tmp_path):
    conn = connect(tmp_path / "board.db")
    booking = book(conn, "GPU-a", FROZEN_NOW, FROZEN_NOW + 3600, user="bob")
    snapshot = FleetSnapshot(FROZEN_NOW, True, (
        CardReading(0, "GPU-a", memory_total_mib=1000, memory_used_mib=950),
        CardReading(1, "GPU-b", memory_total_mib=1000, memory_used_mib=990)), Topology())
    with write(conn):
        job = record_job_oom(conn, ts=FROZEN_NOW, snapshot=snapshot, card_uuids=["GPU-a", "GPU-b"], booking_id=booking,
                             pid=9)
        server = record_server_oom(conn, ts=FROZEN_NOW, booking_id=booking, user="bob", server_id=4,
                                   card_uuids=["GPU-a"], tail=[OOM])
    found = {f.id: f for f in store.recent(conn, 0)}
    assert (found[job].booking_id, found[job].user) == (booking, "bob")
    assert found[job].detail == "board run job 9 exited while card GPU-a, GPU-b was FULL"
    assert (found[server].booking_id, found[server].user, found[server].card_uuid) == (booking, "bob", "GPU-a")
    conn.close()


def test_a_server_built_without_its_cards_architecture_names_its_card_only_when_it_had_one(tmp_path):
    conn = connect(tmp_path / "board.db")
    booking = book(conn, "GPU-a", FROZEN_NOW, FROZEN_NOW + 3600, user="bob")
    tail = ["loading model", "  CUDA error: no kernel image is available for execution on the device  "]
    with write(conn):
        ids = [record_server_build(conn, ts=FROZEN_NOW, booking_id=booking, user="bob", server_id=7, card_uuids=cards,
                                   tail=tail) for cards in (["GPU-a"], ["GPU-a", "GPU-b"], [])]
        assert record_server_build(conn, ts=FROZEN_NOW, booking_id=booking, user="bob", server_id=7,
                                   card_uuids=["GPU-a"], tail=[OOM]) is None
    found = {f.id: f for f in store.recent(conn, 0)}
    assert [found[i].card_uuid for i in ids] == ["GPU-a", None, None]
    assert {(found[i].kind, found[i].booking_id, found[i].user) for i in ids} == {("build", booking, "bob")}
    assert found[ids[0]].detail == (f"server 7: CUDA error: no kernel image is available for execution on the device;"
                                    f" {REBUILD_HINT}")
    conn.close()


def test_a_spell_keeps_every_thermal_reason_it_saw():
    tracker = ThrottleTracker()
    tracker.observe(snap(100, reading("a", THROTTLE_HW_SLOWDOWN)))
    tracker.observe(snap(110, reading("a", THROTTLE_SW_THERMAL)))
    [spell] = tracker.observe(snap(120, reading("a", 0)))
    assert spell.detail == "HW slowdown, SW thermal"


def test_a_fault_belongs_to_the_booking_live_at_that_second(tmp_path):
    conn = connect(tmp_path / "board.db")
    start = FROZEN_NOW + 60
    booking = book(conn, "GPU-a", start, start + 3600)
    ids = record_all(conn, events=[GpuEvent("xid", "GPU-a", start, 79), GpuEvent("xid", "GPU-a", start - 1, 79),
                                   GpuEvent("xid", "GPU-a", start + 3600, 79)])
    found = {f.id: f.booking_id for f in store.recent(conn, 0)}
    assert [found[i] for i in ids] == [booking, None, None]
    conn.close()


def test_oom_events_and_spells_are_recorded_as_they_read(tmp_path):
    conn = connect(tmp_path / "board.db")
    tracker = ThrottleTracker()
    tracker.observe(snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
    [spell] = tracker.observe(snap(112.34, reading("GPU-a", 0)))
    ids = record_all(conn, events=[GpuEvent("oom", "GPU-a", 100, detail=f"  {OOM}  "),
                                   GpuEvent("oom", "GPU-b", 100, detail="killed for memory")], spells=[spell])
    found = {f.id: f for f in store.recent(conn, 0)}
    assert [found[i].detail for i in ids] == [OOM, "killed for memory", "HW slowdown"]
    assert found[ids[2]].duration_s == 12.3
    conn.close()


class Source:
    """A GPU source whose events the test hands over; it notes how long each turn was asked to wait."""

    def __init__(self):
        self.waits = []

    def events(self, wait_s):
        self.waits.append(wait_s)
        return []


class Fleet:
    def __init__(self, source, snapshot):
        self.source, self.snapshot = source, snapshot

    def latest(self):
        return self.snapshot


def test_each_turn_waits_as_asked_and_looks_every_observe_s_exactly(tmp_path):
    now = [100.0]
    fleet = Fleet(Source(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
    watcher = FaultWatcher(fleet, tmp_path / "board.db", lambda: now[0], wait_s=0.25, observe_s=5)
    watcher.step()
    watcher.step(0)
    assert fleet.source.waits == [0.25, 0]
    fleet.snapshot = snap(105, reading("GPU-a", 0))
    now[0] = 105.0  # exactly observe_s later: it looks again, and the spell has ended
    [fault] = watcher.step(0)
    assert store.recent(watcher.conn, 0)[0].duration_s == 5
    watcher.conn.close()


def test_a_source_without_events_still_throttles(tmp_path):
    fleet = Fleet(object(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
    watcher = FaultWatcher(fleet, tmp_path / "board.db", lambda: 100.0, observe_s=0)
    assert watcher.step() == []
    watcher.conn.close()


class Turns(threading.Event):
    """A stop event that is set after `n` turns of the loop, so that run() goes round in the test's own thread."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def is_set(self):
        self.n -= 1
        return self.n < 0


class Failing(Source):
    def events(self, wait_s):
        raise OSError("the driver went away")


def test_the_loop_logs_a_failure_once_and_records_open_spells_at_the_end(tmp_path):
    lines = []
    fleet = Fleet(Failing(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
    watcher = FaultWatcher(fleet, tmp_path / "board.db", lambda: 100.0, log=lines.append, wait_s=0, observe_s=0)
    watcher.tracker.observe(fleet.snapshot)
    watcher.run(Turns(3))
    assert lines == ["faults: OSError: the driver went away"]
    conn = connect(tmp_path / "board.db")
    [spell] = store.recent(conn, 0)
    assert (spell.kind, spell.card_uuid) == ("throttle", "GPU-a")
    conn.close()


def test_the_store_keeps_500_characters_defaults_to_no_detail_and_filters_by_card(tmp_path):
    conn = connect(tmp_path / "board.db")
    with write(conn):
        long = store.record(conn, ts=1, kind="oom", card_uuid="GPU-a", detail="x" * 600)
        bare = store.record(conn, ts=2, kind="xid", card_uuid="GPU-b", code=79)
        with pytest.raises(ValueError, match="must be one of xid, oom, throttle, build, not 'fire'"):
            store.record(conn, ts=3, kind="fire")
    assert [f.id for f in store.recent(conn, 0, card_uuid="GPU-b")] == [bare]
    found = {f.id: f.detail for f in store.recent(conn, 0)}
    assert found == {long: "x" * 500, bare: ""}
    conn.close()


class FailsFirst(Source):
    """Fails its first turn, then answers; tells the test when it has answered once."""

    def __init__(self):
        super().__init__()
        self.answered = threading.Event()

    def events(self, wait_s):
        super().events(wait_s)
        if len(self.waits) == 1:
            raise OSError("the driver went away")
        self.answered.set()
        return []


def test_the_watcher_thread_steps_logs_and_records_what_is_on_when_stopped(tmp_path):
    lines = []
    fleet = Fleet(FailsFirst(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
    stop, thread = start_watcher(fleet, tmp_path / "board.db", lambda: 100.0, log=lines.append)
    assert (thread.name, thread.daemon) == ("board-faults", True)
    assert fleet.source.answered.wait(60), "the watcher thread never took a turn"  # a bound, not a timing: it fails, not hangs
    stop.set()
    thread.join()
    assert lines == ["faults: OSError: the driver went away"]
    conn = connect(tmp_path / "board.db")
    [spell] = store.recent(conn, 0)
    assert (spell.kind, spell.card_uuid, spell.duration_s) == ("throttle", "GPU-a", 0)
    conn.close()


def test_a_failure_at_shutdown_is_logged_and_the_connection_closed(tmp_path):
    lines, calls = [], []

    def clock():
        calls.append(1)
        if len(calls) > 1:  # the turn reads it once; close() is the second
            raise RuntimeError("no clock")
        return 100.0

    watcher = FaultWatcher(Fleet(Source(), snap(100, reading("GPU-a", 0))), tmp_path / "board.db", clock,
                           log=lines.append, wait_s=0, observe_s=0)
    watcher.run(Turns(1))
    assert lines == ["faults: at shutdown: RuntimeError: no clock"]
    with pytest.raises(sqlite3.ProgrammingError):
        watcher.conn.execute("SELECT 1")
