"""The history store on real SQLite files: rollups (min, mean, max exact), the watermark, retention, the queries."""

from __future__ import annotations

import sqlite3

import pytest

from app.core.cardstate import BOOKED, FREE, IN_USE, LOST, SQUATTED
from app.gpu.model import THROTTLE_IDLE, THROTTLE_SW_POWER_CAP, THROTTLE_SW_THERMAL
from app.history.store import BUCKET_S, HistoryStore, Sample

T0 = 1_795_965_900  # a bucket's start (a multiple of 300 from the store's epoch)
A, B = "GPU-aaaa", "GPU-bbbb"


@pytest.fixture
def store(tmp_path):
    found = HistoryStore(tmp_path / "board.history.db")
    yield found
    found.close()


def sample(ts, uuid=A, state=IN_USE, **values) -> Sample:
    return Sample(ts=ts, uuid=uuid, state=state, dt=10, **values)


def test_t0_is_a_bucket_start():
    from app.history.store import EPOCH

    assert (T0 - EPOCH) % BUCKET_S == 0


class TestRollups:
    def test_min_mean_max_are_exact_per_card_and_bucket(self, store):
        vram, util, temp, power, sm = [1000, 1003, 1500], [10, 20, 61], [40, 41, 45], [100, 250, 575], [2400, 2100, 2407]
        store.add([sample(T0 + 10 * i, vram=vram[i], util=util[i], temp=temp[i], power=power[i], sm=sm[i])
                   for i in range(3)])
        store.add([sample(T0 + BUCKET_S, vram=7)])  # the next bucket: not in the first
        assert store.roll_up(T0 + 2 * BUCKET_S) == 2
        first = store.rollups(T0, T0 + BUCKET_S)
        assert len(first) == 1
        row = first[0]
        assert (row["ts"], row["uuid"], row["n"], row["seconds"], row["state"]) == (T0, A, 3, 30, IN_USE)
        assert (row["vram_min"], row["vram_mean"], row["vram_max"]) == (1000, 1168, 1500)  # 1167.67 rounds up
        assert (row["util_min"], row["util_mean"], row["util_max"]) == (10, 30, 61)  # 30.33
        assert (row["temp_min"], row["temp_mean"], row["temp_max"]) == (40, 42, 45)
        assert (row["power_min"], row["power_mean"], row["power_max"]) == (100, 308, 575)  # 308.33
        assert (row["sm_min"], row["sm_mean"], row["sm_max"]) == (2100, 2302, 2407)  # 2302.33

    def test_a_half_is_rounded_up_and_a_missing_reading_is_left_out(self, store):
        store.add([sample(T0, util=1, temp=None), sample(T0 + 10, util=2, temp=50),
                   sample(T0 + 20, state=LOST), sample(T0 + 30, util=None, temp=None)])
        store.roll_up(T0 + BUCKET_S)
        [row] = store.rollups(T0, T0 + BUCKET_S)
        assert (row["util_min"], row["util_mean"], row["util_max"]) == (1, 2, 2)  # 1.5 -> 2
        assert (row["temp_min"], row["temp_mean"], row["temp_max"]) == (50, 50, 50)
        assert row["vram_min"] is None and row["vram_mean"] is None  # never read: no figure, not 0
        assert row["n"] == 4

    def test_state_is_the_most_samples_and_thermal_throttling_is_counted(self, store):
        states = [BOOKED, BOOKED, IN_USE, IN_USE, IN_USE, FREE]
        reasons = [THROTTLE_IDLE, THROTTLE_SW_THERMAL, THROTTLE_SW_THERMAL, THROTTLE_SW_POWER_CAP, 0, None]
        store.add([sample(T0 + 10 * i, state=s, throttle=r) for i, (s, r) in enumerate(zip(states, reasons))])
        store.roll_up(T0 + BUCKET_S)
        [row] = store.rollups(T0, T0 + BUCKET_S)
        assert row["state"] == IN_USE
        assert row["n_throttled"] == 2  # the power cap is not heat
        assert row["throttle"] == THROTTLE_IDLE | THROTTLE_SW_THERMAL | THROTTLE_SW_POWER_CAP

    def test_squatters_are_counted_per_user_and_the_holder_is_not(self, store):
        store.add([sample(T0, state=SQUATTED, booking=7, holder="alice", users=(("alice", 100), ("mallory", 9000)))])
        store.add([sample(T0 + 10, state=SQUATTED, users=(("mallory", 9000), ("eve", 10)))])
        store.add([sample(T0 + 20, state=IN_USE, booking=7, holder="alice", users=(("alice", 100),))])
        store.roll_up(T0 + BUCKET_S)
        assert sorted((s["user"], s["n"]) for s in store.squats(T0, T0 + BUCKET_S)) == [("eve", 1), ("mallory", 2)]
        users = [s["users"] for s in store.samples(T0, T0 + 1)]
        assert users == [[{"user": "alice", "vram": 100, "squat": False}, {"user": "mallory", "vram": 9000, "squat": True}]]

    def test_only_finished_buckets_are_rolled_and_each_once(self, store):
        store.add([sample(T0), sample(T0 + BUCKET_S + 5)])
        assert store.roll_up(T0 + BUCKET_S + 10) == 1  # the second bucket is still filling
        assert store.rolled_to() == T0 + BUCKET_S
        assert store.roll_up(T0 + BUCKET_S + 20) == 0
        store.add([sample(T0 + BUCKET_S + 15, util=90)])
        assert store.roll_up(T0 + 2 * BUCKET_S) == 1
        assert [r["n"] for r in store.rollups(T0, T0 + 10 * BUCKET_S)] == [1, 2]

    def test_a_gap_of_days_is_skipped_and_each_transaction_rolls_an_hour(self, store):
        store.add([sample(T0), sample(T0 + 3 * 86400)])
        assert store.roll_up(T0 + 3 * 86400 + BUCKET_S, batches=1) == 1  # the first bucket's hour
        assert store.roll_up(T0 + 3 * 86400 + BUCKET_S, batches=1) == 1  # straight to the next sample's
        assert store.rolled_to() == T0 + 3 * 86400 + BUCKET_S


