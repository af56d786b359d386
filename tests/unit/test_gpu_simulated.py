"""The simulated fleet: the default server, determinism, scenario files, and open_source's choice."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import app.gpu
from app.gpu import LINK_MULTIPLE, LINK_SYSTEM, GpuProcess, GpuSource, open_source
from app.gpu.simulated import DEFAULT_FLEET, SimulatedSource, demo_uid, load_scenario

EXAMPLE = Path(app.gpu.__file__).parent / "scenarios" / "example.toml"
CLOCKS = [0.0, 1.0, 17.3, 600.0, 1_750_000_000.0, 1_750_003_600.5]


def read_at(t: float, source_factory=SimulatedSource):
    return source_factory(clock=lambda: t).read()


# -- the default fleet -----------------------------------------------------------------------


def test_default_fleet_is_the_teams_server():
    source = SimulatedSource(clock=lambda: 100.0)
    snapshot = source.read()
    assert isinstance(source, GpuSource)
    assert source.simulated is True and snapshot.simulated is True
    assert snapshot.taken_at == 100.0
    assert len(snapshot.cards) == 8
    for i, card in enumerate(snapshot.cards):
        assert card.index == i
        assert card.name == "NVIDIA GeForce RTX 5090"
        assert card.memory_total_mib == 32607
        assert card.power_limit_w == 575.0
        assert card.pci_bus_id == f"00000000:{i + 1:02X}:00.0"
        assert card.uuid.startswith("GPU-5090sim-")
        assert card.lost is False
    assert len({c.uuid for c in snapshot.cards}) == 8
    assert [c.uuid for c in snapshot.cards] == [c.uuid for c in read_at(999.0).cards]  # stable


@pytest.mark.parametrize(
    "a, b, level",
    [(0, 1, LINK_MULTIPLE), (0, 3, LINK_MULTIPLE), (4, 7, LINK_MULTIPLE), (5, 6, LINK_MULTIPLE),
     (3, 4, LINK_SYSTEM), (0, 7, LINK_SYSTEM), (2, 5, LINK_SYSTEM)],
)
def test_default_topology_has_two_switches(a, b, level):
    topology = read_at(0.0).topology
    assert topology.level(a, b) == level
    assert topology.level(b, a) == level


@pytest.mark.parametrize(
    "card, expected",
    [
        (0, [(41001, "alice", 1001, 22000, "python train.py --config llama3-8b-lora.yaml")]),
        (1, [(41001, "alice", 1001, 22000, "python train.py --config llama3-8b-lora.yaml")]),
        (2, [(41207, "bob", 1002, 24500, "llama-server -m /models/qwen2.5-14b-q4_k_m.gguf --port 8081")]),
        (3, []),
        (4, []),
        (5, [(42310, "dave", 1004, 9000, "python eval.py --shard 3")]),
        (6, [(51999, None, None, 4096, "")]),
        (7, []),
    ],
)
def test_default_processes(card, expected):
    processes = read_at(50.0).cards[card].processes
    assert [(p.pid, p.user, p.uid, p.used_mib, p.command) for p in processes] == expected


@pytest.mark.parametrize("user, uid", [("alice", 1001), ("bob", 1002), ("carol", 1003), ("dave", 1004)])
def test_demo_team_has_fixed_uids(user, uid):
    assert demo_uid(user) == uid


def test_other_simulated_users_get_a_stable_uid_outside_the_team_range():
    assert demo_uid("zed") == demo_uid("zed")
    assert 2000 <= demo_uid("zed") < 10000


@pytest.mark.parametrize("t", CLOCKS)
def test_default_values_stay_in_their_ranges(t):
    for card in read_at(t).cards:
        process_mib = sum(p.used_mib for p in card.processes)
        assert 300 <= card.memory_used_mib - process_mib <= 500, "driver baseline"
        assert 0 <= card.utilization_pct <= 100
        assert (card.utilization_pct == 0) == (not card.processes)
        if card.index == 7:
            assert 91 <= card.temperature_c <= 93, "card 7 runs hot"
        else:
            assert 35 <= card.temperature_c <= 75
        assert 0 < card.power_w <= card.power_limit_w


# -- determinism -----------------------------------------------------------------------------


def test_the_hot_card_slows_itself_and_idle_cards_clock_down():
    from app.gpu.model import THROTTLE_IDLE, THROTTLE_SW_THERMAL, THROTTLE_THERMAL

    for t in range(0, 600, 7):
        cards = SimulatedSource(clock=lambda: float(t)).read().cards
        hot = cards[7]
        assert bool(hot.throttle_reasons & THROTTLE_SW_THERMAL) == (hot.temperature_c >= 92)
        assert cards[3].throttle_reasons == THROTTLE_IDLE and cards[3].sm_clock_mhz == 180  # nothing runs on it
        assert not cards[0].throttle_reasons & THROTTLE_THERMAL and 2100 <= cards[0].sm_clock_mhz <= 2407


@pytest.mark.parametrize("t", CLOCKS)
def test_same_clock_gives_equal_snapshots(t):
    assert read_at(t) == read_at(t)
    source = SimulatedSource(clock=lambda: t)
    assert source.read() == source.read()


@pytest.mark.parametrize(
    "attribute", ["utilization_pct", "temperature_c", "power_w", "memory_used_mib"]
)
def test_different_clocks_move_the_live_values(attribute):
    values = {tuple(getattr(c, attribute) for c in read_at(t).cards) for t in CLOCKS}
    assert len(values) > 1


def test_values_move_smoothly_from_one_second_to_the_next():
    for before, after in zip(read_at(1000.0).cards, read_at(1001.0).cards):
        assert abs(before.utilization_pct - after.utilization_pct) <= 5
        assert abs(before.temperature_c - after.temperature_c) <= 3


# -- processes added at runtime (demo llama-servers) -----------------------------------------

SERVER = GpuProcess(60001, 12000, "carol", demo_uid("carol"), "llama-server -m model.gguf --port 8090")


def test_extra_processes_appear_on_the_next_read_and_count_in_vram():
    source = SimulatedSource(clock=lambda: 10.0)
    before = source.read()
    source.set_extra_processes({3: (SERVER,), 0: (SERVER,)})
    after = source.read()
    assert after.cards[3].processes == (SERVER,)
    assert after.cards[3].memory_used_mib == before.cards[3].memory_used_mib + 12000
    assert after.cards[0].processes == before.cards[0].processes + (SERVER,)
    assert after.cards[3].utilization_pct > 0  # a busy card works
    assert after.cards[4] == before.cards[4]


def test_extra_processes_replace_the_previous_set():
    source = SimulatedSource(clock=lambda: 10.0)
    source.set_extra_processes({3: (SERVER,)})
    source.set_extra_processes({})
    assert source.read() == SimulatedSource(clock=lambda: 10.0).read()


@pytest.mark.parametrize("index", [-1, 8, 99])
def test_extra_processes_on_a_missing_card_are_refused(index):
    with pytest.raises(ValueError, match=str(index)):
        SimulatedSource().set_extra_processes({index: (SERVER,)})


# -- scenario files --------------------------------------------------------------------------


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scenario.toml"
    path.write_text(text)
    return path


def test_example_scenario_loads_and_shows_its_faults():
    snapshot = SimulatedSource(load_scenario(EXAMPLE), clock=lambda: 5.0).read()
    assert [c.name for c in snapshot.cards] == ["NVIDIA GeForce RTX 4090"] * 4
    assert [c.label for c in snapshot.cards] == ["slot 1", "slot 2", "slot 3", "slot 4"]
    assert [c.lost for c in snapshot.cards] == [False, False, False, True]
    assert snapshot.cards[2].temperature_c is None
    assert snapshot.cards[2].processes[0].user is None
    assert 91 <= snapshot.cards[1].temperature_c <= 93
    assert snapshot.topology.level(0, 1) == LINK_MULTIPLE
    assert snapshot.topology.level(1, 2) == LINK_SYSTEM


def test_empty_scenario_is_the_default_cards_with_nothing_running(tmp_path):
    scenario = load_scenario(write(tmp_path, ""))
    assert scenario.cards == DEFAULT_FLEET.cards
    assert scenario.processes == () and not scenario.lost and not scenario.hot


def test_scenario_cards_and_processes(tmp_path):
    path = write(tmp_path, """
