"""What each alert says: the words a team reads in a push, pinned for every rule at once."""

from __future__ import annotations

from app.alerts.rules import Card, Crash, Ending, Inputs, evaluate
from app.config import AlertSettings
from app.core.cardstate import LOST, SQUATTED

NOW = 1_795_966_200


def said(inputs: Inputs) -> dict[tuple[str, str], tuple[str, int | None]]:
    return {(f.rule, f.subject): (f.message, f.uid) for f in evaluate(inputs, AlertSettings())}


def test_every_rule_says_what_and_by_how_much():
    inputs = Inputs(
        now=NOW, util_mean=12.4, waits_s=(40 * 60, 50 * 60), faults_month=5,
        cards=(Card(0, "GPU-0", LOST, vram_used_mib=32000, vram_total_mib=32000, temp_c=99),
               Card(1, "GPU-1", SQUATTED, vram_used_mib=30000, vram_total_mib=32000, temp_c=95, holder="alice",
                    squatters=("mallory", "eve")),
               Card(2, "GPU-2", SQUATTED),
               Card(3, "GPU-3", "BOOKED", holder="bob", idle_booked_since=NOW - 45 * 60)),
        crashes=(Crash(7, "carol", NOW - 60, "qwen-7b"), Crash(8, "dan", NOW - 60)),
        ending=(Ending(11, 1001, NOW + 61),))
    assert said(inputs) == {
        ("util-low", "fleet"): ("fleet utilisation 12 % over 60 min (under 30 %)", None),
        ("wait", "fleet"): ("average wait 45 min over the last 60 min (2 bookings; over 30 min)", None),
        ("faults", "fleet"): ("5 OOM or Xid faults in 30 days (more than 3)", None),
        ("lost", "GPU-0"): ("GPU 0 is LOST: the driver no longer sees it", None),
        ("vram", "GPU-1"): ("GPU 1 VRAM at 94 % (at or over 90 %)", None),
        ("hot", "GPU-1"): ("GPU 1 at 95 °C (at or over 92 °C)", None),
        ("squatter", "GPU-1"): ("GPU 1 squatted by mallory, eve (booked by alice)", None),
        ("squatter", "GPU-2"): ("GPU 2 squatted by someone (not booked)", None),
        ("idle-booked", "GPU-3"): ("GPU 3 booked by bob and idle for 45 min (over 30 min)", None),
        ("crashed", "server:7"): ("server 7 (qwen-7b) of carol crashed", None),
        ("crashed", "server:8"): ("server 8 of dan crashed", None),
        ("ending", "booking:11"): ("your booking 11 ends in 2 min", 1001),
    }


def test_high_utilisation_says_how_the_queue_grew():
    inputs = Inputs(now=NOW, util_mean=91.6, queued_before=2, queued_now=5)
    assert said(inputs) == {("util-high", "fleet"): (
        "fleet utilisation 92 % over 60 min (over 85 %) and the queue grew from 2 to 5", None)}


def test_a_booking_ending_within_the_minute_ends_in_1_min():
    inputs = Inputs(now=NOW, ending=(Ending(12, 1001, NOW + 30),))
    assert said(inputs) == {("ending", "booking:12"): ("your booking 12 ends in 1 min", 1001)}


def test_minutes_left_round_up_to_the_whole_minute():
    inputs = Inputs(now=NOW, ending=(Ending(12, 1001, NOW + 300), Ending(13, 1001, NOW + 301)))
    assert said(inputs) == {("ending", "booking:12"): ("your booking 12 ends in 5 min", 1001),
                            ("ending", "booking:13"): ("your booking 13 ends in 6 min", 1001)}


def test_squatters_in_two_containers_are_both_named():
    inputs = Inputs(now=NOW, cards=(Card(4, "GPU-4", SQUATTED, squatters=("root", "container/unknown"),
                                         containers=("3f4e8a9b2c1d", "9a8b7c6d5e4f")),))
    assert said(inputs) == {("squatter", "GPU-4"): (
        "GPU 4 squatted by root, container/unknown in container 3f4e8a9b2c1d, 9a8b7c6d5e4f (not booked)", None)}