class TestRetention:
    def test_raw_goes_after_raw_hours_but_only_once_rolled_up(self, store):
        store.add([sample(T0 + 3600 * h, users=(("bob", 5),)) for h in range(6)])
        now = T0 + 6 * 3600
        assert store.prune(now, raw_hours=2, rollup_days=365) == (0, 0)  # nothing rolled up yet: all kept
        store.roll_up(now)
        assert store.prune(now, raw_hours=2, rollup_days=365) == (4, 0)
        assert [s["ts"] for s in store.samples(0, now + 1)] == [T0 + 4 * 3600, T0 + 5 * 3600]
        conn = sqlite3.connect(store.path)
        assert conn.execute("SELECT count(*) FROM sample_users").fetchone()[0] == 2  # their users went too
        assert len(store.rollups(0, now + 1)) == 6  # the rollups stay

    def test_rollups_go_after_rollup_days(self, store):
        store.add([sample(T0), sample(T0 + 86400), sample(T0 + 2 * 86400)])
        now = T0 + 2 * 86400 + BUCKET_S
        store.roll_up(now)
        assert store.prune(now, raw_hours=1, rollup_days=1.5)[1] == 1
        assert [r["ts"] for r in store.rollups(0, now)] == [T0 + 86400, T0 + 2 * 86400]

    def test_the_same_card_and_second_twice_is_kept_once(self, store):
        store.add([sample(T0, vram=1)])
        store.add([sample(T0, vram=2)])
        assert [s["vram"] for s in store.samples(T0, T0 + 1)] == [1]


