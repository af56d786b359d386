"""app/monitoring/alerts.yml, board's alert rules for Prometheus, checked and run by the real promtool on sample series.

`promtool test rules` evaluates the rules over the series as Prometheus would and compares the alerts that fire
(labels and rendered annotations) with the expected ones; an empty list means none may fire. Each threshold has a
case on its other side, so a threshold moved or a `>=` turned `>` fails here: the last test plants such versions in
a copy of the rules and sees promtool refuse them.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from app.monitoring import RULES, read

BOX = {"instance": "box:9400", "job": "board"}


def card(index: int, holder: str = "", booking: str = "", **extra: str) -> dict[str, str]:
    """A card's labels as the agent exports them (app.service.box.metrics CARD_LABELS), and Prometheus's target's."""
    return {**BOX, "uuid": f"GPU-{index}", "index": str(index), "name": "NVIDIA GeForce RTX 5090", "pool": "",
            "holder": holder, "class": "batch" if holder else "", "booking_id": booking, **extra}


def series(metric: str, labels: dict[str, str], values: str) -> dict:
    inside = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{metric}{{{inside}}}", "values": values}


def alert(name: str, at: str, *expected: tuple[dict, dict]) -> dict:
    """The alerts `name` has firing at `at`: (labels, annotations) each, the summary as the template renders it."""
    return {"alertname": name, "eval_time": at,
            "exp_alerts": [{"exp_labels": labels, "exp_annotations": annotations} for labels, annotations in expected]}


def rule(labels: dict[str, str], severity: str, board_rule: str, summary: str, description: str = "") -> tuple:
    """An alert's labels (an empty label is no label in Prometheus) and annotations."""
    found = {k: v for k, v in {**labels, "severity": severity, "board_rule": board_rule}.items() if v}
    return found, {"summary": summary, **({"description": description} if description else {})}


# A card's VRAM at 90 % exactly fires; at 89.9 % it does not. The board's own rule: "at or over 90 %".
VRAM = {"interval": "1m", "input_series": [
    series("board_gpu_memory_used_bytes", card(3, "alice", "7"), "90x5"),
    series("board_gpu_memory_total_bytes", card(3, "alice", "7"), "100x5"),
    series("board_gpu_memory_used_bytes", card(4), "89.9x5"),
    series("board_gpu_memory_total_bytes", card(4), "100x5"),
], "alert_rule_test": [alert("BoardVramHigh", "3m", rule(
    card(3, "alice", "7"), "warning", "vram", "box:9400 GPU 3 (alice): VRAM at 90% (at or over 90 %)",
    "A new request is likely to run out of memory; keep 10 % free."))]}

# 92 °C fires, 91 °C does not; and only once it has held a minute.
HOT = {"interval": "1m", "input_series": [
    series("board_gpu_temperature_celsius", card(1), "92x5"),
    series("board_gpu_temperature_celsius", card(2), "91x5"),
], "alert_rule_test": [
    alert("BoardCardHot", "0m"),
    alert("BoardCardHot", "2m", rule({**card(1)}, "critical", "hot",
                                        "box:9400 GPU 1 at 92 °C (at or over 92 °C)")),
]}

# One booking starts each minute. Box a: each waited 30 min and 1 s, so the hour's mean is over 30 min; box b: each
# waited 30 min exactly, which is not over.
WAIT = {"interval": "1m", "input_series": [
    series("board_booking_wait_seconds_sum", {**BOX, "instance": "a"}, "0+1801x120"),
    series("board_booking_wait_seconds_count", {**BOX, "instance": "a"}, "0+1x120"),
    series("board_booking_wait_seconds_sum", {**BOX, "instance": "b"}, "0+1800x120"),
    series("board_booking_wait_seconds_count", {**BOX, "instance": "b"}, "0+1x120"),
], "alert_rule_test": [alert("BoardWaitLong", "90m", rule(
    {**BOX, "instance": "a"}, "warning", "wait",
    "a: bookings that started in the last hour waited 30m 1s on average (over 30 min)"))]}

