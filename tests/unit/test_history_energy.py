"""Energy on the bill (app.history.energy): kWh from NVML's energy counter where a card has one, from its power
samples otherwise, over raw samples and rollups, per booking, user and project; the counter read from the fake pynvml
and integrated by the simulated fleet."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from app.config import Config, HistorySettings
from app.core.cardstate import BOOKED, LOST
from app.gpu.simulated import DEFAULT_FLEET, SimulatedSource
from app.history.energy import COUNTER, SAMPLED, Energy, booking_energy, cards_energy, energy_by, energy_report
from app.history.sampler import Sampler, sample_fleet
from app.history.store import BUCKET_S, EPOCH, GAP_SAMPLES, HistoryStore, Sample, interval_mj
from app.model import Booking
from tests.conftest import FROZEN_NOW

if str(ROOT := Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.fake_pynvml import FakeGpu, FakePynvml  # noqa: E402

S = FROZEN_NOW - (FROZEN_NOW - EPOCH) % BUCKET_S + BUCKET_S  # a bucket's start: the booking's
E = S + 2 * 3600
A, B, C = "GPU-a", "GPU-b", "GPU-c"
STEP = 10


def booking(id: int, user: str, cards: tuple[str, ...], start: int = S, end: int = E, project: str = "") -> Booking:
    return Booking(id, user, 1000 + id, tuple(range(len(cards))), cards, start, end, "batch", "", "booked",
                   project=project)


def watts(ts: int, inside: float = 300, outside: float = 100) -> float:
    """300 W for the samples whose stretch (ts - 10, ts] lies in the booking, 100 W for the others: a window that is
    off by one sample changes the figure."""
    return inside if S - STEP <= ts <= E - STEP else outside


def record(store: HistoryStore, uuids: dict[str, bool], *, start: int = S - 600, end: int = E + 600,
           power=watts, counter_at=None, skip=()) -> None:
    """Samples every 10 s over [start, end) for each card (uuid -> has the energy counter); the counter counts each
    stretch's trapezoid in mJ, as a card's would, or `counter_at(uuid, ts, mj)` says what it reads."""
    counters = dict.fromkeys(uuids, 5_000_000_000)
    before: dict[str, float] = {}
    for ts in range(start, end, STEP):
        round_ = []
        for uuid, metered in uuids.items():
            p = power(ts) if uuid != C else 500.0  # card C: another card at another power, never booked here
            if uuid in before:
                counters[uuid] += round((before[uuid] + p) / 2 * STEP * 1000)
            before[uuid] = p
            mj = counters[uuid] if counter_at is None else counter_at(uuid, ts, counters[uuid])
            if ts not in skip:
                round_.append(Sample(ts=ts, uuid=uuid, state=BOOKED, dt=STEP, power=round(p),
                                     energy_mj=mj if metered else None))
        store.add(round_)


@pytest.fixture
def store(tmp_path):
    made = HistoryStore(tmp_path / "board.history.db")
    yield made
    made.close()


class TestIntervals:
    def test_the_counter_says_its_difference_and_the_power_its_trapezoid(self):
        """Wrong versions: W taken for kW (x1000), the trapezoid's half forgotten, the counter ignored where it is."""
        assert interval_mj((0, 300, 1_000_000), (10, 300, 4_000_000), 10) == (3_000_000, False)
        assert interval_mj((0, 200, None), (10, 400, None), 10) == (3_000_000, True)

    def test_a_counter_that_went_down_falls_back_to_the_power_never_negative(self):
        """A driver reload starts the counter again at 0. Wrong version: the difference taken as it is (-4 kJ)."""
        assert interval_mj((0, 300, 5_000_000), (10, 300, 1_000_000), 10) == (3_000_000, True)
        assert interval_mj((0, None, 5_000_000), (10, 300, 1_000_000), 10) is None

    def test_a_gap_counts_as_two_samples_at_its_mean_power(self):
        """An hour with no sample (the service stalled): 20 s of it at the stretch's mean power. Wrong version: the
        whole hour at full power (1.08 MJ from the power, as much from the counter)."""
        assert GAP_SAMPLES == 2
        assert interval_mj((0, 300, None), (3600, 300, None), 10) == (6_000_000, True)
        assert interval_mj((0, 300, 0), (3600, 300, 1_080_000_000), 10) == (6_000_000, False)
        assert interval_mj((0, 300, None), (20, 300, None), 10) == (6_000_000, True)  # one missed sample: all of it


