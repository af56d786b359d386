"""Faults (issue 12 section 3): the store, Xid meanings, llama.cpp's OOM lines, throttling spells, the simulated
scenario's injections and the NVML event path (fake pynvml), through an in-process service on a clock the test moves."""

from __future__ import annotations

import sqlite3
import sys
import threading
from pathlib import Path

import pytest

from app.client.local import LocalClient
from app.config import Config
from app.core.identity import Identity
from app.errors import BadInput
from app.faults import store
from app.faults.oom import REBUILD_HINT, full_cards, oom_line, record_job_oom, record_server_build, record_server_oom
from app.faults.throttle import ThrottleTracker
from app.faults.watcher import FaultWatcher, record_all, start_watcher
from app.faults.xid import meaning
from app.gpu.model import (THROTTLE_HW_SLOWDOWN, THROTTLE_IDLE, THROTTLE_SW_POWER_CAP, THROTTLE_SW_THERMAL, CardReading,
                           FleetSnapshot, GpuEvent, Topology)
from app.gpu.simulated import SimulatedSource, load_scenario, parse_scenario
from app.service import Service
from app.gpu.fleet import Fleet
from app.store import bookings as rows
from app.store.db import connect, write
from tests.conftest import Clock, FROZEN_NOW

if str(ROOT := Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.fake_pynvml import FakeGpu, FakePynvml  # noqa: E402

ALICE = Identity("alice", 1001, False)


def sim_uuid(index: int) -> str:
    return f"GPU-5090sim-0000-0000-0000-{index:012d}"




@pytest.fixture
def clock():
    return Clock(FROZEN_NOW)


def make_service(tmp_path, source, clock) -> Service:
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0)
    return Service(config, Fleet(source, 0, clock=clock), clock=clock)


def scenario(tmp_path, text: str):
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return load_scenario(path)


# -- the store ---------------------------------------------------------------------------------


def test_record_count_and_recent(tmp_path):
    conn = connect(tmp_path / "board.db")
    with write(conn):
        store.record(conn, ts=100, kind="xid", card_uuid="GPU-a", code=79, detail="off the bus")
        store.record(conn, ts=200, kind="oom", card_uuid="GPU-b", booking_id=7, user="bob")
        store.record(conn, ts=300, kind="throttle", card_uuid="GPU-a", duration_s=42.5)
    assert store.count(conn, 0) == 3
    assert store.count(conn, 150) == 2
    assert store.count(conn, 0, kinds=["xid", "oom"]) == 2
    assert store.count(conn, 0, card_uuid="GPU-a") == 2
    assert store.count(conn, 0, kinds=["oom"], card_uuid="GPU-a") == 0
    assert [f.ts for f in store.recent(conn, 0)] == [300, 200, 100]  # newest first
    [oom] = store.recent(conn, 0, kinds=["oom"])
    assert (oom.booking_id, oom.user, oom.card_uuid) == (7, "bob", "GPU-b")
    with write(conn):
        store.record(conn, ts=400, kind="xid", card_uuid="GPU-b", code=79)
        store.record(conn, ts=500, kind="xid", card_uuid="GPU-b", code=13)
    assert store.by_code(conn, 0) == {13: 1, 79: 2}
    assert store.by_code(conn, 450) == {13: 1}
    with pytest.raises(ValueError, match="fault kind"):
        store.record(conn, ts=1, kind="fire")
    conn.close()


@pytest.mark.parametrize(("code", "words"), [(79, "fallen off the bus"), (48, "double-bit ECC"), (13, "graphics engine"),
                                             (31, "page fault"), (56, "NVIDIA's Xid table")])
def test_xid_meanings(code, words):
    assert words in meaning(code)


# -- OOM: llama.cpp's own lines ----------------------------------------------------------------

