"""The service's sampler against the simulated fleet with a clock the test moves, and the `history` op on its store."""

from __future__ import annotations

import sqlite3
import sys
from dataclasses import replace

import pytest

from app.client.local import LocalClient
from app.config import Config, HistorySettings
from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED
from app.core.identity import Identity
from app.errors import BadInput
from app.gpu.model import THROTTLE_SW_THERMAL, GpuProcess
from app.gpu.simulated import DEFAULT_FLEET, SimulatedSource, demo_uid
from app.history.sampler import Sampler
from app.history.store import BUCKET_S, EPOCH
from tests.conftest import FROZEN_NOW

ALICE = Identity("alice", demo_uid("alice"), False)
START = FROZEN_NOW - (FROZEN_NOW - EPOCH) % BUCKET_S  # a bucket's start
UUID = "GPU-5090sim-0000-0000-0000-{:012d}".format


def process(pid, used, user):
    return GpuProcess(pid, used, user, demo_uid(user), "python x.py")


# Card 0: alice's, with her process (IN USE); 1: alice's, idle (BOOKED); 2: bob's process, no booking (SQUATTED);
# 3: lost; 4: nothing (FREE); 5: alice's, with mallory's process beside hers (SQUATTED); 7: hot.
SCENARIO = replace(DEFAULT_FLEET, lost=frozenset({3}), processes=(
    (0, process(100, 20000, "alice")), (0, process(101, 1000, "alice")), (2, process(200, 5000, "bob")),
    (5, process(300, 3000, "alice")), (5, process(301, 9000, "mallory"))))


def sampler_of(service) -> Sampler:
    """The sampler the service's agent starts, on this service's fleet, history, config and clock."""
    return Sampler(service.fleet, service.history, service.config, service.clock)


@pytest.fixture
def clock():
    return [float(START)]


@pytest.fixture
def client(tmp_path, clock):
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(sample_s=10, raw_hours=1, rollup_days=2))
    source = SimulatedSource(SCENARIO, clock=lambda: clock[0])
    made = LocalClient.on(config, source, ALICE, clock=lambda: clock[0])
    for cards in ([0], [1], [5]):
        made.call("book", cards=cards, start=START, end=START + 3 * 86400)
    yield made
    made.close()


def test_one_round_records_every_card_its_state_users_and_figures(client, tmp_path):
    sampler = sampler_of(client.service)
    sampler.sample_once()
    store = client.service.history
    assert store.path == tmp_path / "board.history.db"
    rows = {row["uuid"]: row for row in store.samples(START, START + 1)}
    states = [rows[UUID(i)]["state"] for i in range(8)]
    assert states == [IN_USE, BOOKED, SQUATTED, LOST, FREE, SQUATTED, FREE, FREE]
    assert [u["user"] for u in rows[UUID(0)]["users"]] == ["alice"]
    assert rows[UUID(0)]["users"][0]["vram"] == 21000  # her two processes together
    assert [(u["user"], u["squat"]) for u in rows[UUID(5)]["users"]] == [("alice", False), ("mallory", True)]
    assert rows[UUID(2)]["users"] == [{"user": "bob", "vram": 5000, "squat": True}]
    assert rows[UUID(0)]["booking"] is not None and rows[UUID(4)]["booking"] is None
    reading = client.service.fleet.latest().cards
    for i in (0, 7):
        row = rows[UUID(i)]
        assert (row["vram"], row["util"], row["temp"], row["sm"], row["throttle"]) == (
            reading[i].memory_used_mib, reading[i].utilization_pct, reading[i].temperature_c,
            reading[i].sm_clock_mhz, reading[i].throttle_reasons)
        assert (row["power"], row["power_limit"]) == (round(reading[i].power_w), 575)
        # PCIe traffic: the busier direction (issue 23)
        assert row["pcie"] == round(max(reading[i].pcie_tx_mib_s, reading[i].pcie_rx_mib_s))
    assert rows[UUID(0)]["pcie"] > 0 and rows[UUID(4)]["pcie"] == 0
    assert rows[UUID(7)]["throttle"] & THROTTLE_SW_THERMAL  # the hot card slows itself
    assert rows[UUID(3)]["vram"] is None  # a lost card has no figures


def test_two_hours_of_sampling_roll_up_and_prune_as_the_clock_moves(client, clock):
    sampler = sampler_of(client.service)
    while clock[0] < START + 2 * 3600:
        sampler.step()  # a sample each time; roll-up and pruning once a minute
        clock[0] += 10
    store = client.service.history
    assert store.rolled_to() == START + 2 * 3600 - BUCKET_S  # every finished bucket, not the one filling
    samples = store.samples(0, clock[0])
    assert min(s["ts"] for s in samples) >= START + 3600 - 60  # raw_hours = 1, pruned once a minute
    rollups = store.rollups(0, clock[0], uuid=UUID(0))
    assert [r["ts"] for r in rollups] == list(range(START, START + 2 * 3600 - BUCKET_S, BUCKET_S))
    assert {(r["n"], r["seconds"], r["state"]) for r in rollups} == {(30, 300, IN_USE)}
    # The rollups of the second hour against its raw samples, still there.
    raw = [s["util"] for s in samples if s["card"] == store.cards()[UUID(0)] and START + 6300 <= s["ts"] < START + 6600]
    [last] = [r for r in rollups if r["ts"] == START + 6300]
    assert (last["util_min"], last["util_max"]) == (min(raw), max(raw))
    assert last["util_mean"] == int(sum(raw) / len(raw) + 0.5)


