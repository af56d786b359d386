"""The box's own health in a real subprocess on the simulated fleet: board cards, board topo, board doctor's
hardware checks, board power, and status --json's PCIe traffic (issue 23)."""

from __future__ import annotations

import csv
import io
import json

import pytest

from tests.conftest import run_board

# An unhealthy box: an old driver, card 5 in a x4 Gen 3 slot behind the chipset with a drifted limit and its own
# serial and slot; labels from the scenario for two cards.
SICK = """\
[system]
driver = "565.57.01"
cuda = "12.7"
[cards]
count = 8
compute_capability = "12.0"
labels = ["top left", "top right\\u001b[31m"]
[[cards.override]]
card = 5
pcie_width = 4
pcie_gen = 3
behind_chipset = true
power_limit_w = 500
serial = "SN-FIVE"
slot = "SLOT7"
"""


@pytest.fixture
def board(tmp_path):
    def run(*args, scenario: str | None = None, extra_env: dict | None = None):
        simulate = "1"
        if scenario is not None:
            (tmp_path / "fleet.toml").write_text(scenario)
            simulate = str(tmp_path / "fleet.toml")
        env = {"BOARD_DB": str(tmp_path / "board.db"), "BOARD_SIMULATE": simulate, "TZ": "UTC", **(extra_env or {})}
        return run_board(*args, env=env)

    return run


def test_cards_json_has_each_cards_place_link_and_power(board):
    result = board("cards", "--json", scenario=SICK)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["driver_version"], found["cuda_version"]) == ("565.57.01", "12.7")
    five = found["cards"][5]
    assert {"index", "uuid", "serial", "pci_bus_id", "slot", "numa_node", "pcie", "power"} <= set(five)
    assert (five["index"], five["cuda_index"], five["serial"], five["slot"], five["numa_node"]) == (
        5, 5, "SN-FIVE", "SLOT7", 1)
    assert five["pci_bus_id"] == "00000000:06:00.0"
    assert five["pcie"] == {"gen": 3, "width": 4, "max_gen": 5, "max_width": 16, "behind_chipset": True}
    assert five["power"] == {"limit_w": 500.0, "default_w": 575.0, "max_w": 600.0}
    assert found["cards"][0]["label"] == "top left"


def test_cards_labels_is_the_table_to_stick_on_the_box(board):
    result = board("cards", "--labels", scenario=SICK)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["CARD", "CUDA", "SERIAL", "PCI", "BUS", "ID", "SLOT", "LABEL"]
    assert lines[1].split() == ["0", "0", "1652025000000", "00000000:01:00.0", "1", "top", "left"]
    assert lines[6].split() == ["5", "5", "SN-FIVE", "00000000:06:00.0", "SLOT7", "-"]
    assert "\x1b" not in result.stdout  # a label is text from the config: shown inert
    assert "stick it on the chassis" in lines[-1]


def test_cards_csv_is_one_row_per_card(board):
    result = board("cards", "--csv", scenario=SICK)
    assert result.returncode == 0, result.stderr
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 8
    assert (rows[5]["serial"], rows[5]["slot"], rows[5]["pcie_width"], rows[5]["behind_chipset"],
            rows[5]["power_limit_w"]) == ("SN-FIVE", "SLOT7", "4", "True", "500.0")


def test_cards_labels_and_csv_together_are_refused(board):
    result = board("cards", "--labels", "--csv")
    assert result.returncode == 2 and result.stdout == "" and result.stderr.count("\n") == 1


