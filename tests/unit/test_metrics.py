"""/metrics in process: the service on a real database file and the simulated fleet, scraped over real HTTP.

The real agent, promtool and a real Prometheus server are in tests/service/test_metrics_prometheus.py.
"""

from __future__ import annotations

import select
import socket
import sqlite3
import threading
import time
import urllib.error
import urllib.request

import pytest
from msgspec import structs
from prometheus_client.parser import text_string_to_metric_families

from app.config import Config, ConfigError, HistorySettings, MetricsSettings, Pool, PowerSettings, load_config
from app.core.identity import Identity
from app.errors import BoardError, Conflict, NotPermitted
from app.gpu import open_source
from app.service import Service
from app.gpu.fleet import Fleet
from app.gpu.model import PCIE_LANE_MIB_S
from app.service.box import metrics as metrics_module
from app.service.box.metrics import MAX_SCRAPES, MetricsServer
from tests.conftest import Clock, FROZEN_NOW

H = 3600
ALICE, BOB = Identity("alice", 1001, False), Identity("bob", 1002, False)
CARD_LABELS = {"uuid", "index", "name", "pool", "holder", "class", "booking_id"}
LINK_HELP = ("PCIe traffic, the busier of TX and RX, as a share of the link's capacity (0 to 1): a TP group's link share"
             " (docs/health.md).")
WAIT_HELP = ("How long the bookings that have started waited: their start less the start their holders asked for"
             " (0 for a booking that got it).")




@pytest.fixture(autouse=True)
def _quick_stop(monkeypatch):
    """The accepting thread looks for close()'s stop every 10 ms, not socketserver's 0.5 s: each test's close waited
    that long (half this file's time, and of each metrics mutant's run of it)."""
    serve_forever = metrics_module._Server.serve_forever
    monkeypatch.setattr(metrics_module._Server, "serve_forever", lambda self, poll_interval=0.5: serve_forever(self, 0.01))


@pytest.fixture
def service(tmp_path, store):
    config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None),
                    metrics=MetricsSettings("127.0.0.1:0"),
                    pools=(Pool("prod", (0, 1, 2, 3)), Pool("lab", (4, 5, 6, 7)), Pool("night", (3, 7))))
    clock = Clock(FROZEN_NOW)
    made = Service(config, Fleet(open_source(True, clock=clock), 1.0, clock=lambda: 0.0), clock=clock)
    made.conn.execute("SELECT 1")  # the service creates the database, as the agent does before it serves
    yield made
    made.close()


@pytest.fixture
def metrics(service):
    logged: list[str] = []
    server = MetricsServer(service, logged.append)
    server.collector.clock = lambda: 0.0  # the view never ages: only a change to the bookings makes it read again
    server.logged = logged
    yield server
    server.close()