LLAMA_OOM = [
    "llama_model_load_from_file_impl: using device CUDA0 (NVIDIA GeForce RTX 5090) - 31791 MiB free",
    "ggml_backend_cuda_buffer_type_alloc_buffer: allocating 40960.00 MiB on device 0: cudaMalloc failed: out of memory",
    "alloc_tensor_range: failed to allocate CUDA0 buffer of size 42949672960",
    "llama_model_load: error loading model: unable to allocate CUDA0 buffer",
]
LLAMA_KV_OOM = [
    "llama_kv_cache_unified:      CUDA0 KV buffer size =  8192.00 MiB",
    "ggml_gallocr_reserve_n: failed to allocate CUDA0 buffer of size 2202009600",
    "llama_init_from_model: failed to initialize the context: failed to allocate compute pp buffers",
]
LLAMA_OTHER = [
    "main: exiting due to model loading error",
    "gguf_init_from_file: failed to open GGUF file '/models/missing.gguf'",
    "llama_model_load: error loading model: tensor 'blk.0.attn_q.weight' data is not within the file bounds",
]


def test_oom_lines_from_llama_cpp():
    assert "cudaMalloc failed: out of memory" in oom_line(LLAMA_OOM)
    assert oom_line(LLAMA_KV_OOM).startswith("ggml_gallocr_reserve_n: failed to allocate")
    assert oom_line(LLAMA_OTHER) is None
    assert oom_line([]) is None


def add_server(conn, cards: list[int]) -> int:
    from app.llama import rows

    with write(conn):
        conn.execute("INSERT OR IGNORE INTO bookings (id, user, uid, starts_at, ends_at, created_at, created_by)"
                     " VALUES (1, 'bob', 1002, 0, 3600, 0, 1002)")
        return rows.insert(conn, booking_id=1, user="bob", uid=1002, cards=cards, card_uuids=[f"GPU-{c}" for c in cards],
                           model="/m.gguf", alias=None, host="127.0.0.1", port=8080 + cards[0], ctx=256, parallel=1,
                           split_mode="layer", metrics=False, cmdline=["llama-server"], now=FROZEN_NOW)


def test_servers_that_crash_or_fail_out_of_memory_are_ooms(tmp_path, clock):
    from app.llama.service import ServerService

    conn = connect(tmp_path / "board.db")
    rules = ServerService(conn, Identity("bob", 1002, False), Config(), clock=clock)
    crashed, failed, other, split = add_server(conn, [2]), add_server(conn, [3]), add_server(conn, [4]), add_server(conn, [0, 1])
    rules.ended(crashed, exit_code=1, tail=LLAMA_OOM)
    rules.failed(failed, "not ready in time", LLAMA_KV_OOM)
    rules.ended(other, exit_code=1, tail=LLAMA_OTHER)  # crashed, but not for memory
    rules.ended(split, exit_code=1, tail=LLAMA_OOM)
    found = {f.detail.split(":")[0]: f for f in store.recent(conn, 0)}
    assert sorted(found) == [f"server {crashed}", f"server {failed}", f"server {split}"]
    assert (found[f"server {crashed}"].card_uuid, found[f"server {crashed}"].user) == ("GPU-2", "bob")
    assert found[f"server {crashed}"].detail.endswith("cudaMalloc failed: out of memory")
    assert found[f"server {split}"].card_uuid is None  # split over two cards: which one ran out is unknown
    rules.ended(crashed, exit_code=1, tail=LLAMA_OOM)  # the same end reported again: still one fault
    assert store.count(conn, 0, ["oom"]) == 3
    conn.close()


def test_a_job_that_exits_while_its_card_is_full_is_an_oom(tmp_path):
    conn = connect(tmp_path / "board.db")
    snapshot = FleetSnapshot(FROZEN_NOW, True, (
        CardReading(0, "GPU-a", memory_total_mib=32000, memory_used_mib=31000),  # FULL: over 90 %
        CardReading(1, "GPU-b", memory_total_mib=32000, memory_used_mib=20000),
    ), Topology())
    with write(conn):
        assert record_job_oom(conn, ts=5, snapshot=snapshot, card_uuids=["GPU-b"], booking_id=None, pid=9) is None
        assert record_job_oom(conn, ts=5, snapshot=None, card_uuids=["GPU-a"], booking_id=None, pid=9) is None
        record_job_oom(conn, ts=5, snapshot=snapshot, card_uuids=["GPU-a", "GPU-b"], booking_id=None, pid=9)
    [fault] = store.recent(conn, 0)
    assert (fault.kind, fault.card_uuid) == ("oom", "GPU-a")
    assert "job 9" in fault.detail
    conn.close()