# Box a: 90 % busy for two hours and the queue grew from 0 to 2 in the last hour; box b: as busy, the queue as long
# but not growing; box c: 20 % busy.
BUSY = {"interval": "1m", "input_series": [
    series("board_gpu_utilization_ratio", {**card(0), "instance": "a"}, "0.9x150"),
    series("board_bookings_queued", {**BOX, "instance": "a"}, "0x70 2x80"),
    series("board_gpu_utilization_ratio", {**card(0), "instance": "b"}, "0.9x150"),
    series("board_bookings_queued", {**BOX, "instance": "b"}, "2x150"),
    series("board_gpu_utilization_ratio", {**card(0), "instance": "c"}, "0.2x150"),
    series("board_bookings_queued", {**BOX, "instance": "c"}, "0x150"),
], "alert_rule_test": [
    alert("BoardUtilisationHighQueueGrowing", "120m", rule(
        {"instance": "a"}, "warning", "util-high", "a: fleet utilisation 90% over 1 h (over 85 %) and the queue grew",
        "Not enough compute for the work queued: more cards, or quantised models.")),
    alert("BoardUtilisationLow", "120m", rule(
        {"instance": "c"}, "info", "util-low", "c: fleet utilisation 20% over 1 h (under 30 %)",
        "The cards are split too finely or there is little work: consider merging groups.")),
]}

# Box a: 4 OOM and Xid faults in 30 days, box b: 3 (not more than 3), one sample a day.
FAULTS = {"interval": "1d", "input_series": [
    series("board_oom_total", {**BOX, "instance": "a"}, "0 0 1 2 3 3x30"),
    series("board_xid_errors_total", {**BOX, "instance": "a", "code": "79"}, "0 0 0 0 0 1x30"),
    series("board_oom_total", {**BOX, "instance": "b"}, "0 0 1 2 2x30"),
    series("board_xid_errors_total", {**BOX, "instance": "b", "code": "79"}, "0 0 0 0 1x30"),
], "alert_rule_test": [alert("BoardFaultsMonthly", "30d", rule(
    {"instance": "a"}, "warning", "faults", "a: 4 OOM or Xid faults in 30 days (more than 3)",
    "The quota rules are not being followed (board faults lists them)."))]}

# Booking 7 holds cards 0 and 1 with their links 30 % busy: too wide. Booking 8's two cards at 25 % are not over;
# booking 9 is one card at 90 %: no TP group.
TP = {"interval": "1m", "input_series": [
    series("board_gpu_pcie_link_utilization_ratio", card(0, "alice", "7"), "0.3x60"),
    series("board_gpu_pcie_link_utilization_ratio", card(1, "alice", "7"), "0.3x60"),
    series("board_gpu_pcie_link_utilization_ratio", card(2, "bob", "8"), "0.25x60"),
    series("board_gpu_pcie_link_utilization_ratio", card(3, "bob", "8"), "0.25x60"),
    series("board_gpu_pcie_link_utilization_ratio", card(4, "carol", "9"), "0.9x60"),
], "alert_rule_test": [alert("BoardTpLinkShareHigh", "40m",
                             rule({"instance": "box:9400", "booking_id": "7", "holder": "alice"}, "info", "tp-links",
                                  "box:9400 booking 7 (alice): PCIe links 30% busy (over 25 %)",
                                  "The TP group is too wide for PCIe; use a smaller TP (TP2 or TP4) or split by layers"
                                  " (--split-mode layer)."))]}

# Card 5's limit is 575 W against the policy's 500 W; card 6's 500.5 W is within the watt NVML rounds to.
POWER = {"interval": "1m", "input_series": [
    series("board_gpu_power_limit_watts", card(5), "575x5"),
    series("board_gpu_power_policy_watts", card(5), "500x5"),
    series("board_gpu_power_limit_watts", card(6), "500.5x5"),
    series("board_gpu_power_policy_watts", card(6), "500x5"),
], "alert_rule_test": [alert("BoardPowerDrift", "3m", rule(
    card(5), "warning", "power-drift",
    "box:9400 GPU 5: power limit 75 W away from the [power] policy (board power apply sets it)"))]}