def scrape(server: MetricsServer) -> dict[str, list]:
    """The exposition over HTTP, parsed by prometheus_client's own parser: family name -> samples."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {family.name: family.samples for family in text_string_to_metric_families(text)}


def card(samples, index: int, **labels) -> list:
    return [s for s in samples if s.labels["index"] == str(index) and all(s.labels[k] == v for k, v in labels.items())]


def value(samples, **labels) -> float | None:
    found = [s.value for s in samples if all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(found) <= 1, found
    return found[0] if found else None


class TestCards:
    def test_each_card_has_its_gauges_from_the_fleet_snapshot(self, service, metrics):
        got = scrape(metrics)
        snapshot = service.fleet.latest()
        for reading in snapshot.cards:
            used = card(got["board_gpu_memory_used_bytes"], reading.index)
            assert len(used) == 1 and set(used[0].labels) == CARD_LABELS
            assert used[0].labels["uuid"] == reading.uuid and used[0].labels["name"] == "NVIDIA GeForce RTX 5090"
            assert used[0].value == reading.memory_used_mib * 1024 * 1024
            assert card(got["board_gpu_memory_total_bytes"], reading.index)[0].value == 32607 * 1024 * 1024
            utilization = card(got["board_gpu_utilization_ratio"], reading.index)[0].value
            assert utilization == pytest.approx(reading.utilization_pct / 100)
            assert card(got["board_gpu_temperature_celsius"], reading.index)[0].value == reading.temperature_c
            assert card(got["board_gpu_power_watts"], reading.index)[0].value == reading.power_w
            assert card(got["board_gpu_power_limit_watts"], reading.index)[0].value == 575.0
        assert {s.labels["pool"] for s in card(got["board_gpu_temperature_celsius"], 2)} == {"prod"}
        assert {s.labels["pool"] for s in card(got["board_gpu_temperature_celsius"], 6)} == {"lab"}
        assert {s.labels["pool"] for s in card(got["board_gpu_temperature_celsius"], 7)} == {"lab,night"}
        assert got["board_fleet_read_timestamp_seconds"][0].value == snapshot.taken_at

    def test_the_holder_class_and_booking_label_the_card_they_hold(self, service, metrics):
        booked = service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3], "class": "batch"})
        got = scrape(metrics)
        held = card(got["board_gpu_temperature_celsius"], 3)
        assert [(s.labels["holder"], s.labels["class"], s.labels["booking_id"]) for s in held] == [
            ("alice", "batch", str(booked["id"]))]
        free = card(got["board_gpu_temperature_celsius"], 4)
        assert [(s.labels["holder"], s.labels["class"], s.labels["booking_id"]) for s in free] == [("", "", "")]

    def test_the_state_is_one_series_per_state_one_of_them_1(self, service, metrics):
        service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3]})
        got = scrape(metrics)["board_gpu_state"]
        # The default simulated fleet: 3 booked by alice with nothing on it, 4 free, 0 bob's processes unbooked.
        for index, state in ((3, "booked"), (4, "free"), (0, "squatted")):
            series = {s.labels["state"]: s.value for s in card(got, index)}
            assert series == {name: float(name == state) for name in ("free", "booked", "in_use", "squatted", "lost")}

    def test_a_lost_card_reports_its_state_and_no_made_up_values(self, service, metrics):
        snapshot = service.fleet.latest()
        lost = structs.replace(snapshot.cards[5], lost=True)
        service.fleet._latest = structs.replace(snapshot, cards=(*snapshot.cards[:5], lost, *snapshot.cards[6:]))
        got = scrape(metrics)
        assert value(card(got["board_gpu_state"], 5), state="lost") == 1.0
        assert card(got["board_gpu_memory_used_bytes"], 5) == [] and len(got["board_gpu_memory_used_bytes"]) == 7

    def test_the_sm_clock_when_the_readings_carry_it(self, service, metrics):
        snapshot = service.fleet.latest()
        cards = tuple(structs.replace(c, sm_clock_mhz=2000 + c.index) for c in snapshot.cards)
        service.fleet._latest = structs.replace(snapshot, cards=cards)
        got = scrape(metrics)
        assert card(got["board_gpu_sm_clock_hertz"], 6)[0].value == 2006e6

    def test_the_power_policy_per_card_where_power_sets_one(self, service, metrics):
        """Nearest wrong: the limit itself exported as the policy, or [power.cards]' override ignored."""
        service.config = structs.replace(service.config, power=PowerSettings(limit_w=500.0, cards={2: 450.0}))
        got = scrape(metrics)
        policies = {int(s.labels["index"]): s.value for s in got["board_gpu_power_policy_watts"]}
        assert policies == {**{i: 500.0 for i in range(8)}, 2: 450.0}
        assert {s.value for s in got["board_gpu_power_limit_watts"]} == {575.0}

    def test_the_pcie_link_share_is_the_busier_direction_over_the_link_it_runs(self, service, metrics):
        """Nearest wrong: TX and RX added, the quieter one, or an idle card's dropped generation taken as its link
        (a card idles at Gen 1: its share would look 16 times as large)."""
        snapshot = service.fleet.latest()
        busy = structs.replace(snapshot.cards[1], utilization_pct=80, pcie_gen=5, pcie_max_gen=5, pcie_width=16,
                               pcie_tx_mib_s=9000.0, pcie_rx_mib_s=12000.0)
        idle = structs.replace(snapshot.cards[2], utilization_pct=0, pcie_gen=1, pcie_max_gen=5, pcie_width=16,
                               pcie_tx_mib_s=100.0, pcie_rx_mib_s=50.0)
        service.fleet._latest = structs.replace(snapshot, cards=(snapshot.cards[0], busy, idle, *snapshot.cards[3:]))
        got = scrape(metrics)["board_gpu_pcie_link_utilization_ratio"]
        gen5 = PCIE_LANE_MIB_S[5] * 16
        assert card(got, 1)[0].value == pytest.approx(12000 / gen5)
        assert card(got, 2)[0].value == pytest.approx(100 / gen5)