# -- throttling spells -------------------------------------------------------------------------


def reading(uuid: str, reasons: int | None, lost: bool = False) -> CardReading:
    return CardReading(0, uuid, throttle_reasons=reasons, lost=lost)


def snap(at: float, *cards: CardReading) -> FleetSnapshot:
    return FleetSnapshot(at, False, cards, Topology())


def test_a_throttling_spell_is_recorded_once_when_it_ends_with_its_duration():
    tracker = ThrottleTracker()
    assert tracker.observe(snap(100, reading("a", THROTTLE_IDLE | THROTTLE_SW_POWER_CAP))) == []  # not thermal
    assert tracker.observe(snap(110, reading("a", THROTTLE_HW_SLOWDOWN))) == []
    assert tracker.observe(snap(120, reading("a", THROTTLE_HW_SLOWDOWN))) == []
    [spell] = tracker.observe(snap(185, reading("a", THROTTLE_IDLE)))
    assert (spell.card_uuid, spell.started, spell.duration_s, spell.detail) == ("a", 110, 75, "HW slowdown")
    assert tracker.observe(snap(190, reading("a", 0))) == []


def test_a_spell_still_on_at_shutdown_and_a_lost_card_end_it():
    tracker = ThrottleTracker()
    tracker.observe(snap(100, reading("a", THROTTLE_HW_SLOWDOWN), reading("b", THROTTLE_HW_SLOWDOWN)))
    [lost] = tracker.observe(snap(130, reading("a", THROTTLE_HW_SLOWDOWN), reading("b", None, lost=True)))
    assert (lost.card_uuid, lost.duration_s) == ("b", 30)
    [ongoing] = tracker.close(400)
    assert (ongoing.card_uuid, ongoing.duration_s, ongoing.ongoing) == ("a", 300, True)
    assert "still on" in ongoing.detail
    assert tracker.close(500) == []


# -- the simulated fleet injects them, the watcher records them --------------------------------

SCENARIO = """
[cards]
count = 4
[faults]
xid = [{card = 3, code = 79, at = 30}, {card = 1, code = 13}]
oom = [{card = 2, at = 60}]
throttle = [{card = 0, at = 10, seconds = 120}]
"""


def test_simulated_faults_reach_the_table_through_the_service(tmp_path, clock):
    source = SimulatedSource(scenario(tmp_path, SCENARIO), clock=clock, sleep=lambda s: None)
    service = make_service(tmp_path, source, clock)
    watcher = FaultWatcher(service.fleet, service.config.db_path, service.clock, log=lambda line: None, observe_s=0)
    client = LocalClient(service, ALICE)
    try:
        booked = client.call("book", start=FROZEN_NOW, end=FROZEN_NOW + 3600, cards=[2])  # alice holds card 2
        watcher.step(0)  # at 0 s: the Xid 13 on card 1
        [xid13] = store.recent(service.conn, 0)
        assert (xid13.kind, xid13.code, xid13.card_uuid) == ("xid", 13, sim_uuid(1))
        assert xid13.detail.startswith("Xid 13: graphics engine exception")
        clock.now += 15
        watcher.step(0)  # card 0 throttles now: nothing recorded until the spell ends
        assert store.count(service.conn, 0, ["throttle"]) == 0
        clock.now += 50  # 65 s: the Xid 79 and the OOM are due
        watcher.step(0)
        assert [(f.kind, f.code, f.card_uuid) for f in store.recent(service.conn, 0, ["xid", "oom"])][:2] == [
            ("oom", None, sim_uuid(2)), ("xid", 79, sim_uuid(3))]
        [oom] = store.recent(service.conn, 0, ["oom"])
        assert (oom.booking_id, oom.user, oom.detail) == (booked["id"], "alice", "ggml_cuda: cudaMalloc failed: out of memory")
        clock.now += 100  # 165 s: the throttling ended at 130 s; the watcher sees it at its next look
        watcher.step(0)
        [spell] = store.recent(service.conn, 0, ["throttle"])
        assert (spell.card_uuid, spell.ts, spell.duration_s) == (sim_uuid(0), FROZEN_NOW + 15, 150)
        watcher.step(0)  # each injection once
        assert store.count(service.conn, 0) == 4
        found = client.call("faults", since=0)
        assert found["counts"] == {"xid": 2, "oom": 1, "throttle": 1, "build": 0}
        assert [f["card"] for f in found["faults"]] == [2, 3, 0, 1]  # newest first; a spell by its start
        assert client.call("faults", since=0, kind="oom")["counts"] == {"oom": 1}
        with pytest.raises(BadInput, match="fault kind"):
            client.call("faults", since=0, kind="fire")
    finally:
        client.close()