def test_the_sampler_sums_each_finished_day_for_the_report(client, clock):
    """Once a day is rolled up to its end, the upkeep sums it (day_sums, what `board report` reads for it)."""
    sampler = sampler_of(client.service)
    midnight = START - (START - EPOCH) % 86400 + 86400
    while clock[0] < midnight + 600:
        sampler.step()  # a sample a bucket, and the upkeep each time
        clock[0] += BUCKET_S
    db = client.service.history.db
    assert [day for day, in db.execute("SELECT day FROM summed_days")] == [(midnight - EPOCH) // 86400 - 1]
    before = ((midnight - EPOCH) // BUCKET_S) << 8
    assert db.execute("SELECT sum(n), sum(seconds) FROM day_sums").fetchone() \
        == db.execute("SELECT sum(n), sum(n * dt) FROM rollups WHERE id < ?", [before]).fetchone()


def test_the_history_op_reads_what_was_recorded(client, clock):
    sampler = sampler_of(client.service)
    source = client.service.fleet.source
    # A process only the store can know of: a replay of the simulated fleet would not show it.
    source.set_extra_processes({4: (process(400, 12288, "carol"),)})
    while clock[0] < START + 600:
        sampler.sample_once()
        clock[0] += 10
    found = client.call("history", seconds=600, step=10, uuid=UUID(4))
    assert list(found) == [UUID(4)]
    points = found[UUID(4)]
    assert [p[0] for p in points] == list(range(START, START + 600, 10))  # the last 600 s, every sample
    assert all(12 < p[1] < 13 for p in points)  # 12288 MiB and the driver's few hundred
    assert all(len(p) == 5 and 0 < p[4] < 575 for p in points)  # power, under the limit
    day = client.call("history", seconds=86400, step=300)
    assert set(day) == {UUID(i) for i in range(8) if i != 3}  # a lost card has nothing to draw
    assert len(day[UUID(4)]) == 2  # ten minutes in two buckets, from the raw samples (nothing rolled yet)


def test_a_simulated_fleet_with_nothing_recorded_is_replayed(client):
    found = client.call("history", seconds=600, step=5)
    assert len(found) == 8 and all(len(points) == 120 for points in found.values())


@pytest.mark.parametrize("args, message", [
    ({"seconds": 0}, "seconds is 1 to"),
    ({"seconds": 500 * 86400, "step": 86400}, "seconds is 1 to"),
    ({"seconds": 86400, "step": 1}, "at most 5000 points a card; take a step of 18 s"),
])
def test_history_refuses_what_it_cannot_answer(client, args, message):
    with pytest.raises(BadInput, match=message):
        client.call("history", **args)


def test_real_gpus_get_only_what_the_store_holds(tmp_path, monkeypatch, clock):
    from app.gpu.nvml import NvmlSource
    from app.service import Service
    from app.gpu.fleet import Fleet
    from tests.fakes.fake_pynvml import FakeGpu, FakePynvml

    fake = FakePynvml([FakeGpu(uuid="GPU-real-0", memory_used=4096 * 1024 * 1024, power_mw=123_400,
                               sm_clock_mhz=1950, clocks_event_reasons=THROTTLE_SW_THERMAL)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0)
    service = Service(config, Fleet(NvmlSource(clock=lambda: clock[0]), 0), clock=lambda: clock[0])
    client = LocalClient(service, ALICE)
    try:
        assert client.call("history", seconds=600) == {}  # nothing recorded, nothing made up
        sampler_of(service).sample_once()
        [row] = service.history.samples(0, clock[0] + 1)
        assert (row["vram"], row["power"], row["sm"], row["throttle"]) == (4096, 123, 1950, THROTTLE_SW_THERMAL)
        assert client.call("history", seconds=600, step=10) == {"GPU-real-0": [[START, 4.0, 0.0, 40.0, 123.0]]}
    finally:
        client.close()


def test_the_quick_path_and_a_disabled_history_start_no_sampler(tmp_path):
    from app.history.sampler import start_sampler
    from app.service import Service
    from app.gpu.fleet import Fleet

    config = Config(db_path=tmp_path / "board.db", history=HistorySettings(enabled=False))
    service = Service(config, Fleet(SimulatedSource(), 1))
    assert start_sampler(service.fleet, service.history, service.config, service.clock) is None
    assert not (tmp_path / "board.history.db").exists()


def test_the_loop_logs_a_lasting_failure_once_and_its_end(client, tmp_path):
    import threading

    sampler = sampler_of(client.service)
    lines, calls = [], []
    sampler.log = lines.append
    stop = threading.Event()

    def step():
        calls.append(1)
        if len(calls) <= 3:
            raise sqlite3.OperationalError("database or disk is full")
        stop.set()

    sampler.step = step
    sampler.settings = HistorySettings(sample_s=0.001)
    sampler.run(stop)
    assert lines == ["history: sample failed: OperationalError: database or disk is full", "history: sampling again"]