class TestCounters:
    def test_created_and_refused_by_reason_and_backfill_moves(self, service, metrics):
        first = service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3]})
        with pytest.raises(Conflict):
            service.call(BOB, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3]})
        with pytest.raises(NotPermitted):
            service.call(BOB, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + 100 * H, "cards": [4]})
        queued = service.call(BOB, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3], "or_later": True,
                                            "class": "batch"})
        got = scrape(metrics)
        assert {s.labels["class"]: s.value for s in got["board_bookings_created"]} == {"experiment": 1, "batch": 1}
        assert {s.labels["reason"]: s.value for s in got["board_bookings_refused"]} == {"conflict": 1, "policy": 1}
        assert got["board_backfill_moves"][0].value == 0 and got["board_bookings_queued"][0].value == 1
        assert queued["start"] == FROZEN_NOW + H

        service.call(ALICE, "release", {"id": first["id"]})  # bob's queued booking moves up to now
        got = scrape(metrics)
        assert got["board_backfill_moves"][0].value == 1 and got["board_bookings_queued"][0].value == 0
        assert value(card(got["board_gpu_state"], 3), state="booked", holder="bob") == 1.0

    def test_a_refused_series_and_a_refused_extension_count_as_refused_requests(self, service, metrics):
        """An extension asks for bookings as a series does: refused, it counts by its reason, as `series` does."""
        week = {"cards": [5], "every": "day", "start": "9:00", "until": "10:00", "from": "2026-12-01"}
        with pytest.raises(NotPermitted):  # past max_ahead_days
            service.call(ALICE, "series_book", {**week, "to": "2027-01-15"})
        assert {s.labels["reason"]: s.value for s in scrape(metrics)["board_bookings_refused"]} == {"policy": 1}
        made = service.call(ALICE, "series_book", {**week, "to": "2026-12-03"})
        taken = service.call(BOB, "book", {"start": made["bookings"][0]["start"] + 3 * 24 * H,
                                           "end": made["bookings"][0]["start"] + 3 * 24 * H + H, "cards": [5]})
        with pytest.raises(Conflict, match=f"booking {taken['id']}"):
            service.call(ALICE, "series_extend", {"id": made["series"]["id"], "to": "2026-12-05"})
        with pytest.raises(NotPermitted):
            service.call(ALICE, "series_extend", {"id": made["series"]["id"], "to": "2027-01-15"})
        metrics.collector.clock = lambda: 60.0  # a refusal changes no booking: the view is read again once it is old
        got = scrape(metrics)
        assert {s.labels["reason"]: s.value for s in got["board_bookings_refused"]} == {"conflict": 1, "policy": 2}
        assert value(got["board_bookings_created"], **{"class": "experiment"}) == 4  # three days and bob's hour

    def test_the_wait_summary_counts_the_bookings_that_started_and_their_waits(self, service, metrics):
        """alice gets her hour at once (0 s), bob asks for the rest of it from 10 min on and gets it after hers: he has
        waited 50 min once his booking starts, not before. Nearest wrong: a booking counted before it starts, a cancelled one
        counted, the wait taken from the booking's creation instead of the start its holder asked for."""
        service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [3]})
        service.call(BOB, "book", {"start": FROZEN_NOW + 600, "end": FROZEN_NOW + H, "cards": [3], "or_later": True})
        gone = service.call(BOB, "book", {"start": FROZEN_NOW + 30, "end": FROZEN_NOW + H, "cards": [4]})
        service.call(BOB, "cancel", {"id": gone["id"]})

        def waits() -> tuple[float, float]:
            got = {sample.name: sample.value for sample in scrape(metrics)["board_booking_wait_seconds"]}
            return got["board_booking_wait_seconds_count"], got["board_booking_wait_seconds_sum"]

        assert waits() == (1, 0)
        service.clock.now = FROZEN_NOW + H + 5  # bob's booking has started, 50 min after the start he asked for
        metrics.collector.clock = lambda: 60.0  # the view read again: only the time moved
        assert waits() == (2, H - 600)

    def test_or_later_at_a_free_time_is_not_counted_as_queued(self, service, metrics):
        taken = service.call(BOB, "book", {"start": FROZEN_NOW + H, "end": FROZEN_NOW + 2 * H, "cards": [3],
                                           "or_later": True})
        assert (taken["start"], taken["queued"]) == (FROZEN_NOW + H, None)
        assert scrape(metrics)["board_bookings_queued"][0].value == 0

    def test_counting_goes_on_from_where_it_was_and_a_restart_gives_the_same_totals(self, service, metrics):
        for hour in range(3):
            service.call(ALICE, "book", {"start": FROZEN_NOW + hour * H, "end": FROZEN_NOW + (hour + 1) * H, "cards": [1]})
        assert value(scrape(metrics)["board_bookings_created"], **{"class": "experiment"}) == 3
        service.call(ALICE, "book", {"start": FROZEN_NOW + 5 * H, "end": FROZEN_NOW + 6 * H, "cards": [1]})
        assert value(scrape(metrics)["board_bookings_created"], **{"class": "experiment"}) == 4

        restarted = MetricsServer(service, print)  # as a new process would: the whole log read once
        try:
            assert value(scrape(restarted)["board_bookings_created"], **{"class": "experiment"}) == 4
        finally:
            restarted.close()

    def test_refusals_audited_before_the_category_count_as_unknown(self, service, metrics):
        from app.store import events
        from app.store.db import write

        with write(service.conn):
            events.record(service.conn, ts=FROZEN_NOW, uid=1001, actor="alice", action="create", booking_id=None,
                          ok=False, details={"refused": "an old refusal"})
        assert {s.labels["reason"]: s.value for s in scrape(metrics)["board_bookings_refused"]} == {"unknown": 1}

    def test_server_crashes_are_counted_from_their_audit_events(self, service, metrics):
        from app.store import events
        from app.store.db import write

        assert scrape(metrics)["board_server_crashes"][0].value == 0
        with write(service.conn):
            for server_id in (1, 2):
                events.record(service.conn, ts=FROZEN_NOW, uid=0, actor="board", action="server-crash", booking_id=None,
                              ok=True, details={"server": server_id})
        metrics.collector.clock = lambda: 60.0  # no booking changed: the view is read again once it is old
        assert scrape(metrics)["board_server_crashes"][0].value == 2

    def test_alerts_fired_are_counted_by_rule(self, service, metrics):
        from app.alerts.engine import Engine
        from app.alerts.rules import Card, Inputs
        from app.service.box.alerts import alerts_pass

        assert scrape(metrics)["board_alerts"] == []
        service.config = structs.replace(service.config, alerts=structs.replace(service.config.alerts, fire_after_s=0))  # at once
        engine, hot, cool = Engine(), Card(7, "GPU-7", "FREE", temp_c=95), Card(7, "GPU-7", "FREE", temp_c=50)
        for cards in ((hot, Card(3, "GPU-3", "LOST")), (cool,), (hot,)):  # hot fires twice, lost once
            alerts_pass(service, engine, Inputs(FROZEN_NOW, cards=cards))
        metrics.collector.clock = lambda: 60.0
        assert {s.labels["rule"]: s.value for s in scrape(metrics)["board_alerts"]} == {"hot": 2, "lost": 1}

    def test_xid_errors_by_code_and_oom_exits_are_counted_from_the_faults(self, service, metrics):
        from app.faults import store as faults
        from app.store.db import write

        assert scrape(metrics)["board_xid_errors"] == [] and scrape(metrics)["board_oom"][0].value == 0
        with write(service.conn):
            for kind, code in (("xid", 79), ("xid", 79), ("xid", 48), ("oom", None), ("throttle", None)):
                faults.record(service.conn, ts=FROZEN_NOW, kind=kind, code=code, card_uuid="GPU-0")
        metrics.collector.clock = lambda: 60.0
        found = scrape(metrics)
        assert {s.labels["code"]: s.value for s in found["board_xid_errors"]} == {"79": 2, "48": 1}
        assert found["board_oom"][0].value == 1

    def test_notify_failures_come_from_the_delivery_thread_where_one_runs(self, service, metrics):
        from types import SimpleNamespace

        assert "board_notify_failures" not in scrape(metrics)  # nobody delivers in process
        service.notifier = SimpleNamespace(counts={"sent": 4, "failed_tries": 3, "given_up": 1})
        found = {s.labels["outcome"]: s.value for s in scrape(metrics)["board_notify_failures"]}
        assert found == {"failed_try": 3, "given_up": 1}

    def test_energy_is_a_counter_in_joules_by_project_and_user_from_the_history(self, service, metrics):
        """The sampler's totals (app.history.store energy_totals), parsed as Prometheus reads them. Wrong versions: mJ
        exported as J (x1000), kWh (/3.6e6), a label missing or swapped, a free card's energy billed to someone."""
        from app.core.cardstate import BOOKED, FREE
        from app.history.store import HistoryStore, Sample

        history = HistoryStore(service.config.history_path)
        t = FROZEN_NOW
        for ts, energy_mj in ((t, 0), (t + 10, 3_000_000), (t + 20, 6_000_000)):
            history.add([Sample(ts, "GPU-x", BOOKED, 10, power=300, energy_mj=energy_mj, booking=1, holder="alice",
                                project="ml"),
                         Sample(ts, "GPU-y", BOOKED, 10, power=200, booking=2, holder="bob", project=""),
                         Sample(ts, "GPU-z", FREE, 10, power=500, energy_mj=energy_mj)])
        history.close()
        metrics.collector.clock = lambda: 60.0  # the view read again
        lines = [line for line in exposition(metrics) if line.startswith("board_energy_joules")]
        assert lines == ['board_energy_joules_total{project="",user="bob"} 4000.0',
                         'board_energy_joules_total{project="ml",user="alice"} 6000.0']
        found = scrape(metrics)["board_energy_joules"]  # prometheus_client's parser: a counter's family
        assert {(s.name, s.labels["project"], s.labels["user"], s.value) for s in found} == {
            ("board_energy_joules_total", "ml", "alice", 6000.0), ("board_energy_joules_total", "", "bob", 4000.0)}

    def test_no_energy_counter_without_the_history(self, tmp_path, store):
        """[history] off: no sampler counts energy, so no family (not zeros)."""
        config = Config(db_path=tmp_path / "board.db", storage_url=getattr(store, "url", None),
                        metrics=MetricsSettings("127.0.0.1:0"), history=HistorySettings(enabled=False))
        clock = Clock(FROZEN_NOW)
        made = Service(config, Fleet(open_source(True, clock=clock), 1.0, clock=lambda: 0.0), clock=clock)
        made.conn.execute("SELECT 1")
        server = MetricsServer(made, lambda line: None)
        try:
            assert "board_energy_joules" not in scrape(server)
        finally:
            server.close()
            made.close()