def test_throttling_still_on_when_the_service_stops_is_recorded(tmp_path, clock):
    text = "[cards]\ncount = 2\n[faults]\nthrottle = [{card = 1, seconds = 600}]\n"
    source = SimulatedSource(scenario(tmp_path, text), clock=clock, sleep=lambda s: None)
    service = make_service(tmp_path, source, clock)
    watcher = FaultWatcher(service.fleet, service.config.db_path, service.clock, log=lambda line: None, observe_s=0)
    watcher.step(0)
    clock.now += 90
    watcher.step(0)
    assert store.count(service.conn, 0) == 0
    watcher.close()
    [spell] = store.recent(service.conn, 0)
    assert (spell.card_uuid, spell.duration_s) == (sim_uuid(1), 90)
    service.close()


@pytest.mark.parametrize(("text", "message"), [
    ("[faults]\nxid = [{card = 9, code = 79}]", "faults.xid[0].card 9 is out of range"),
    ("[faults]\nxid = [{card = 1}]", "faults.xid[0].code is missing"),
    ("[faults]\noom = [{card = 1, at = -5}]", "faults.oom[0].at must not be negative"),
    ("[faults]\nthrottle = [{card = 1}]", "faults.throttle[0].seconds is missing"),
    ("[faults]\nthrottle = [{card = 1, seconds = 5, when = 3}]", "unknown key 'faults.throttle[0].when'"),
])
def test_bad_fault_injections_are_one_line(tmp_path, text, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        scenario(tmp_path, text)


def test_a_scenario_without_injections_has_no_events():
    source = SimulatedSource(parse_scenario({}), clock=lambda: FROZEN_NOW, sleep=lambda s: None)
    assert source.events(0) == []


# -- the NVML event path, on the fake pynvml ---------------------------------------------------


def test_nvml_xid_events_reach_the_table(tmp_path, monkeypatch, clock):
    from app.gpu.nvml import NvmlSource

    gpus = [FakeGpu(uuid=f"GPU-real-{i}") for i in range(3)]
    fake = FakePynvml(gpus)
    gpus[2].errors["nvmlDeviceRegisterEvents"] = fake.NVMLError_NotSupported  # this card does not report events
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource(clock=clock)
    service = make_service(tmp_path, source, clock)
    watcher = FaultWatcher(service.fleet, service.config.db_path, service.clock, log=lambda line: None, observe_s=0)
    try:
        assert watcher.step(0) == []  # registers; nothing yet
        fake.inject_xid(1, 79)
        fake.inject_xid(0, 48)
        fake.inject_xid(2, 31)  # not registered: unseen
        gpus[1].lost = True  # Xid 79: the card is gone, so the event's device cannot tell its UUID
        ids = watcher.step(0.05)
        assert len(ids) == 2
        faults = store.recent(service.conn, 0)
        assert sorted((f.card_uuid, f.code) for f in faults) == [("GPU-real-0", 48), ("GPU-real-1", 79)]
        assert {f.detail for f in faults} >= {"Xid 79: GPU has fallen off the bus"}
        assert fake.calls["nvmlEventSetWait_v2"] >= 3  # two events, then the timeout that ends the round
    finally:
        source.close()
        service.close()
    assert fake.event_sets[0].freed


def test_nvml_without_event_support_still_reads(tmp_path, monkeypatch, clock):
    from app.gpu.nvml import NvmlSource

    gpus = [FakeGpu(uuid="GPU-real-0")]
    fake = FakePynvml(gpus)
    gpus[0].errors["nvmlDeviceRegisterEvents"] = fake.NVMLError_NotSupported
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource(clock=clock)
    assert source.events(0) == []
    assert fake.event_sets[0].freed  # no card registered: the set is let go at once
    assert source.read().cards[0].uuid == "GPU-real-0"
    source.close()


def test_the_waiting_watcher_wakes_on_an_injected_xid(monkeypatch):
    """The fake's wait blocks like NVML's: an event put in from another thread ends it early."""
    import threading

    from app.gpu.nvml import NvmlSource

    fake = FakePynvml([FakeGpu(uuid="GPU-real-0")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource()
    source.events(0)
    threading.Timer(0.05, fake.inject_xid, args=(0, 119)).start()
    events = source.events(30)  # returns when the event comes, long before 30 s
    assert [(e.uuid, e.code) for e in events] == [("GPU-real-0", 119)]
    source.close()


# -- board run jobs: the enforcement pass sees them go ------------------------------------------


def test_a_job_that_exits_on_a_full_card_counts_and_one_on_a_roomy_card_does_not(tmp_path, clock):
    import os
    import subprocess

    from app.service.box.enforce import enforce_once
    from app.store import jobs
    from tests.unit.test_enforce import server_of

    text = "[cards]\ncount = 2\n[[processes]]\ncard = 0\npid = 41001\nused_mib = 31000\nuser = \"alice\"\n"
    service = make_service(tmp_path, SimulatedSource(scenario(tmp_path, text), clock=clock), clock)
    me = Identity("alice", os.getuid(), False)
    server = server_of(service)
    pids = []
    try:
        for card in (0, 1):
            booking = service.bookings(me).create(cards=[card], start=FROZEN_NOW, end=FROZEN_NOW + 3600)
            process = subprocess.Popen(["sleep", "60"])
            pids.append(process.pid)
            entry = service.processes.add("job", booking.id, os.getuid(), process.pid, booking.card_uuids)
            with write(service.conn):
                jobs.remember(service.conn, pid=entry.pid, started_ticks=entry.started_ticks, booking_id=booking.id,
                              uid=entry.uid, pgid=entry.pgid, cards=entry.cards, now=FROZEN_NOW, host=service.host)
            service.fleet.latest()  # the reading the service had when the job went
            process.kill()
            process.wait()
            assert enforce_once(server)["ended"] == [entry.id]
        [fault] = store.recent(service.conn, 0)
        assert (fault.kind, fault.card_uuid, fault.user) == ("oom", sim_uuid(0), "alice")
        assert fault.detail == f"board run job {pids[0]} exited while card {sim_uuid(0)} was FULL"
    finally:
        service.processes.close()
        service.close()


def test_a_wait_that_fails_at_once_still_takes_its_time(monkeypatch):
    """A driver whose wait fails at once (not a timeout) must not turn the watcher's loop into a busy one."""
    from app.gpu.nvml import NvmlSource

    fake = FakePynvml([FakeGpu(uuid="GPU-real-0")])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource()
    source.events(0)
    fake.event_sets[0].freed = True  # every wait now fails with InvalidArgument
    slept = []
    monkeypatch.setattr("app.gpu.nvml.time.sleep", slept.append)
    assert source.events(0.5) == []
    assert slept == [0.5]
    source.close()


def test_the_shipped_faults_scenario_loads():
    shipped = load_scenario(Path(__file__).resolve().parents[2] / "app/gpu/scenarios/faults.toml")
    assert (len(shipped.cards), shipped.xids, shipped.ooms, shipped.throttles) == (
        8, ((3, 79, 30.0), (1, 13, 5.0)), ((2, 60.0),), ((5, 10.0, 120.0),))


def test_two_ctypes_handles_to_one_device_match_by_address():
    """Real events carry a fresh c_nvmlDevice_t: it is not the registered object, but it points at the same device."""
    import ctypes

    pynvml = pytest.importorskip("pynvml")
    from app.gpu.nvml import _address

    registered = ctypes.cast(ctypes.c_void_p(0x7F00_1234), pynvml.c_nvmlDevice_t)
    from_event = ctypes.cast(ctypes.c_void_p(0x7F00_1234), pynvml.c_nvmlDevice_t)
    other = ctypes.cast(ctypes.c_void_p(0x7F00_5678), pynvml.c_nvmlDevice_t)
    assert registered is not from_event
    assert _address(registered) == _address(from_event) != _address(other)


LLAMA_NO_KERNEL = [
    "ggml_cuda_init: found 1 CUDA devices:",
    "  Device 0: NVIDIA GeForce RTX 5090, compute capability 12.0, VMM: yes",
    "ggml_cuda_compute_forward: ADD failed",
    "CUDA error: no kernel image is available for execution on the device",
]


def test_a_server_built_without_its_cards_architecture_is_a_build_fault_with_the_rebuild_hint(tmp_path, clock):
    from app.llama.service import ServerService

    conn = connect(tmp_path / "board.db")
    rules = ServerService(conn, Identity("bob", 1002, False), Config(), clock=clock)
    crashed, failed, oom = add_server(conn, [2]), add_server(conn, [3]), add_server(conn, [4])
    rules.ended(crashed, exit_code=1, tail=LLAMA_NO_KERNEL)
    rules.failed(failed, "not ready in time", LLAMA_NO_KERNEL)
    rules.ended(oom, exit_code=1, tail=LLAMA_OOM)  # out of memory is not a build fault
    builds = store.recent(conn, 0, ["build"])
    assert sorted(f.detail.split(":")[0] for f in builds) == [f"server {crashed}", f"server {failed}"]
    for fault in builds:
        assert "CUDA error: no kernel image is available for execution on the device" in fault.detail
        assert "-DCMAKE_CUDA_ARCHITECTURES=" in fault.detail and fault.user == "bob"
    assert store.count(conn, 0, ["oom"]) == 1
    conn.close()


def test_the_build_kind_migration_keeps_the_faults_recorded_before_it(tmp_path):
    import sqlite3

    from app.store import schema

    path = tmp_path / "board.db"
    raw = sqlite3.connect(path, isolation_level=None)
    raw.execute("BEGIN")
    for script in schema.MIGRATIONS[: schema.MIGRATIONS.index(schema._V_FAULT_BUILD)]:
        for statement in schema._statements(script):
            raw.execute(statement)
    raw.execute("INSERT INTO faults (ts, card_uuid, kind, code, detail) VALUES (5, 'GPU-a', 'xid', 79, 'Xid 79')")
    raw.execute(f"PRAGMA user_version = {schema.MIGRATIONS.index(schema._V_FAULT_BUILD)}")
    raw.execute("COMMIT")
    with pytest.raises(sqlite3.IntegrityError):  # before it, the old CHECK refuses the new kind
        raw.execute("INSERT INTO faults (ts, kind) VALUES (6, 'build')")
    raw.close()
    conn = connect(path)
    with write(conn):
        store.record(conn, ts=6, kind="build", detail="server 1: no kernel image is available")
    assert [(f.kind, f.code, f.card_uuid) for f in store.recent(conn, 0)] == [("build", None, None), ("xid", 79, "GPU-a")]
    assert conn.execute("SELECT name FROM sqlite_master WHERE name = 'faults_by_ts'").fetchone() is not None
    conn.close()


# Faults at their boundaries: where `make mutation` found a nearly right version untold apart.

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


class Snapshots:
    def __init__(self, source, snapshot):
        self.source, self.snapshot = source, snapshot

    def latest(self):
        return self.snapshot


def test_each_turn_waits_as_asked_and_looks_every_observe_s_exactly(tmp_path):
    now = [100.0]
    fleet = Snapshots(Source(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
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
    fleet = Snapshots(object(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
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
    fleet = Snapshots(Failing(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
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
    fleet = Snapshots(FailsFirst(), snap(100, reading("GPU-a", THROTTLE_HW_SLOWDOWN)))
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

    watcher = FaultWatcher(Snapshots(Source(), snap(100, reading("GPU-a", 0))), tmp_path / "board.db", clock,
                           log=lines.append, wait_s=0, observe_s=0)
    watcher.run(Turns(1))
    assert lines == ["faults: at shutdown: RuntimeError: no clock"]
    with pytest.raises(sqlite3.ProgrammingError):
        watcher.conn.execute("SELECT 1")