[cards]
count = 3
name = "NVIDIA H100"
memory_total_mib = 81559
power_limit_w = 700.5
switches = 3
labels = ["left"]

[[processes]]
card = 2
pid = 7
user = "erin"
uid = 1234
used_mib = 1000
command = "python x.py"

[[processes]]
card = 2
pid = 8
""")
    snapshot = SimulatedSource(load_scenario(path), clock=lambda: 0.0).read()
    assert [(c.name, c.memory_total_mib, c.power_limit_w) for c in snapshot.cards] == [("NVIDIA H100", 81559, 700.5)] * 3
    assert [c.label for c in snapshot.cards] == ["left", None, None]
    assert snapshot.topology.level(0, 1) == LINK_SYSTEM  # three switches, one card each
    assert snapshot.cards[2].processes == (
        GpuProcess(7, 1000, "erin", 1234, "python x.py", started_at=-(600 + 7 * 7919 % 21000)),
        GpuProcess(8, None, None, None, ""),
    )


@pytest.mark.parametrize(
    "field, attribute, expected",
    [
        ("temperature", "temperature_c", None),
        ("utilization", "utilization_pct", None),
        ("power", "power_w", None),
        ("power_limit", "power_limit_w", None),
        ("memory_used", "memory_used_mib", None),
        ("memory_total", "memory_total_mib", None),
        ("name", "name", None),
        ("pci_bus_id", "pci_bus_id", None),
        ("processes", "processes", ()),
    ],
)
def test_scenario_field_error_blanks_that_field_only(tmp_path, field, attribute, expected):
    path = write(tmp_path, f'[[processes]]\ncard = 1\npid = 5\nused_mib = 10\n'
                           f'[[faults.field_error]]\ncard = 1\nfield = "{field}"\n')
    cards = SimulatedSource(load_scenario(path), clock=lambda: 0.0).read().cards
    assert getattr(cards[1], attribute) == expected
    assert getattr(cards[0], attribute) is not None
    assert cards[1].uuid and not cards[1].lost


def test_scenario_stall_sleeps_on_every_read(tmp_path):
    slept = []
    source = SimulatedSource(load_scenario(write(tmp_path, "[faults]\nstall_seconds = 2.5\n")), sleep=slept.append)
    source.read()
    source.read()
    assert slept == [2.5, 2.5]


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("colour = 1", "unknown key 'colour'"),
        ("[cards]\ncolour = 1", "unknown key 'cards.colour'"),
        ('[cards]\ncount = "8"', "cards.count must be an integer"),
        ("[cards]\ncount = true", "cards.count must be an integer"),
        ("[cards]\ncount = 0", "cards.count must be 1-64"),
        ("[cards]\ncount = 2\nswitches = 3", "cards.switches must be 1-2"),
        ("[cards]\ncount = 1\nlabels = ['a', 'b']", "cards.labels has 2 entries"),
        ("[cards]\nmemory_total_mib = -5", "cards.memory_total_mib must be positive"),
        ("[cards]\npower_limit_w = 'lots'", "cards.power_limit_w must be a number"),
        ("processes = 3", "processes must be an array of tables"),
        ("[[processes]]\ncard = 8\npid = 1", "processes[0].card 8 is out of range (cards are 0-7)"),
        ("[[processes]]\ncard = 0", "processes[0].pid is missing"),
        ("[[processes]]\ncard = 0\npid = 0", "processes[0].pid must be positive"),
        ("[[processes]]\ncard = 0\npid = 1\nused_mib = -1", "used_mib must not be negative"),
        ("[[processes]]\ncard = 0\npid = 1\nuser = 7", "processes[0].user must be a string"),
        ("[[processes]]\ncard = 0\npid = 1\nvram = 7", "unknown key 'processes[0].vram'"),
        ("[faults]\nlost = [8]", "faults.lost card 8 is out of range"),
        ("[faults]\nhot = [-1]", "faults.hot card -1 is out of range"),
        ("[faults]\nlost = 3", "faults.lost must be a list of integers"),
        ("[faults]\nstall_seconds = -1", "faults.stall_seconds must not be negative"),
        ("[[faults.field_error]]\ncard = 0\nfield = 'fan'", "field 'fan' is not one of"),
        ("[[faults.field_error]]\ncard = 9\nfield = 'power'", "faults.field_error[0].card 9 is out of range"),
        ("[[faults.field_error]]\ncard = 0", "faults.field_error[0].field is missing"),
        ("[cards\ncount = 1", "line 1"),  # not TOML at all
        ("[system]\ndriver = 570", "system.driver must be a string"),
        ("[system]\ncuda = 'new'", "system.cuda must be a version"),
        ("[system]\nkernel = '6.8'", "unknown key 'system.kernel'"),
        ("[cards]\ncompute_capability = '12'", "cards.compute_capability must be MAJOR.MINOR"),
        ("[[cards.override]]\npcie_width = 4", "cards.override[0].card is missing"),
        ("[[cards.override]]\ncard = 8\npcie_width = 4", "cards.override[0].card 8 is out of range"),
        ("[[cards.override]]\ncard = 0\npcie_width = 3", "pcie_width must be 1, 2, 4, 8 or 16"),
        ("[[cards.override]]\ncard = 0\npcie_gen = 7", "pcie_gen must be 1-5"),
        ("[[cards.override]]\ncard = 0\nbehind_chipset = 1", "behind_chipset must be true or false"),
        ("[[cards.override]]\ncard = 0\npower_limit_w = 700", "power_limit_w must be 1-600"),
        ("[[cards.override]]\ncard = 0\nfan = 1", "unknown key 'cards.override[0].fan'"),
    ],
)
def test_bad_scenario_is_a_one_line_value_error_naming_the_file(tmp_path, text, fragment):
    path = write(tmp_path, text)
    with pytest.raises(ValueError) as caught:
        load_scenario(path)
    message = str(caught.value)
    assert message.startswith(f"scenario {path}: ")
    assert fragment in message
    assert "\n" not in message


def test_missing_scenario_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match=r"nope\.toml: cannot read it"):
        load_scenario(tmp_path / "nope.toml")


# -- open_source -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    "demo, environ, cards",
    [
        (True, {}, 8),
        (str(EXAMPLE), {}, 4),
        (EXAMPLE, {}, 4),
        (None, {"BOARD_SIMULATE": "1"}, 8),
        (None, {"BOARD_SIMULATE": "true"}, 8),
        (None, {"BOARD_SIMULATE": "TRUE"}, 8),
        (None, {"BOARD_SIMULATE": str(EXAMPLE)}, 4),
        (True, {"BOARD_SIMULATE": str(EXAMPLE)}, 8),  # the explicit argument wins
    ],
)
def test_open_source_picks_the_simulated_fleet(demo, environ, cards):
    source = open_source(demo, environ=environ, clock=lambda: 3.0)
    snapshot = source.read()
    assert source.simulated is True
    assert len(snapshot.cards) == cards
    assert snapshot.taken_at == 3.0
    source.close()


@pytest.mark.parametrize("demo, environ", [("missing.toml", {}), (None, {"BOARD_SIMULATE": "missing.toml"})])
def test_open_source_with_a_bad_scenario_raises_value_error(demo, environ):
    with pytest.raises(ValueError, match="missing.toml"):
        open_source(demo, environ=environ)


# -- import hygiene --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "code",
    [
        "import app.gpu",
        # The demo never needs NVML or psutil either.
        "import app.gpu; app.gpu.open_source(True).read()",
    ],
)
def test_app_gpu_imports_no_textual_pynvml_or_psutil(code):
    check = f"{code}; import sys; print(sorted({{'textual', 'pynvml', 'psutil'}} & set(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_visible_processes_have_a_start_time_before_the_source_started():
    from app.gpu.simulated import SimulatedSource

    cards = SimulatedSource(clock=lambda: 1_000_000.0).read().cards
    processes = [p for card in cards for p in card.processes]
    visible = [p for p in processes if p.user is not None]
    assert visible and all(1_000_000.0 - 6 * 3600 <= p.started_at < 1_000_000.0 for p in visible)
    assert all(p.started_at is None for p in processes if p.user is None)  # a hidden PID: unknown


# -- the box's health: versions, links, power (issue 23) --------------------------------------


def test_default_fleet_is_a_healthy_box():
    snapshot = read_at(1000.0)
    assert (snapshot.driver_version, snapshot.cuda_version) == ("575.57.08", "12.9")
    for card in snapshot.cards:
        assert (card.pcie_gen, card.pcie_width, card.pcie_max_gen, card.pcie_max_width) == (5, 16, 5, 16)
        assert card.behind_chipset is False and card.persistence is True
        assert card.compute_capability == "12.0"
        assert (card.power_limit_w, card.power_default_w, card.power_max_w) == (575.0, 575.0, 600.0)
        assert card.serial == f"1652025{card.index:06d}" and card.slot == str(card.index + 1)
        assert card.numa_node == card.index // 4  # one NUMA node per switch
    assert len({c.serial for c in snapshot.cards}) == 8


def test_a_job_split_over_cards_sends_more_pcie_traffic_than_one_alone():
    """alice's 41001 spans cards 0 and 1; bob's server on card 2 is alone: per point of load, the split sends 15x."""
    for t in (1000.0, 1234.0, 5000.0):
        cards = read_at(t).cards
        for index, per_point in ((0, 300.0), (1, 300.0), (2, 20.0)):
            card = cards[index]
            assert card.pcie_tx_mib_s == pytest.approx(card.utilization_pct * per_point)
            assert card.pcie_rx_mib_s == pytest.approx(0.9 * card.pcie_tx_mib_s)
        assert cards[3].pcie_tx_mib_s == 0.0  # nothing runs there


def test_scenario_system_capability_and_one_card_that_differs(tmp_path):
    path = write(tmp_path, """