def exposition(server: MetricsServer) -> list[str]:
    """The exposition's board_ lines as Prometheus reads them (the process_ families are the library's)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{server.port}/metrics", timeout=10) as response:
        return [line for line in response.read().decode().splitlines() if "board_" in line]


class TestExposition:
    def test_every_family_has_its_help_and_type_in_order(self, service, metrics):
        from types import SimpleNamespace

        service.notifier = SimpleNamespace(counts={"failed_tries": 0, "given_up": 0})
        gauges = (("gpu_memory_used_bytes", "VRAM in use."), ("gpu_memory_total_bytes", "VRAM on the card."),
                  ("gpu_utilization_ratio", "GPU utilisation, 0 to 1, over NVML's last sample period."),
                  ("gpu_temperature_celsius", "GPU temperature."), ("gpu_power_watts", "Power draw."),
                  ("gpu_power_limit_watts", "Power limit."),
                  ("gpu_state", "The card's state: 1 for the state it is in, 0 for the others."),
                  ("fleet_read_timestamp_seconds", "When the GPUs were last read (Unix time)."),
                  ("bookings_queued", "Bookings waiting in the queue to move earlier."))
        counters = (
            ("bookings_created", "Bookings created (each occurrence of a series counts), by class."),
            ("bookings_refused", "Booking requests refused, by reason: conflict (the time is taken) or policy (a rule)."),
            ("backfill_moves", "Queued bookings moved earlier by the backfill."),
            ("server_crashes", "llama-servers that exited without being stopped."),
            ("idle_releases", "Bookings given back for being idle ([policy] idle_release_after_min)."),
            ("alerts", "Alerts fired (app.alerts), by rule."),
            ("xid_errors", "Critical Xid errors NVML reported (app.faults), by code."),
            ("oom", "Out-of-memory exits: llama-servers and board run jobs (app.faults)."),
            ("energy_joules", "Energy the cards drew while bookings held them, by project ('' without [[projects]])"
                              " and holder: NVML's energy counter where the card has one, else the power samples."),
            ("notify_failures", "Pushes that failed: each failed try, and the messages given up after the last try."))
        snapshot = service.fleet.latest()
        clocked = tuple(structs.replace(c, sm_clock_mhz=2000) for c in snapshot.cards)
        service.fleet._latest = structs.replace(snapshot, cards=clocked)
        found = [line for line in exposition(metrics) if line.startswith("#")]
        expected = []
        for name, text in gauges:
            expected += [f"# HELP board_{name} {text}", f"# TYPE board_{name} gauge"]
            if name == "gpu_power_limit_watts":  # the SM clock comes after the power limit
                expected += ["# HELP board_gpu_sm_clock_hertz SM clock.", "# TYPE board_gpu_sm_clock_hertz gauge"]
                expected += [f"# HELP board_gpu_pcie_link_utilization_ratio {LINK_HELP}",
                             "# TYPE board_gpu_pcie_link_utilization_ratio gauge"]
            if name == "bookings_queued":
                expected += [f"# HELP board_booking_wait_seconds {WAIT_HELP}", "# TYPE board_booking_wait_seconds summary"]
        for name, text in counters:
            expected += [f"# HELP board_{name}_total {text}", f"# TYPE board_{name}_total counter"]
        assert found == expected
        assert {"process_resident_memory_bytes", "process_open_fds"} <= set(scrape(metrics))  # the service's own

    def test_a_card_with_no_name_no_pool_and_missing_readings_exports_what_it_has(self, service, metrics):
        """Empty labels rather than made-up ones; a reading NVML did not give is no sample, the others are."""
        service.config = structs.replace(service.config, pools=(Pool("prod", (0, 1, 2, 3)),))  # card 5 in no pool
        snapshot = service.fleet.latest()
        bare = structs.replace(snapshot.cards[5], name=None, utilization_pct=None, sm_clock_mhz=None)
        service.fleet._latest = structs.replace(snapshot, cards=(*snapshot.cards[:5], bare, *snapshot.cards[6:]))
        five = f'{{booking_id="",class="",holder="",index="5",name="",pool="",uuid="{bare.uuid}"}}'
        lines = exposition(metrics)
        samples = [(line.split(" ")[0], float(line.split(" ")[1])) for line in lines if 'index="5"' in line]
        assert [(series, number) for series, number in samples if not series.startswith("board_gpu_state")] == [
            (f"board_gpu_memory_used_bytes{five}", bare.memory_used_mib * 1024 * 1024),
            (f"board_gpu_memory_total_bytes{five}", bare.memory_total_mib * 1024 * 1024),
            (f"board_gpu_temperature_celsius{five}", bare.temperature_c),
            (f"board_gpu_power_watts{five}", bare.power_w),
            (f"board_gpu_power_limit_watts{five}", bare.power_limit_w),
            # An unknown utilisation: the link is taken at its maximum generation, as for an idle card.
            (f"board_gpu_pcie_link_utilization_ratio{five}",
             max(bare.pcie_tx_mib_s, bare.pcie_rx_mib_s) / (PCIE_LANE_MIB_S[bare.pcie_max_gen] * bare.pcie_width))]
        other = f'pool="prod",uuid="{snapshot.cards[0].uuid}"'  # another card keeps its utilisation
        assert sum(line.startswith("board_gpu_utilization_ratio{") and other in line for line in lines) == 1

    def test_text_that_is_not_utf8_in_the_database_is_shown_replaced_not_a_failed_scrape(self, service, metrics):
        """Another writer (a restored backup, a hand edit) may leave bytes that are not UTF-8: one card's label
        shows U+FFFD, and the scrape answers as the service's own connection reads it."""
        if service.config.storage_url:
            pytest.skip("PostgreSQL stores only valid UTF-8")
        from app.store.db import write

        booked = service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [4]})
        with write(service.conn):
            service.conn.execute("UPDATE bookings SET user = CAST(x'616cff' AS TEXT) WHERE id = ?", (booked["id"],))
        held = card(scrape(metrics)["board_gpu_state"], 4, state="booked")
        assert [(s.labels["holder"], s.value) for s in held] == [("al\ufffd", 1.0)]