class TestBookingEnergy:
    def test_300_w_on_two_cards_for_two_hours_is_1_2_kwh_from_the_counter(self, store):
        """Wrong versions: W vs kW (1200 or 0.0012), another card's power counted (card C at 500 W), the window off by
        a sample (the 100 W ones either side), the counter's mJ taken for J."""
        record(store, {A: True, B: True, C: True})
        found = booking_energy(store, booking(1, "alice", (A, B)), S - 86400, S + 86400)
        assert found.kwh == pytest.approx(1.2, abs=1e-9)
        assert found.source == COUNTER
        assert cards_energy(store, [A], S, E).kwh == pytest.approx(0.6, abs=1e-9)

    def test_a_card_without_the_counter_is_sampled_and_says_so(self, store):
        """Wrong versions: 'counter' said for a card that has none; the power samples not integrated (0 kWh)."""
        record(store, {A: True, B: False})
        assert cards_energy(store, [A], S, E) == Energy(pytest.approx(2_160_000), COUNTER)
        assert cards_energy(store, [B], S, E) == Energy(pytest.approx(2_160_000), SAMPLED)
        assert cards_energy(store, [A, B], S, E).source == SAMPLED  # any part sampled: the whole says so

    def test_a_driver_reload_mid_booking_neither_goes_negative_nor_loses_the_stretch(self, store):
        """The counter starts again at 0 an hour in. Wrong versions: the negative difference counted (about -5 GJ),
        the stretch dropped (3 kJ short), 'counter' still said."""
        reload_at = S + 3600

        def counter_at(uuid, ts, mj):
            return mj - 5_000_000_000 if ts >= reload_at else mj  # from 0 again: under the last reading

        record(store, {A: True}, counter_at=counter_at)
        found = cards_energy(store, [A], S, E)
        assert found.joules == pytest.approx(2_160_000)
        assert found.source == SAMPLED

    def test_a_stalled_hour_counts_two_samples_not_the_hour(self, store):
        """No sample for the booking's second hour but its last: wrong version, the gap at full power (+1.08 MJ)."""
        skip = set(range(S + 3600, E - STEP, STEP))
        record(store, {B: False}, skip=skip)
        found = cards_energy(store, [B], S, E)
        assert found.joules == pytest.approx(3000 * 360 + 2 * 3000)  # the first hour, then the capped gap

    def test_a_lost_card_draws_nothing_while_lost(self, store):
        """Wrong version: the lost samples' power (whatever the driver last said) integrated."""
        store.add([Sample(ts=S, uuid=A, state=BOOKED, dt=STEP, power=300, energy_mj=0)])
        store.add([Sample(ts=S + 10, uuid=A, state=LOST, dt=STEP, power=300, energy_mj=3_000_000)])
        store.add([Sample(ts=S + 20, uuid=A, state=BOOKED, dt=STEP, power=300, energy_mj=6_000_000)])
        assert cards_energy(store, [A], S, E).joules == 0

    def test_a_booking_from_last_month_keeps_its_kwh_in_the_rollups(self, store):
        """The raw samples rolled up and pruned: the rollups' mean power over their seconds. Wrong versions: the
        rollups' energy not read (0), a bucket held in part counted whole, the counter's source lost."""
        record(store, {A: True, B: False})
        now = E + 86400
        store.roll_up(now)
        store.prune(now, raw_hours=1, rollup_days=400)
        assert store.conn.execute("SELECT count(*) FROM samples").fetchone() == (0,)
        two_hours = booking(1, "alice", (A, B))
        assert booking_energy(store, two_hours, 0, now).kwh == pytest.approx(1.2, abs=1e-9)
        assert cards_energy(store, [A], S, E).source == COUNTER
        assert cards_energy(store, [B], S, E).source == SAMPLED
        half = booking(2, "bob", (A,), start=S + BUCKET_S // 2, end=S + BUCKET_S)  # half of one bucket at 300 W
        assert booking_energy(store, half, 0, now).joules == pytest.approx(300 * 150)

    def test_a_booking_half_rolled_up_is_neither_counted_twice_nor_lost(self, store):
        """Its first hour in rollups, its second still raw (as the report reads them). Wrong versions: both read for
        the first hour (1.8 kWh), or the raw samples skipped where rollups end (0.6)."""
        record(store, {A: True, B: False})
        store.roll_up(S + 3600)
        assert store.rolled_to() == S + 3600
        assert booking_energy(store, booking(1, "alice", (A, B)), S, E).kwh == pytest.approx(1.2, abs=1e-9)

    def test_the_rollups_keep_the_counters_mean_power_not_the_samples(self, store):
        """The card drew 400 W between samples that read 300 W: the counter knows, and so do the rollups. Wrong
        version: the bucket's power mean from its samples (0.6 kWh after the roll-up, 0.8 before)."""
        record(store, {A: True}, counter_at=lambda uuid, ts, mj: 5_000_000_000 + (mj - 5_000_000_000) * 4 // 3)
        assert cards_energy(store, [A], S, E).kwh == pytest.approx(0.8, abs=1e-6)
        now = E + 86400
        store.roll_up(now)
        store.prune(now, raw_hours=1, rollup_days=400)
        assert cards_energy(store, [A], S, E) == Energy(pytest.approx(0.8 * 3_600_000, abs=1), COUNTER)

    def test_a_file_from_before_energy_gains_it_and_reads_its_old_samples_by_power(self, tmp_path):
        """Schema 1 had no energy columns. Wrong versions: the old file refused, or its samples read as 0 J."""
        import sqlite3

        path = tmp_path / "old.history.db"
        old = HistoryStore(path)
        old.add([Sample(ts=S + i * STEP, uuid=A, state=BOOKED, dt=STEP, power=300) for i in range(4)])
        old.close()
        raw = sqlite3.connect(path)
        raw.execute("ALTER TABLE samples DROP COLUMN energy")
        raw.execute("ALTER TABLE cards DROP COLUMN counter")
        raw.execute("DROP TABLE energy_totals")
        raw.execute("UPDATE meta SET value = 1 WHERE key = 'schema'")
        raw.commit()
        raw.close()
        reopened = HistoryStore(path)
        assert cards_energy(reopened, [A], S, E) == Energy(pytest.approx(9000), SAMPLED)
        reopened.close()


class TestPerUserAndProject:
    def test_users_and_projects_sum_their_bookings_cards_only(self, store):
        """alice holds A for project ml, bob B for ml, carol C for web (500 W). Wrong versions: a user's energy from
        another's card, the projects summed by user, the report's projects shown without [[projects]]."""
        record(store, {A: True, B: False, C: True})
        bookings = [booking(1, "alice", (A,), project="ml"), booking(2, "bob", (B,), project="ml"),
                    booking(3, "carol", (C,), project="web")]
        by_user = energy_by(store, bookings, S, E, "user")
        assert {u: round(e.kwh, 6) for u, e in by_user.items()} == {"alice": 0.6, "bob": 0.6, "carol": 1.0}
        by_project = energy_by(store, bookings, S, E, "project")
        assert {p: round(e.kwh, 6) for p, e in by_project.items()} == {"ml": 1.2, "web": 1.0}
        assert by_project["ml"].source == SAMPLED and by_project["web"].source == COUNTER
        report = energy_report(store, bookings, S, E, projects=True)
        assert report["projects"] == [{"project": "ml", "kwh": 1.2, "source": SAMPLED},
                                      {"project": "web", "kwh": 1.0, "source": COUNTER}]
        assert report["users"][0] == {"user": "carol", "kwh": 1.0, "source": COUNTER}
        assert report["total"] == {"kwh": 2.2, "source": SAMPLED}
        assert "projects" not in energy_report(store, bookings, S, E, projects=False)

    def test_a_window_takes_the_part_of_a_booking_inside_it(self, store):
        """Wrong version: the whole booking billed to a window that holds its first hour only."""
        record(store, {A: True})
        assert energy_by(store, [booking(1, "alice", (A,))], S - 3600, S + 3600, "booking")["1"].kwh == \
            pytest.approx(0.3, abs=1e-9)


class TestSources:
    def test_nvml_reads_the_counter_and_a_card_without_it_reads_none(self, monkeypatch):
        """Wrong versions: the counter not read; NotSupported failing the whole card instead of that field."""
        from app.gpu.nvml import NvmlSource

        fake = FakePynvml([FakeGpu(uuid=A, energy_mj=123_456_789), FakeGpu(uuid=B)])
        fake.gpus[1].errors["nvmlDeviceGetTotalEnergyConsumption"] = fake.NVMLError_NotSupported
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        source = NvmlSource(clock=lambda: float(S))
        try:
            first, second = source.read().cards
        finally:
            source.close()
        assert first.energy_mj == 123_456_789
        assert second.energy_mj is None and second.power_w == 30.0  # the rest of the card still read

    def test_nvml_counter_and_not_supported_end_as_counter_and_sampled_energy(self, monkeypatch, store):
        """Through the sampler's rows: card A's counter (300 W), card B NotSupported (its 300 W power sampled)."""
        from app.gpu.nvml import NvmlSource

        clock = [float(S - STEP)]
        fake = FakePynvml([FakeGpu(uuid=A, power_mw=300_000, energy_mj=0), FakeGpu(uuid=B, power_mw=300_000)])
        fake.gpus[1].errors["nvmlDeviceGetTotalEnergyConsumption"] = fake.NVMLError_NotSupported
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        source = NvmlSource(clock=lambda: clock[0])
        config = Config(history=HistorySettings(sample_s=STEP))
        try:
            while clock[0] < E:
                store.add(sample_fleet([], config, source.read(), clock[0]))
                clock[0] += STEP
                fake.gpus[0].energy_mj += 3_000_000
        finally:
            source.close()
        assert cards_energy(store, [A], S, E) == Energy(pytest.approx(2_160_000), COUNTER)
        assert cards_energy(store, [B], S, E) == Energy(pytest.approx(2_160_000), SAMPLED)

    def test_the_simulated_fleet_integrates_its_own_power_into_a_counter(self):
        """Wrong versions: the counter in J (not mJ), a rectangle of the last power instead of the trapezoid, a
        counter that restarts at each read; and the scenario's `energy` field error blanks it."""
        from dataclasses import replace

        clock = [float(S)]
        source = SimulatedSource(replace(DEFAULT_FLEET, field_errors=frozenset({(1, "energy")})),
                                 clock=lambda: clock[0])
        first = source.read().cards
        clock[0] += 10
        second = source.read().cards
        assert first[0].energy_mj == 0
        expected = (first[0].power_w + second[0].power_w) / 2 * 10 * 1000
        assert second[0].energy_mj == pytest.approx(expected, abs=1)
        assert first[1].energy_mj is None and second[1].energy_mj is None

    def test_the_sampler_adds_each_holders_energy_to_the_totals(self, tmp_path):
        """The sampler on the simulated fleet: alice's booking of card 0 for project ml; the totals (what /metrics
        exports) are her card's energy, in J, under (ml, alice). Wrong versions: a free card's energy billed to
        someone, the project label dropped, mJ exported as J."""
        from app.client.local import LocalClient
        from app.core.identity import Identity
        from app.gpu.simulated import demo_uid

        clock = [float(S)]
        config = Config(db_path=tmp_path / "board.db", refresh_seconds=0, history=HistorySettings(sample_s=STEP))
        client = LocalClient.on(config, SimulatedSource(DEFAULT_FLEET, clock=lambda: clock[0]),
                                Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
        try:
            client.call("book", cards=[0], start=S, end=E)
            service = client.service
            client.service.conn.execute("UPDATE bookings SET project = 'ml'")
            sampler = Sampler(service.fleet, service.history, config, service.clock)
            for _ in range(40):
                sampler.sample_once()
                clock[0] += STEP
            store = service.history
            uuid = service.fleet.latest().cards[0].uuid
            totals = store.energy_totals()
            assert set(totals) == {("ml", "alice")}
            # The samples keep whole J: within half a J a sample.
            assert totals[("ml", "alice")] == pytest.approx(cards_energy(store, [uuid], S, E).joules, abs=20)
            assert 15 * 39 * STEP < totals[("ml", "alice")] < 600 * 39 * STEP  # J: between idle and the limit
        finally:
            client.close()


class TestReport:
    def test_board_report_carries_each_users_kwh_from_the_sampled_simulated_fleet(self, tmp_path):
        """The report operation on a service whose sampler recorded alice's two booked cards (their counters) while
        bob held none: her kWh, its source and the total; the table says it. Wrong versions: free cards' energy
        in the total, the report's window ignored (the booking's whole day), projects listed without [[projects]]."""
        from app.client.local import LocalClient
        from app.core.identity import Identity
        from app.gpu.simulated import demo_uid
        from app.report.render import table

        clock = [float(S)]
        config = Config(db_path=tmp_path / "board.db", refresh_seconds=0, history=HistorySettings(sample_s=STEP))
        client = LocalClient.on(config, SimulatedSource(DEFAULT_FLEET, clock=lambda: clock[0]),
                                Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
        try:
            client.call("book", cards=[0, 1], start=S, end=S + 86400)
            service = client.service
            sampler = Sampler(service.fleet, service.history, config, service.clock)
            for _ in range(360 * 2):  # two hours
                sampler.sample_once()
                clock[0] += STEP
            uuids = [c.uuid for c in service.fleet.latest().cards]
            expected = cards_energy(service.history, uuids[:2], clock[0] - 3600, clock[0])
            doc = client.call("report", since_s=3600, by="user")
        finally:
            client.close()
        assert expected.source == COUNTER and 0 < expected.kwh < 2 * 0.6  # under two cards at their 575 W limit
        assert doc["energy"] == {"users": [{"user": "alice", **expected.to_wire()}], "total": expected.to_wire()}
        assert f"user alice: {expected.kwh:.3f} kWh (counter)" in table(doc)

    def test_board_usage_by_project_and_by_user_carries_kwh_and_by_key_none(self, tmp_path):
        """alice books card 0 for project ml, bob card 1 for web; the sampler records them. Wrong versions: a
        project's kWh from the other's card, usage's window ignored, energy by key (it is a booking's, not a key's)."""
        from app.client.local import LocalClient
        from app.config import Project
        from app.core.identity import Identity
        from app.gpu.simulated import demo_uid

        clock = [float(S)]
        config = Config(db_path=tmp_path / "board.db", refresh_seconds=0, history=HistorySettings(sample_s=STEP),
                        projects=(Project("ml", ("alice",)), Project("web", ("bob",))))
        source = SimulatedSource(DEFAULT_FLEET, clock=lambda: clock[0])
        alice = LocalClient.on(config, source, Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
        try:
            service = alice.service
            alice.call("book", cards=[0], start=S, end=S + 86400)
            service.call(Identity("bob", demo_uid("bob"), False), "book",
                         {"cards": [1], "start": S, "end": S + 86400})
            sampler = Sampler(service.fleet, service.history, config, service.clock)
            for _ in range(120):
                sampler.sample_once()
                clock[0] += STEP
            uuids = [c.uuid for c in service.fleet.latest().cards]
            since = S + 600  # the last 10 minutes of the 20
            mine = {p: cards_energy(service.history, [uuids[i]], since, clock[0]) for i, p in ((0, "ml"), (1, "web"))}
            by_project = alice.call("usage", since=since, by="project")
            by_user = alice.call("usage", since=since, by="user")
            by_key = alice.call("usage", since=since, by="key")
        finally:
            alice.close()
        assert sorted(by_project["energy"], key=lambda e: e["project"]) == [
            {"project": p, **mine[p].to_wire()} for p in ("ml", "web")]
        assert {e["user"]: e["kwh"] for e in by_user["energy"]} == {"alice": mine["ml"].to_wire()["kwh"],
                                                                     "bob": mine["web"].to_wire()["kwh"]}
        assert "energy" not in by_key
