"""`board report` end to end: a real board.db and history file, the real CLI (table, --json, --csv, bad input),
and the op through the in-process service with the real sampler on the simulated fleet."""

from __future__ import annotations

import csv
import io
import json
import time
from dataclasses import replace

import pytest

from app.client.local import LocalClient
from app.config import Config, HistorySettings
from app.core.cardstate import BOOKED, IN_USE
from app.core.identity import Identity
from app.errors import BadInput
from app.gpu.simulated import DEFAULT_FLEET, SimulatedSource, demo_uid
from app.history.store import BUCKET_S, HistoryStore, Sample
from app.store import bookings as rows
from tests.conftest import FROZEN_NOW, run_board
from tests.unit.test_history_sampler import sampler_of

H = 3600
UUID = "GPU-5090sim-0000-0000-0000-{:012d}".format


@pytest.fixture
def files(tmp_path, conn, fleet, store):
    """alice booked card 0 from 5 h ago for 4 h (asked 30 min before): 2 h busy at 58 %, 2 h idle."""
    url = {"BOARD_DB_URL": store.url} if hasattr(store, "url") else {}  # PostgreSQL: the bookings are there
    now = int(time.time()) // BUCKET_S * BUCKET_S
    rows.sync_cards(conn, fleet.cards, now - 7 * H)
    rows.insert(conn, user="alice", uid=1001, uuids=[UUID(0)], start=now - 5 * H, end=now - H, klass="batch", note="",
                request=None, now=now - 6 * H, created_by=1001, requested_at=now - 5 * H - 1800)
    conn.commit()
    store = HistoryStore(tmp_path / "board.history.db")
    store.card_id(UUID(0), 0, "RTX 5090", 32607)
    for t in range(now - 5 * H, now - H, 300):
        store.add([Sample(ts=t, uuid=UUID(0), state=IN_USE if t < now - 3 * H else BOOKED, dt=300,
                          util=58 if t < now - 3 * H else 0)])
    store.roll_up(now)
    store.close()
    return {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": "1", "TZ": "UTC", **url}


def test_the_cli_json_table_and_csv(files):
    result = run_board("report", "--since", "1d", "--json", env=files)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert set(doc) == {"by", "since", "until", "days", "busy_util_pct", "rows", "total", "verdicts", "tokens", "tp",
                        "energy"}
    assert doc["tp"] == []  # one card: no TP group to measure
    (alice,) = doc["rows"]
    assert (alice["key"], alice["booked_h"], alice["used_h"], alice["idle_h"], alice["idle_pct"]) == \
        ("alice", 4.0, 2.0, 2.0, 50.0)
    assert (alice["util_mean_pct"], alice["wait_mean_min"], alice["wait_p90_min"]) == (29.0, 30.0, 30.0)
    assert [v["threshold"] for v in doc["verdicts"]] == ["utilisation_low", "utilisation_high", "wait", "vram",
                                                          "faults", "temperature"]
    low = doc["verdicts"][0]
    assert low["fires"] and low["message"].endswith("alice's bookings were idle 50 % of their hours")
    table = run_board("report", "--since", "1d", env=files)
    assert table.returncode == 0 and "alice" in table.stdout and "TOTAL" in table.stdout
    assert "!!  utilisation 29 % over 1 day (< 30 %)" in table.stdout
    assert "ok  mean wait 30 min over 1 booking (p90 30 min) over 1 day (not over 30 min)" in table.stdout
    found = list(csv.DictReader(io.StringIO(run_board("report", "--since", "1d", "--csv", "--by", "card",
                                                      env=files).stdout)))
    assert [(r["key"], r["booked_h"], r["used_h"]) for r in found] == [("0", "4.0", "2.0"), ("total", "4.0", "2.0")]



def test_without_since_the_report_covers_the_last_30_days_by_member(files, conn):
    """bob's booking 20 days ago is in the default window, carol's 31 days ago is not. Wrong versions: a week's window
    (bob left out); the whole history (carol counted); grouped by card."""
    now = int(time.time()) // BUCKET_S * BUCKET_S
    for user, uid, card, days in (("bob", 1002, 1, 20), ("carol", 1003, 2, 31)):
        start = now - days * 86400
        rows.insert(conn, user=user, uid=uid, uuids=[UUID(card)], start=start, end=start + 2 * H, klass="batch",
                    note="", request=None, now=start - H, created_by=uid, requested_at=start - H)
    conn.commit()
    result = run_board("report", "--json", env=files)
    assert result.returncode == 0, result.stderr
    doc = json.loads(result.stdout)
    assert (doc["by"], doc["days"], doc["until"] - doc["since"]) == ("user", 30, 30 * 86400)
    assert {r["key"]: r["booked_h"] for r in doc["rows"]} == {"alice": 4.0, "bob": 2.0}

@pytest.mark.parametrize("args", [("--since", "forever"), ("--since", "0d"), ("--by", "team"), ("--json", "--csv")])
def test_bad_input_is_one_line_and_exit_2(files, args):
    result = run_board("report", *args, env=files)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and "Traceback" not in result.stderr


def test_the_op_on_the_sampled_simulated_fleet(tmp_path):
    """Real sampling: alice's idle card 1 is BOOKED every sample, bob squats card 2 (no booking) for the hour."""
    from app.gpu.model import GpuProcess

    clock = [float(FROZEN_NOW // BUCKET_S * BUCKET_S)]
    start = int(clock[0])
    fleet = replace(DEFAULT_FLEET, processes=((2, GpuProcess(200, 5000, "bob", demo_uid("bob"), "python x.py")),))
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(sample_s=10, raw_hours=1, rollup_days=2))
    source = SimulatedSource(fleet, clock=lambda: clock[0])
    alice = LocalClient.on(config, source, Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
    try:
        alice.call("book", cards=[1], start=start, end=start + 2 * H)
        sampler = sampler_of(alice.service)
        while clock[0] < start + H:
            sampler.sample_once()
            clock[0] += 10
        # The same figures from the raw samples (nothing rolled up yet), from the rollups, and from both.
        for roll_to in (None, start + H // 2, clock[0]):
            if roll_to is not None:
                alice.service.history.roll_up(roll_to)
            found = {r["key"]: r for r in alice.call("report", since_s=H)["rows"]}
            assert (found["alice"]["booked_h"], found["alice"]["idle_h"], found["alice"]["used_h"]) == (1.0, 1.0, 0.0)
            assert (found["bob"]["booked_h"], found["bob"]["squatted_h"]) == (0.0, 1.0)
        cards = {r["key"]: r for r in alice.call("report", since_s=H, by="card")["rows"]}
        assert cards["2"]["squatted_h"] == 1.0 and cards["1"]["idle_h"] == 1.0
        with pytest.raises(BadInput):
            alice.call("report", since_s=60)
        with pytest.raises(BadInput):
            alice.call("report", since_s=H, by="team")
    finally:
        alice.close()


def test_multi_card_bookings_get_their_pcie_link_utilisation_and_the_wide_one_is_flagged(tmp_path):
    """Issue 23: alice's job spans cards 0 and 1 (much traffic), bob's server runs on card 2 of his cards 2-3 (little).
    The share is the busy time's mean traffic (the busier direction) over a Gen 5 x16 link; over 25 % is flagged."""
    from app.gpu.model import link_capacity_mib_s

    clock = [float(FROZEN_NOW // BUCKET_S * BUCKET_S)]
    start = int(clock[0])
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(sample_s=10, raw_hours=1, rollup_days=2))
    source = SimulatedSource(clock=lambda: clock[0])
    me = LocalClient.on(config, source, Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
    try:
        alice = me.call("book", cards=[0, 1], start=start, end=start + 2 * H)
        sampler = sampler_of(me.service)
        expected: dict[int, list[float]] = {0: [], 1: []}
        while clock[0] < start + H:
            sampler.sample_once()
            for card in source.read().cards[:2]:
                if card.utilization_pct >= config.report.busy_util:
                    expected[card.index].append(round(max(card.pcie_tx_mib_s, card.pcie_rx_mib_s)))
            clock[0] += 10
        want = 100 * sum(expected[0] + expected[1]) / len(expected[0] + expected[1]) / link_capacity_mib_s(5, 16)
        for roll_to in (None, clock[0]):
            if roll_to is not None:
                me.service.history.roll_up(roll_to)
            [group] = me.call("report", since_s=H)["tp"]
            assert (group["booking"], group["cards"]) == (alice["id"], "0-1")
            assert group["link_util_pct"] == pytest.approx(want, abs=0.2)
            assert group["over"] is (want > 25) and want > 25
            # A pair has no smaller TP: the advice is the layer split (or one card), never "TP2 or TP4".
            assert "--split-mode layer" in group["advice"] and "TP" not in group["advice"], group["advice"]
        from app.report.render import table

        text = table(me.call("report", since_s=H))
        assert "PCIe link utilisation over their busy time" in text and "not measured communication time" in text
        assert f"!!  #{alice['id']} alice cards 0-1: {group['link_util_pct']:g} % of the links over" in text
    finally:
        me.close()


@pytest.mark.parametrize(("cards", "smaller"), [(2, None), (3, "TP2"), (4, "TP2"), (5, "TP2 or TP4"),
                                               (8, "TP2 or TP4")])
def test_the_tp_advice_names_only_groups_smaller_than_the_one_flagged(cards, smaller):
    from app.report.gather import tp_advice

    advice = tp_advice(cards)
    assert "--split-mode layer" in advice
    if smaller is None:
        assert "TP" not in advice and "one card" in advice
    else:
        assert f"use a smaller TP ({smaller}) or" in advice


def test_a_group_of_light_traffic_is_not_flagged(tmp_path):
    clock = [float(FROZEN_NOW // BUCKET_S * BUCKET_S)]
    start = int(clock[0])
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(sample_s=10, raw_hours=1, rollup_days=2))
    source = SimulatedSource(clock=lambda: clock[0])
    bob = LocalClient.on(config, source, Identity("bob", demo_uid("bob"), False), clock=lambda: clock[0])
    try:
        booked = bob.call("book", cards=[2, 3], start=start, end=start + 2 * H)
        sampler = sampler_of(bob.service)
        while clock[0] < start + H / 2:
            sampler.sample_once()
            clock[0] += 10
        [group] = bob.call("report", since_s=H)["tp"]
        assert group["booking"] == booked["id"] and not group["over"] and group["advice"] is None
        assert 0 < group["link_util_pct"] < 5  # a lone server's weights and tokens: little traffic
    finally:
        bob.close()


def test_a_booking_an_admin_moved_away_is_idle_no_longer_than_booked(tmp_path):
    """alice's idle booking on card 1 is moved to card 3 by an admin at 6 min into a 5-minute bucket's second
    half: each piece is charged only for its part of that bucket (it was 4 min booked and 5 min idle on card 3,
    125 %), and the piece that carries on from now waited nothing (it said 6 min: the original's request time)."""
    clock = [float(FROZEN_NOW // BUCKET_S * BUCKET_S)]
    start = int(clock[0])
    config = Config(db_path=tmp_path / "board.db", refresh_seconds=0,
                     history=HistorySettings(sample_s=10, raw_hours=1, rollup_days=2))
    source = SimulatedSource(replace(DEFAULT_FLEET, processes=()), clock=lambda: clock[0])
    alice = LocalClient.on(config, source, Identity("alice", demo_uid("alice"), False), clock=lambda: clock[0])
    carol = LocalClient.on(config, source, Identity("carol", demo_uid("carol"), True), clock=lambda: clock[0])
    try:
        booking = alice.call("book", cards=[1], start=start, end=start + 2 * H)
        sampler = sampler_of(alice.service)
        while clock[0] < start + 2 * BUCKET_S:
            if clock[0] == start + 360:
                moved = carol.call("reassign", id=booking["id"], cards=[3])
                assert (moved["start"], moved["requested_at"]) == (start + 360, start + 360)
            sampler.sample_once()
            clock[0] += 10
        alice.service.history.roll_up(clock[0])
        doc = alice.call("report", since_s=H, by="card")
        cards = {r["key"]: r for r in doc["rows"]}
        # 6 min booked; idle 5: its minute of the shared bucket is in a bucket mostly FREE
        assert (cards["1"]["booked_h"], cards["1"]["idle_h"]) == (0.1, 0.08)
        assert (cards["3"]["booked_h"], cards["3"]["idle_h"]) == (0.07, 0.07)  # 4 min, idle all of them
        assert all(r["idle_h"] <= r["booked_h"] for r in doc["rows"])
        assert (cards["1"]["wait_mean_min"], cards["3"]["wait_mean_min"]) == (0.0, 0.0)
        assert cards["3"]["idle_pct"] == 100.0
    finally:
        alice.close()
        carol.close()