def test_topo_is_the_matrix_nvidia_smi_prints(board):
    result = board("topo", "--json")
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert found["cards"] == list(range(8)) and found["numa"] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert found["matrix"][0] == ["X", "PXB", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS"]
    assert found["matrix"][6][4] == "PXB" and found["matrix"][6][6] == "X"
    assert found["order"] == list(range(8))
    text = board("topo")
    assert text.returncode == 0
    assert text.stdout.splitlines()[1].split() == ["GPU0", "X", "PXB", "PXB", "PXB", "SYS", "SYS", "SYS", "SYS", "0"]
    assert "CUDA_VISIBLE_DEVICES=0,1,2,3,4,5,6,7" in text.stdout


def test_status_json_has_each_cards_pcie_traffic(board):
    result = board("status", "--json")
    assert result.returncode == 0, result.stderr
    cards = json.loads(result.stdout)["cards"]
    assert set(cards[0]["pcie"]) == {"tx_mib_s", "rx_mib_s"}
    assert cards[3]["pcie"] == {"tx_mib_s": 0.0, "rx_mib_s": 0.0}  # nothing runs on card 3
    # alice's job spans cards 0 and 1: far more traffic per point of load than bob's lone server on card 2.
    assert cards[0]["pcie"]["tx_mib_s"] / cards[0]["utilization_pct"] > 10 * (
        cards[2]["pcie"]["tx_mib_s"] / cards[2]["utilization_pct"])


def test_a_group_that_crosses_a_switch_says_so_in_the_plan(board):
    crossing = board("book", "--cards", "3,4", "--for", "1h")
    assert crossing.returncode == 0, crossing.stderr
    assert ("board: note: cards 3-4 cross a PCIe switch and span NUMA nodes 0,1: traffic between them goes through"
            " the CPU; prefer --split-mode layer\n") in crossing.stderr
    close = board("book", "--cards", "6,7", "--for", "1h")
    assert close.returncode == 0, close.stderr
    assert "cross" not in close.stderr


def fake_server(tmp_path, *archs: int):
    """An executable whose embedded fat binary holds SASS for `archs`, as a CUDA build of llama-server does."""
    import struct

    body = b""
    for arch in archs:
        payload = b"\x7fELF" + bytes(12)
        body += struct.pack("<HHIQIIHHI", 2, 0x101, 64, len(payload), 0, 0, 8, 1, arch) + bytes(32) + payload
    path = tmp_path / "bin" / "llama-server"
    path.parent.mkdir(exist_ok=True)
    path.write_bytes(b"#!/bin/sh\n" + struct.pack("<IHHQ", 0xBA55ED50, 1, 16, len(body)) + body)
    path.chmod(0o755)
    return str(path)


def test_doctor_names_the_minimums_and_the_fixes_on_a_sick_box(board, tmp_path):
    result = board("doctor", scenario=SICK, extra_env={"BOARD_LLAMA_SERVER": fake_server(tmp_path, 89)})
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert ("FIX   driver 565.57.01 is too old for compute capability 12.0 (cards 0-7): it needs 570 or newer;"
            " install the 570 driver (or newer) and reboot") in lines
    assert any(line.startswith("FIX   CUDA 12.7") and "needs 12.8" in line for line in lines)
    assert any(line.startswith("FIX   llama-server (") and "no kernel image is available" in line
               and "-DCMAKE_CUDA_ARCHITECTURES=120" in line for line in lines)
    assert ("WARN  card 5 (slot SLOT7): PCIe x4 of its x16; multi-card work will crawl: move it to a full-width slot"
            " wired to the CPU") in lines
    assert any(line.startswith("WARN  card 5 (slot SLOT7): behind the chipset") for line in lines)
    assert not any("card 4" in line for line in lines)


def test_the_demos_doctor_does_not_hold_the_members_own_demo_database_to_the_shared_install(tmp_path):
    """`board --demo doctor`: the demo's database (~/.local/state/board/demo.db, made by the demo with the member's
    umask) is the member's own, so its directory's and files' modes and the admin group are no FIX; `board doctor` on
    the same directory as a real database still is (the check kept, only not for the demo)."""
    state = tmp_path / "state"
    (state / "board").mkdir(parents=True, mode=0o755)
    (state / "board").chmod(0o755)
    (tmp_path / "board.toml").write_text("")
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(state), "TZ": "UTC", "BOARD_CONFIG": str(tmp_path / "board.toml"),
           "BOARD_LLAMA_SERVER": fake_server(tmp_path, 89, 120)}
    assert run_board("--demo", "list", env=env).returncode == 0  # the demo made and seeded its database
    demo = run_board("--demo", "doctor", env=env)
    assert demo.returncode == 0 and demo.stderr == "", demo
    assert not [line for line in demo.stdout.splitlines() if not line.startswith("ok    ")], demo.stdout
    assert f"ok    the demo's database {state}/board/demo.db is yours alone (board --demo)" in demo.stdout
    real = run_board("doctor", env={**env, "BOARD_DB": str(state / "board" / "demo.db"), "BOARD_SIMULATE": "1"})
    assert real.returncode == 1 and f"FIX   {state}/board has mode 755, not 700" in real.stdout, real.stdout


