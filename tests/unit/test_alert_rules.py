"""The alert rules at their exact thresholds: one step either side of each."""

from __future__ import annotations

import pytest

from app.alerts.engine import quiet_at
from app.alerts.rules import Card, Crash, Ending, Inputs, evaluate
from app.config import AlertSettings, ConfigError, load_config

NOW = 1_795_966_200
S = AlertSettings()


def rules(inputs: Inputs, settings: AlertSettings = S) -> set[tuple[str, str]]:
    return {(f.rule, f.subject) for f in evaluate(inputs, settings)}


def card(**kw) -> Card:
    return Card(**{"index": 3, "uuid": "GPU-3", "state": "FREE", **kw})


@pytest.mark.parametrize("util, fired", [(29.9, True), (30.0, False), (50, False)])
def test_low_utilisation_is_strictly_under_30(util, fired):
    assert (("util-low", "fleet") in rules(Inputs(NOW, util_mean=util))) is fired


@pytest.mark.parametrize("util, before, now, fired", [
    (85.1, 1, 2, True), (85.0, 1, 2, False), (85.1, 2, 2, False), (85.1, 3, 2, False), (99, 0, 1, True)])
def test_high_utilisation_needs_a_growing_queue(util, before, now, fired):
    found = rules(Inputs(NOW, util_mean=util, queued_before=before, queued_now=now))
    assert (("util-high", "fleet") in found) is fired


def test_no_history_no_utilisation_alert():
    assert rules(Inputs(NOW, util_mean=None, queued_now=5)) == set()


@pytest.mark.parametrize("waits, fired", [((1801.0,), True), ((1800.0,), False), ((0.0, 3602.0), True),
                                          ((0.0, 3600.0), False), ((), False)])
def test_average_wait_over_30_minutes(waits, fired):
    assert (("wait", "fleet") in rules(Inputs(NOW, waits_s=waits))) is fired


@pytest.mark.parametrize("used, fired", [(900, True), (899, False), (1000, True)])
def test_vram_at_or_over_90_percent(used, fired):
    assert (("vram", "GPU-3") in rules(Inputs(NOW, cards=(card(vram_used_mib=used, vram_total_mib=1000),)))) is fired


def test_vram_unknown_is_no_alert():
    assert rules(Inputs(NOW, cards=(card(vram_used_mib=None, vram_total_mib=1000), card(vram_used_mib=5)))) == set()


@pytest.mark.parametrize("faults, fired", [(3, False), (4, True)])
def test_more_than_3_faults_a_month(faults, fired):
    assert (("faults", "fleet") in rules(Inputs(NOW, faults_month=faults))) is fired


@pytest.mark.parametrize("temp, fired", [(91, False), (92, True), (95, True)])
def test_hot_at_92(temp, fired):
    assert (("hot", "GPU-3") in rules(Inputs(NOW, cards=(card(temp_c=temp),)))) is fired


@pytest.mark.parametrize("idle_s, fired", [(1800, False), (1801, True)])
def test_booked_and_idle_over_30_minutes(idle_s, fired):
    idle = card(state="BOOKED", holder="alice", idle_booked_since=NOW - idle_s)
    assert (("idle-booked", "GPU-3") in rules(Inputs(NOW, cards=(idle,)))) is fired


def test_squatter_lost_crash():
    found = evaluate(Inputs(NOW, cards=(card(state="SQUATTED", holder="bob", squatters=("eve",)),
                                        card(index=4, uuid="GPU-4", state="LOST", temp_c=99)),
                            crashes=(Crash(7, "carol", NOW - 60, "qwen.gguf"),)), S)
    assert {(f.rule, f.subject, f.message) for f in found} == {
        ("squatter", "GPU-3", "GPU 3 squatted by eve (booked by bob)"),
        ("lost", "GPU-4", "GPU 4 is LOST: the driver no longer sees it"),  # a LOST card's stale readings say nothing
        ("crashed", "server:7", "server 7 (qwen.gguf) of carol crashed")}


@pytest.mark.parametrize("left, fired", [(600, True), (601, False), (1, True), (0, False)])
def test_ending_within_10_minutes_is_for_its_holder(left, fired):
    found = evaluate(Inputs(NOW, ending=(Ending(12, 1001, NOW + left),)), S)
    assert [(f.rule, f.subject, f.uid) for f in found] == ([("ending", "booking:12", 1001)] if fired else [])


def test_thresholds_come_from_the_settings():
    strict = AlertSettings(hot_c=80, vram_pct=50, faults_month=0)
    inputs = Inputs(NOW, cards=(card(temp_c=80, vram_used_mib=500, vram_total_mib=1000),), faults_month=1)
    assert rules(inputs) == set()
    assert rules(inputs, strict) == {("hot", "GPU-3"), ("vram", "GPU-3"), ("faults", "fleet")}


@pytest.mark.parametrize("hhmm, quiet", [("21:59", False), ("22:00", True), ("03:00", True), ("07:59", True),
                                         ("08:00", False), ("12:00", False)])
def test_quiet_hours_wrap_midnight(hhmm, quiet):
    from datetime import datetime, timezone

    h, m = map(int, hhmm.split(":"))
    at = datetime(2026, 12, 1, h, m, tzinfo=timezone.utc).timestamp()
    assert quiet_at(at, AlertSettings(quiet="22:00-08:00").quiet_minutes(), timezone.utc) is quiet
    assert quiet_at(at, None, timezone.utc) is False


def test_the_config_reads_alerts(tmp_path):
    path = tmp_path / "board.toml"
    path.write_text('[alerts]\nidle_booked_min = 45\nquiet = "22:00-08:00"\nrepeat_min = 15\n')
    settings = load_config(environ={"BOARD_CONFIG": str(path)}).alerts
    assert (settings.idle_booked_min, settings.quiet_minutes(), settings.repeat_min) == (45, (1320, 480), 15)


@pytest.mark.parametrize("text, says", [
    ('quiet = "late"', "quiet"), ('quiet = "25:00-08:00"', "quiet"), ("quiet = 3", "quiet"),
    ('hot_c = "hot"', "hot_c"), ("repeat_min = -1", "repeat_min"), ("nope = 1", "unknown key"),
    ('enabled = "yes"', "enabled")])
def test_a_bad_alerts_section_is_refused(tmp_path, text, says):
    path = tmp_path / "board.toml"
    path.write_text(f"[alerts]\n{text}\n")
    with pytest.raises(ConfigError, match=says):
        load_config(environ={"BOARD_CONFIG": str(path)})


def test_a_squatters_container_is_named():
    found = evaluate(Inputs(NOW, cards=(card(state="SQUATTED", holder="bob", squatters=("root",),
                                             containers=("3f4e8a9b2c1d",)),)), S)
    assert [f.message for f in found] == ["GPU 3 squatted by root in container 3f4e8a9b2c1d (booked by bob)"]


@pytest.mark.parametrize("limit, policy, fired", [
    (575.0, 500.0, True), (500.0, 500.0, False), (500.4, 500.0, False), (501.0, 500.0, True), (499.0, 500.0, True),
    (575.0, None, False), (None, 500.0, False)])
def test_a_power_limit_that_drifts_from_the_policy(limit, policy, fired):
    found = evaluate(Inputs(NOW, cards=(card(power_limit_w=limit, power_policy_w=policy),)), S)
    assert bool(found) is fired
    if fired:
        [finding] = found
        assert (finding.rule, finding.subject) == ("power-drift", "GPU-3")
        assert finding.message == (f"GPU 3 power limit {limit:.0f} W, not the policy's 500 W (board power apply sets"
                                   " it)")