class TestScraping:
    def test_many_scrapers_share_one_gpu_read_and_one_database_read_and_write_nothing(self, service, metrics):
        watcher = sqlite3.connect(service.config.db_path)
        version = watcher.execute("PRAGMA data_version").fetchone()[0]
        reads = service.fleet.reads
        results: list[int] = []

        def scraper():
            for _ in range(10):
                results.append(len(scrape(metrics)["board_gpu_state"]))

        threads = [threading.Thread(target=scraper) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert results == [40] * 80
        assert service.fleet.reads - reads <= 1 and metrics.collector.reads == 1
        assert watcher.execute("PRAGMA data_version").fetchone()[0] == version  # no commit by anyone else
        watcher.close()

    def test_a_change_to_the_bookings_is_seen_at_the_next_scrape(self, service, metrics):
        scrape(metrics)
        service.call(ALICE, "book", {"start": FROZEN_NOW, "end": FROZEN_NOW + H, "cards": [4]})
        assert value(card(scrape(metrics)["board_gpu_state"], 4), state="booked", holder="alice") == 1.0
        assert metrics.collector.reads == 2

    def test_the_counters_are_read_again_when_the_view_is_ttl_old_and_not_before(self, service, metrics):
        """A crash changes no booking: it shows once the view is VIEW_TTL_S old (5 s), and not a moment sooner."""
        from app.store import events
        from app.store.db import write

        now = [100.0]
        metrics.collector.clock = lambda: now[0]
        assert scrape(metrics)["board_server_crashes"][0].value == 0  # read at 100
        with write(service.conn):
            events.record(service.conn, ts=FROZEN_NOW, uid=0, actor="board", action="server-crash", booking_id=None,
                          ok=True, details={"server": 1})
        now[0] = 104.5
        assert scrape(metrics)["board_server_crashes"][0].value == 0 and metrics.collector.reads == 1
        now[0] = 105.0
        assert scrape(metrics)["board_server_crashes"][0].value == 1 and metrics.collector.reads == 2

    def test_a_booking_takes_its_card_when_it_starts_and_leaves_it_when_it_ends(self, service, metrics):
        later = service.call(ALICE, "book", {"start": FROZEN_NOW + 60, "end": FROZEN_NOW + 120, "cards": [4]})
        assert value(card(scrape(metrics)["board_gpu_state"], 4), state="free") == 1.0
        reads = metrics.collector.reads
        service.clock.now = FROZEN_NOW + 60  # nothing changed but the time, and the view is not read again
        held = card(scrape(metrics)["board_gpu_state"], 4)
        assert value(held, state="booked", holder="alice", booking_id=str(later["id"])) == 1.0
        assert metrics.collector.reads == reads
        service.clock.now = FROZEN_NOW + 120
        assert value(card(scrape(metrics)["board_gpu_state"], 4), state="free", holder="") == 1.0

    def test_a_database_it_cannot_read_is_a_503_and_one_line_in_the_log(self, service, tmp_path):
        gone = structs.replace(service.config, db_path=tmp_path / "missing" / "board.db")
        said = f"/metrics: no access to the board database {gone.db_path}: "  # SQLite's own error, told as for a user
        if service.config.storage_url:  # PostgreSQL: a database that does not answer
            gone = structs.replace(gone, storage_url="postgresql:///board?host=/nonexistent/board-test&user=postgres")
            said = "the board database is unreachable"
        broken = Service(gone, service.fleet, clock=service.clock)
        logged: list[str] = []
        server = MetricsServer(broken, logged.append)
        try:
            for _ in range(2):
                with pytest.raises(urllib.error.HTTPError) as error:
                    scrape(server)
                assert error.value.code == 503 and said in error.value.read().decode()
                assert (error.value.headers.get_content_type(), error.value.headers.get_content_charset()) == (
                    "text/plain", "utf-8")
        finally:
            server.close()
        assert len([line for line in logged if line.startswith("/metrics:")]) == 1
        assert "\n" not in logged[-1] and "Traceback" not in logged[-1]

    def test_a_port_in_use_is_one_line(self, service, metrics):
        taken = structs.replace(service.config, metrics=MetricsSettings(f"127.0.0.1:{metrics.port}"))
        with pytest.raises(BoardError, match=rf"^can't serve /metrics on 127.0.0.1:{metrics.port} \(Address already in use\);"
                                             r" free the port or change \[metrics\] listen$"):
            MetricsServer(Service(taken, service.fleet), print)

    def test_an_ipv6_listen_address_serves_over_ipv6(self, service):
        ipv6 = structs.replace(service.config, metrics=MetricsSettings("[::1]:0"))
        server = MetricsServer(Service(ipv6, service.fleet, clock=service.clock), print)
        try:
            with urllib.request.urlopen(f"http://[::1]:{server.port}/metrics", timeout=10) as response:
                assert response.status == 200 and b"board_gpu_state{" in response.read()
        finally:
            server.close()


def half_open(server: MetricsServer) -> socket.socket:
    """A scraper that sends its request line and never the end of its headers."""
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    sock.sendall(b"GET /metrics HTTP/1.1\r\n")
    return sock


def ended(sock: socket.socket, within_ms: int) -> bool:
    """The server closed it (EOF or a reset) without an answer, by `within_ms` from now."""
    poller = select.poll()
    poller.register(sock, select.POLLIN)
    if not poller.poll(within_ms):
        return False
    try:
        return sock.recv(100) == b""
    except ConnectionResetError:
        return True


def close_ended(socks: list[socket.socket], want: int, timeout_s: float) -> list[socket.socket]:
    """Close those the server closed without an answer until `want` have been (or timeout_s); the rest."""
    left, deadline = list(socks), time.monotonic() + timeout_s
    while len(socks) - len(left) < want and time.monotonic() < deadline:
        for sock in [sock for sock in left if ended(sock, 0)]:
            sock.close()
            left.remove(sock)
        time.sleep(0.05)
    return left


def workers(before: set[threading.Thread], want: int) -> None:
    """Wait until `want` /metrics workers ("board-metrics_N") have started since `before` (at most 10 s)."""
    deadline = time.monotonic() + 10
    while sum(t.name.startswith("board-metrics_") for t in set(threading.enumerate()) - before) < want:
        assert time.monotonic() < deadline, f"fewer than {want} /metrics workers started"
        time.sleep(0.01)


class TestBounded:
    """Anyone who reaches the port may connect: /metrics holds at most MAX_SCRAPES of them, each for one deadline.
    The cases that wait out a deadline (a crowd, a trickle) are tests/safety/test_metrics_scrapers.py's."""

    def test_one_past_max_scrapes_is_closed_at_once_while_the_others_wait_for_their_deadline(self, metrics, capfd):
        """Ordering, not timing: the one past the cap ends while all MAX_SCRAPES held ones are still open (each has
        REQUEST_TIMEOUT_S, 10 s); a server that queued it instead would end a held one first. Quietly: no traceback."""
        before = set(threading.enumerate())
        held = [half_open(metrics) for _ in range(MAX_SCRAPES)]
        workers(before, MAX_SCRAPES)  # each holds a worker of its own, and so a slot
        extra = half_open(metrics)
        assert ended(extra, 15_000)
        assert [sock for sock in held if ended(sock, 0)] == []
        for sock in (extra, *held):
            sock.close()
        assert capfd.readouterr().err == ""

    def test_closing_does_not_wait_for_a_scraper_that_holds_a_worker(self, metrics):
        """The service stops at once: a half-open scraper keeps its worker until its own deadline, not the stop's."""
        before = set(threading.enumerate())  # other tests' workers may still be waiting for their deadline
        slow = half_open(metrics)
        workers(before, 1)  # the accepting thread has handed it to a worker
        metrics.close()
        assert not ended(slow, 0)  # closed without waiting for it: its worker still holds it (REQUEST_TIMEOUT_S)
        slow.close()


class TestConfig:
    def test_off_unless_listen_is_set(self, tmp_path):
        path = tmp_path / "board.toml"
        path.write_text("[metrics]\n")
        assert load_config(environ={"BOARD_CONFIG": str(path)}).metrics.listen is None
        path.write_text('[metrics]\nlisten = "[::1]:9400"\n')
        assert load_config(environ={"BOARD_CONFIG": str(path)}).metrics.address == ("::1", 9400)

    @pytest.mark.parametrize("listen", ["9400", "127.0.0.1", "127.0.0.1:0", "127.0.0.1:70000", "127.0.0.1:http", ":9400",
                                        "127.0.0.1:94 00"])
    def test_a_bad_address_is_one_line(self, tmp_path, listen):
        path = tmp_path / "board.toml"
        path.write_text(f"[metrics]\nlisten = {listen!r}\n".replace("'", '"'))
        with pytest.raises(ConfigError, match=r"\[metrics\] listen is .*; give host:port, such as \"127.0.0.1:9400\"$"):
            load_config(environ={"BOARD_CONFIG": str(path)})

    def test_a_listen_that_is_not_a_string_is_named_by_its_type(self, tmp_path):
        path = tmp_path / "board.toml"
        path.write_text("[metrics]\nlisten = 9400\n")
        with pytest.raises(ConfigError, match=r"\[metrics\] listen: expected a string, got 9400$"):
            load_config(environ={"BOARD_CONFIG": str(path)})

    def test_an_unknown_key_is_named(self, tmp_path):
        path = tmp_path / "board.toml"
        path.write_text('[metrics]\nport = 9400\n')
        with pytest.raises(ConfigError, match="unknown key 'port' in \\[metrics\\]"):
            load_config(environ={"BOARD_CONFIG": str(path)})