def test_a_warning_alone_does_not_fail_doctor_and_a_fix_does(tmp_path):
    """The demo's doctor with no llama-server to be found: every check ok but one WARN (the build not checked), and
    doctor exits 0; a CPU-only llama-server is a FIX, and doctor exits 1.
    Wrong versions: a WARN counted as a problem (exit 1); the FIX not counted (exit 0)."""
    state = tmp_path / "state"
    (tmp_path / "board.toml").write_text("")
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": str(state), "TZ": "UTC", "PATH": "/usr/bin:/bin",
           "BOARD_CONFIG": str(tmp_path / "board.toml")}
    warned = run_board("--demo", "doctor", env=env)
    marks = [line[:6].strip() for line in warned.stdout.splitlines()]
    assert sorted(set(marks)) == ["WARN", "ok"] and marks.count("WARN") == 1, warned.stdout
    assert "WARN  llama-server's build not checked: llama-server not found" in warned.stdout
    assert warned.returncode == 0, warned
    cpu_only = run_board("--demo", "doctor", env={**env, "BOARD_LLAMA_SERVER": fake_server(tmp_path)})
    assert "FIX   llama-server" in cpu_only.stdout and cpu_only.returncode == 1, cpu_only


def test_doctor_on_a_healthy_box_passes_its_hardware_checks(board, tmp_path):
    result = board("doctor", extra_env={"BOARD_LLAMA_SERVER": fake_server(tmp_path, 89, 120)})
    hardware = [line for line in result.stdout.splitlines() if "CUDA" in line or "PCIe" in line or "llama" in line]
    assert hardware == [
        "ok    driver 575.57.08 and CUDA 12.9 support compute capability 12.0 (cards 0-7) (needs driver 570+, CUDA 12.8+)",
        f"ok    llama-server ({tmp_path}/bin/llama-server) carries native code for compute capability 12.0"
        " (sm_89,sm_120)",
        "ok    PCIe links: every card at its full width, none behind the chipset (cards 0-7)",
    ]
    assert not (tmp_path / "board.db").exists()  # doctor reads the cards, and creates no database for it


# -- the power policy --------------------------------------------------------------------------------------------

POWER = "[power]\nlimit_w = 500\npause_s = 0\n[power.cards]\n7 = 450\n"


def test_power_shows_each_cards_limit_against_the_policy(board, tmp_path):
    (tmp_path / "board.toml").write_text(POWER)
    result = board("power", "--json", extra_env={"BOARD_CONFIG": str(tmp_path / "board.toml")})
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert (found["policy_w"], found["pause_s"]) == (500.0, 0.0)
    assert found["cards"][0] == {"index": 0, "uuid": "GPU-5090sim-0000-0000-0000-000000000000", "limit_w": 575.0,
                                 "default_w": 575.0, "max_w": 600.0, "policy_w": 500.0, "persistence": True,
                                 "drift": True, "lost": False}
    assert found["cards"][7]["policy_w"] == 450.0
    text = board("power", extra_env={"BOARD_CONFIG": str(tmp_path / "board.toml")})
    assert text.stdout.splitlines()[1].split() == ["0", "575", "575", "600", "500", "on", "DRIFT"]