# Card 0 squatted; card 1 booked and idle for 40 min, card 2 for 20 min.
STATES = {"interval": "1m", "input_series": [
    series("board_gpu_state", {**card(0), "state": "squatted"}, "1x50"),
    series("board_gpu_state", {**card(1, "alice", "7"), "state": "booked"}, "1x50"),
    series("board_gpu_state", {**card(2, "bob", "8"), "state": "booked"}, "0x20 1x30"),
], "alert_rule_test": [
    alert("BoardCardSquatted", "40m",
          rule({**card(0), "state": "squatted"}, "warning", "squatter",
               "box:9400 GPU 0 is used by someone who has not booked it (board status names them)")),
    alert("BoardCardIdleBooked", "40m",
          rule({**card(1, "alice", "7"), "state": "booked"}, "info", "idle-booked",
               "box:9400 GPU 1 booked by alice and idle for over 30 min")),
]}

CASES = {"vram": VRAM, "hot": HOT, "wait": WAIT, "busy": BUSY, "faults": FAULTS, "tp": TP, "power": POWER,
         "states": STATES}


def promtool(folder: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(folder / "promtool"), *args], capture_output=True, text=True, timeout=120, cwd=cwd)


def run_tests(prometheus_bin: Path, tmp_path: Path, rules: str, cases: list[str]) -> subprocess.CompletedProcess:
    """promtool's test of `rules` on the named cases, a test file each: the rules are evaluated each minute, and
    each hour for the month of faults (a month of minutes costs promtool minutes)."""
    (tmp_path / "alerts.yml").write_text(rules)
    for case in cases:
        every = "1h" if case == "faults" else "1m"
        # JSON is YAML: promtool reads it as its test file.
        (tmp_path / f"{case}.yml").write_text(json.dumps({"rule_files": ["alerts.yml"], "evaluation_interval": every,
                                                          "tests": [CASES[case]]}))
    return promtool(prometheus_bin, "test", "rules", *(f"{case}.yml" for case in cases), cwd=tmp_path)


def test_promtool_checks_the_rules(prometheus_bin, tmp_path):
    (tmp_path / "alerts.yml").write_text(read(RULES))
    checked = promtool(prometheus_bin, "check", "rules", "alerts.yml", cwd=tmp_path)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "SUCCESS: 12 rules found" in checked.stdout


@pytest.mark.parametrize("case", CASES)
def test_the_rule_fires_over_its_threshold_and_not_at_or_under_it(prometheus_bin, tmp_path, case):
    tested = run_tests(prometheus_bin, tmp_path, read(RULES), [case])
    assert tested.returncode == 0, tested.stdout + tested.stderr


@pytest.mark.parametrize(("right", "wrong"), [
    ("board_gpu_memory_total_bytes >= 0.90", "board_gpu_memory_total_bytes >= 0.89"),  # the threshold moved
    ("board_gpu_memory_total_bytes >= 0.90", "board_gpu_memory_total_bytes > 0.90"),
    ("board_gpu_temperature_celsius >= 92", "board_gpu_temperature_celsius >= 91"),
    ("board_gpu_temperature_celsius >= 92", "board_gpu_temperature_celsius > 92"),
    ("> 30 * 60", ">= 30 * 60"),
    ("[30m])) > 0.25", "[30m])) >= 0.25"),
    ("count by (instance, booking_id) (board_gpu_pcie_link_utilization_ratio{booking_id!=\"\"}) > 1",
     "count by (instance, booking_id) (board_gpu_pcie_link_utilization_ratio{booking_id!=\"\"}) > 0"),
    ("[30d])) > 3.5", "[30d])) > 2.5"),
    ("board_gpu_power_policy_watts) >= 1", "board_gpu_power_policy_watts) >= 0.5"),
    ("(board_bookings_queued - board_bookings_queued offset 1h) > 0", "board_bookings_queued > 0"),
    ("< 0.30", "< 0.20"),
    ("board_gpu_state{state=\"booked\", booking_id!=\"\"} == 1\n        for: 30m",
     "board_gpu_state{state=\"booked\", booking_id!=\"\"} == 1\n        for: 10m"),
])
def test_a_planted_wrong_rule_fails_the_cases(prometheus_bin, tmp_path, right, wrong):
    """The cases can fail: each nearest wrong version of a rule (its threshold moved, `>=` for `>`, the queue's
    growth dropped, a single card taken for a TP group) makes promtool report an alert that should not be, or one
    missing."""
    rules = read(RULES)
    assert rules.count(right) == 1, right
    tested = run_tests(prometheus_bin, tmp_path, rules.replace(right, wrong), list(CASES))
    assert tested.returncode != 0 and "FAILED" in tested.stdout + tested.stderr, tested.stdout