[system]
driver = "565.57.01"
cuda = "12.7"
[cards]
count = 8
compute_capability = "12.0"
[[cards.override]]
card = 5
pcie_width = 4
pcie_gen = 3
behind_chipset = true
power_limit_w = 500
serial = "SN-X"
slot = "SLOT7"
""")
    snapshot = SimulatedSource(load_scenario(path), clock=lambda: 1000.0).read()
    assert (snapshot.driver_version, snapshot.cuda_version) == ("565.57.01", "12.7")
    five, four = snapshot.cards[5], snapshot.cards[4]
    assert (five.pcie_gen, five.pcie_width, five.pcie_max_gen, five.pcie_max_width) == (3, 4, 5, 16)
    assert (five.behind_chipset, five.power_limit_w, five.power_default_w, five.serial, five.slot) == (
        True, 500.0, 575.0, "SN-X", "SLOT7")
    assert (four.pcie_width, four.behind_chipset, four.power_limit_w, four.slot) == (16, False, 575.0, "5")


def test_power_limits_and_persistence_change_on_the_simulated_fleet():
    source = SimulatedSource(clock=lambda: 1000.0)
    source.set_persistence(3, False)
    source.set_power_limit(3, 500)
    card = source.read().cards[3]
    assert (card.persistence, card.power_limit_w, card.power_default_w) == (False, 500.0, 575.0)
    with pytest.raises(ValueError, match="outside"):
        source.set_power_limit(3, 601)