def test_power_apply_dry_run_prints_the_steps_and_changes_nothing(board, tmp_path):
    (tmp_path / "board.toml").write_text(POWER)
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml")}
    result = board("power", "apply", "--dry-run", extra_env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "would set card 0: power limit 575 W -> 500 W (nvidia-smi -i 0 -pl 500)"
    assert lines[7] == "would set card 7: power limit 575 W -> 450 W (nvidia-smi -i 7 -pl 450)"
    assert lines[-1] == "dry run: nothing changed (8 cards, 0 s apart)"
    assert json.loads(board("log", "--json", extra_env=env).stdout)["events"] == []


def test_power_apply_sets_each_card_in_turn_and_audits_each_step(board, tmp_path):
    (tmp_path / "board.toml").write_text(POWER.replace("pause_s = 0", "pause_s = 0.01"))
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml")}
    result = board("power", "apply", extra_env=env)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[:3] == ["set card 0: power limit 575 W -> 500 W (nvidia-smi -i 0 -pl 500)", "pause 0.01 s",
                         "set card 1: power limit 575 W -> 500 W (nvidia-smi -i 1 -pl 500)"]
    assert len(lines) == 8 + 7  # a pause between cards, none after the last
    events = json.loads(board("log", "--json", extra_env=env).stdout)["events"]
    assert [(e["action"], e["ok"], e["details"]["card"], e["details"]["to_w"]) for e in reversed(events)] == [
        ("power-limit", True, i, 450 if i == 7 else 500) for i in range(8)]


def test_power_without_a_policy_names_the_source_of_its_advice(board):
    """The hint names where 500 W comes from (the field report, seed 003), not 'the seeds', which no reader has."""
    result = board("power")
    assert result.returncode == 0, result.stderr
    [hint] = [line for line in result.stdout.splitlines() if line.startswith("no [power] limit_w")]
    assert "the team's field report, seed 003, runs its 575 W cards at 500 W" in hint and "seeds" not in hint


def test_power_apply_without_a_policy_is_bad_input(board):
    result = board("power", "apply")
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr == "board: no [power] limit_w in the config: nothing to apply (e.g. [power] limit_w = 500)\n"


def test_power_steps_change_the_simulated_fleet_are_for_admins_and_audited(tmp_path):
    """The operations in one service (the simulated fleet keeps its state between calls, as the agent's does)."""
    from app.config import Config, PowerSettings
    from app.core.identity import Identity
    from app.errors import BadInput, NotPermitted
    from app.gpu.fleet import Fleet
    from app.gpu.simulated import SimulatedSource
    from app.service import Service
    from app.store import events

    config = Config(db_path=tmp_path / "board.db", power=PowerSettings(limit_w=500.0))
    service = Service(config, Fleet(SimulatedSource(), config.refresh_seconds))
    root, member = Identity("root", 0, True), Identity("alice", 1001, False)
    with pytest.raises(NotPermitted, match="for admins"):
        service.call(member, "power_step", {"card": 2, "limit_w": 500})
    service.call(root, "power_step", {"card": 2, "persistence": False})
    service.call(root, "power_step", {"card": 2, "limit_w": 500})
    with pytest.raises(BadInput, match="card 2: the driver refused"):
        service.call(root, "power_step", {"card": 2, "limit_w": 700})  # over the card's maximum
    two = service.call(member, "power", {})["cards"][2]
    assert (two["limit_w"], two["persistence"], two["drift"]) == (500.0, False, False)
    assert service.call(member, "power", {})["cards"][3]["drift"] is True
    audited = [(e.actor, e.action, e.ok) for e in reversed(events.recent(service.conn, limit=10))]
    assert audited == [("root", "power-persistence", True), ("root", "power-limit", True),
                       ("root", "power-limit", False)]  # the member's refusal is not a change: not audited


def test_without_cap_sys_admin_nvml_says_no_and_the_step_names_the_capability(tmp_path, monkeypatch):
    import sys

    from app.config import Config
    from app.core.identity import Identity
    from app.errors import NotPermitted
    from app.gpu.fleet import Fleet
    from app.gpu.nvml import NvmlSource
    from app.service import Service
    from tests.fakes.fake_pynvml import FakeGpu, FakePynvml

    fake = FakePynvml([FakeGpu()])
    fake.root = False  # NVML answers NoPermission, as it does to a process without CAP_SYS_ADMIN
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    config = Config(db_path=tmp_path / "board.db")
    service = Service(config, Fleet(NvmlSource(sysfs=tmp_path), config.refresh_seconds))
    with pytest.raises(NotPermitted, match="needs CAP_SYS_ADMIN"):
        service.call(Identity("root", 0, True), "power_step", {"card": 0, "limit_w": 500})
    assert fake.gpus[0].power_limit_mw == 575_000


def test_cards_table_puts_each_cards_numa_node_slot_and_link_in_their_columns(board):
    """Card 5 of the sick box: CUDA 5, slot SLOT7, NUMA node 1, Gen 3 x4 of Gen 5 x16, behind the chipset.
    Wrong versions: the NUMA column read from the CUDA number (or the slot); BEHIND and no swapped."""
    result = board("cards", scenario=SICK)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["#", "CUDA", "SERIAL", "PCI", "BUS", "ID", "SLOT", "NUMA", "PCIE", "CHIPSET",
                                "POWER", "W", "CC", "LABEL"]
    assert lines[6].split() == ["5", "5", "SN-FIVE", "00000000:06:00.0", "SLOT7", "1", "Gen3", "x4", "(of", "Gen5",
                                "x16)", "BEHIND", "500", "(575/600)", "12.0", "-"]
    assert lines[2].split()[5] == "0" and lines[2].split()[11] == "no"  # card 1: NUMA node 0, CUDA 1


# The limit sits at 500 W on cards 0 and 1 (and card 3 falls off the bus); the policy is a watt or half a watt off.
EDGE = """\
[cards]
count = 4
[[cards.override]]
card = 0
power_limit_w = 500
[[cards.override]]
card = 1
power_limit_w = 500
[faults]
lost = [3]
"""


def test_a_limit_a_watt_off_the_policy_drifts_and_half_a_watt_off_does_not(board, tmp_path):
    """NVML keeps milliwatts: within a watt of the policy is the policy; a whole watt off is drift.
    Wrong versions: drift only beyond a watt (> 1); any difference drifts; the per-card override read after the
    default [power] limit_w (card 1 would be held to 501 W)."""
    (tmp_path / "board.toml").write_text("[power]\nlimit_w = 501\npause_s = 0\n[power.cards]\n1 = 500.5\n")
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml")}
    result = board("power", "--json", scenario=EDGE, extra_env=env)
    assert result.returncode == 0, result.stderr
    cards = json.loads(result.stdout)["cards"]
    assert [(c["index"], c["limit_w"], c["policy_w"], c["drift"]) for c in cards[:3]] == [
        (0, 500.0, 501.0, True), (1, 500.0, 500.5, False), (2, 575.0, 501.0, True)]
    dry = board("power", "apply", "--dry-run", scenario=EDGE, extra_env=env)
    assert dry.returncode == 0, dry.stderr
    assert [line for line in dry.stdout.splitlines() if line.startswith("would set card 1")] == []


def test_a_lost_card_is_flagged_lost_not_drift_and_apply_leaves_it(board, tmp_path):
    """Card 3 fell off the bus with its limit off the policy: LOST says what to do first; apply skips it.
    Wrong versions: DRIFT shown over LOST; a lost card planned (nvidia-smi -i 3 on a card that is not there)."""
    (tmp_path / "board.toml").write_text("[power]\nlimit_w = 450\npause_s = 0\n")
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml")}
    result = board("power", scenario=EDGE, extra_env=env)
    assert result.returncode == 0, result.stderr
    rows = {line.split()[0]: line.split() for line in result.stdout.splitlines()[1:5]}
    assert rows["3"][-1] == "LOST" and rows["2"][-1] == "DRIFT"
    dry = board("power", "apply", "--dry-run", scenario=EDGE, extra_env=env)
    assert dry.returncode == 0, dry.stderr
    assert [line.split(":")[0] for line in dry.stdout.splitlines()[:-1]] == [
        "would set card 0", "would set card 1", "would set card 2"]
    assert dry.stdout.splitlines()[-1] == "dry run: nothing changed (3 cards, 0 s apart)"


@pytest.mark.parametrize(("limit_w", "ok"), [(600, True), (601, False)])
def test_apply_may_set_a_card_to_its_maximum_and_not_a_watt_over(board, tmp_path, limit_w, ok):
    """The simulated 575 W card's maximum is 600 W: a policy of 600 W is applied, 601 W refused before any step.
    Wrong versions: the maximum itself refused (>=); the check dropped (the driver refuses mid-way, cards half set)."""
    (tmp_path / "board.toml").write_text(f"[power]\nlimit_w = {limit_w}\npause_s = 0\n")
    env = {"BOARD_CONFIG": str(tmp_path / "board.toml")}
    result = board("power", "apply", "--dry-run", scenario=EDGE, extra_env=env)
    if ok:
        assert result.returncode == 0, result.stderr
        assert result.stdout.splitlines()[0] == "would set card 0: power limit 500 W -> 600 W (nvidia-smi -i 0 -pl 600)"
    else:
        assert result.returncode == 2 and result.stdout == ""
        assert result.stderr == ("board: card 0: the policy's 601 W is over the card's maximum 600 W; lower [power]"
                                 " limit_w\n")


def test_doctor_says_which_cards_drifted_from_the_power_policy_since_boot(board, tmp_path):
    """On EDGE (cards 0 and 1 at 500 W, card 2 at its default 575 W, card 3 lost), against [power] limit_w = 575,
    card 0's 500.5 W and card 1's 501 W: card 1 (a watt off) is the one warning (WARN: it does not fail doctor), the
    lost card none; with card 1's policy at 500 W the warning becomes one ok line for the cards it read.
    Wrong versions: the drift boundary moved (`>` a watt: card 1 passes; half a watt: card 0 warns); [power.cards]
    ignored (cards 0 and 1 held to 575 W); a drift counted as a FIX; no line when every card is at the policy."""
    config = tmp_path / "board.toml"
    config.write_text("[power]\nlimit_w = 575\n[power.cards]\n0 = 500.5\n1 = 501\n")
    env = {"BOARD_CONFIG": str(config), "BOARD_LLAMA_SERVER": fake_server(tmp_path, 120)}
    result = board("doctor", scenario=EDGE, extra_env=env)
    power = [line for line in result.stdout.splitlines() if "power limit" in line]
    assert power == ["WARN  card 1 (slot 2): power limit 500 W, not the [power] policy's 501 W: it drifted since boot"
                     " (board-power.service sets it at boot; check systemctl status board-power), board power apply"
                     " (as an admin) sets it now"], result.stdout
    config.write_text("[power]\nlimit_w = 575\n[power.cards]\n0 = 500.5\n1 = 500\n")
    at_policy = board("doctor", scenario=EDGE, extra_env=env)
    assert [line for line in at_policy.stdout.splitlines() if "power limit" in line] == [
        "ok    power limits: every card at the [power] policy (cards 0-2)"], at_policy.stdout


def test_doctor_has_no_power_line_without_a_policy(board, tmp_path):
    """No [power] limit_w: nothing to drift from, so no line (not an ok that claims a policy holds).
    Wrong version: every card's default limit compared against None (a line per card)."""
    result = board("doctor", scenario=EDGE, extra_env={"BOARD_LLAMA_SERVER": fake_server(tmp_path, 120)})
    assert not [line for line in result.stdout.splitlines() if "power limit" in line], result.stdout