class TestSeries:
    def test_short_steps_come_from_the_raw_samples(self, store):
        store.add([sample(T0 + 10 * i, vram=100 * i, power=i) for i in range(6)])
        store.add([sample(T0, uuid=B, vram=5)])
        points = store.series(A, T0, T0 + 60, 30)
        assert [(p.ts, p.vram.min, p.vram.mean, p.vram.max, p.power.max, p.n) for p in points] == [
            (T0, 0, 100, 200, 2, 3), (T0 + 30, 300, 400, 500, 5, 3)]

    def test_long_steps_come_from_rollups_and_the_newest_minutes_from_raw(self, store):
        store.add([sample(T0 + 10 * i, util=i % 2 * 100) for i in range(60)])  # two buckets, mean 50
        store.roll_up(T0 + BUCKET_S)  # only the first is rolled up
        store.add([sample(T0 + 2 * BUCKET_S, util=20)])
        points = store.series(A, T0, T0 + 3 * BUCKET_S, BUCKET_S)
        assert [(p.ts, p.util.mean, p.n) for p in points] == [(T0, 50, 30), (T0 + BUCKET_S, 50, 30),
                                                              (T0 + 2 * BUCKET_S, 20, 1)]
        assert store.series("GPU-never-seen", T0, T0 + 60, 10) == []

    def test_a_long_step_weighs_each_rollup_by_its_samples(self, store):
        store.add([sample(T0 + 10 * i, util=10) for i in range(30)] + [sample(T0 + BUCKET_S, util=100)])
        store.roll_up(T0 + 2 * BUCKET_S)
        [point] = store.series(A, T0, T0 + 2 * BUCKET_S, 2 * BUCKET_S)
        assert point.util.mean == pytest.approx((30 * 10 + 100) / 31)
        assert (point.util.min, point.util.max, point.n) == (10, 100, 31)


@pytest.mark.parametrize("suffix", ["", "-wal"])
def test_a_planted_link_is_refused_and_nothing_is_written_through_it(tmp_path, suffix):
    from app.store.db import StoreError

    target = tmp_path / "elsewhere"
    target.write_text("not yours")
    path = tmp_path / "board.history.db"
    (tmp_path / f"board.history.db{suffix}").symlink_to(target)
    with pytest.raises(StoreError, match="symbolic link"):
        HistoryStore(path).add([sample(T0)])
    assert target.read_text() == "not yours"


def test_a_step_the_watermark_cuts_is_one_point_of_both_sides(store):
    store.add([sample(T0 + 10 * i, util=10) for i in range(30)] + [sample(T0 + BUCKET_S + 10 * i, util=40)
                                                                    for i in range(10)])
    store.roll_up(T0 + BUCKET_S)  # the first bucket rolled up, the second still raw
    [point] = store.series(A, T0, T0 + 2 * BUCKET_S, 2 * BUCKET_S)
    assert (point.util.min, point.util.max, point.n) == (10, 40, 40)
    assert point.util.mean == pytest.approx((30 * 10 + 10 * 40) / 40)


class TestPcie:
    """Issue 23: PCIe traffic is kept as the other metrics are, and a file from before gains it."""

    def test_pcie_traffic_rolls_up_and_reads_back(self, store):
        store.add([sample(T0 + 10 * i, util=90, pcie=v) for i, v in enumerate([12000, 15000, 21000])])
        assert store.roll_up(T0 + BUCKET_S) == 1
        [rollup] = store.rollups(T0, T0 + BUCKET_S)
        assert rollup["pcie_mean"] == 16000  # the mean alone: what a TP group's share needs, in the budget
        assert store.samples(T0, T0 + 30)[0]["pcie"] == 12000

    def test_a_file_from_before_gains_the_columns_and_keeps_its_rows(self, tmp_path):
        path = tmp_path / "old.history.db"
        old = HistoryStore(path)
        old.add([sample(T0, util=50, vram=1000)])
        old.close()
        raw = sqlite3.connect(path)  # as the file was before: no pcie columns, views without them
        for view in ("sample_view", "rollup_view"):
            raw.execute(f"DROP VIEW {view}")
        raw.execute("ALTER TABLE samples DROP COLUMN pcie")
        raw.execute("ALTER TABLE rollups DROP COLUMN pcie_mean")
        raw.commit()
        raw.close()
        reopened = HistoryStore(path)
        reopened.add([sample(T0 + 10, util=50, vram=1000, pcie=900)])
        assert reopened.roll_up(T0 + BUCKET_S) == 1
        [rollup] = reopened.rollups(T0, T0 + BUCKET_S)
        assert (rollup["vram_mean"], rollup["pcie_mean"], rollup["n"]) == (1000, 900, 2)
        reopened.close()
