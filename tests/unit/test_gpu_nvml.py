"""The NVML backend against a fake pynvml (tests/fakes/fake_pynvml.py) and the real psutil."""

from __future__ import annotations

import inspect
import os
import pwd
import sys
from pathlib import Path

import psutil
import pytest

from app.gpu import LINK_MULTIPLE, LINK_SYSTEM, NoDriverError, open_source
from app.gpu.nvml import NvmlSource

# The pytest console script does not put the repository root on sys.path; tests.fakes needs it.
if str(ROOT := Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes import fake_pynvml  # noqa: E402
from tests.fakes.fake_pynvml import MIB  # noqa: E402
from tests.fakes.fake_pynvml import FakeGpu, FakeProcess, FakePynvml  # noqa: E402

NO_DRIVER = "no NVIDIA driver found; use --demo to explore a simulated server"
INVISIBLE_PID = 2**30 + 12345  # above any pid_max: psutil cannot see it, like a PID in another namespace


def make_gpus(count: int) -> list[FakeGpu]:
    return [
        FakeGpu(
            uuid=f"GPU-{i:08x}-aaaa-bbbb-cccc-dddddddddddd",
            bus_id=f"00000000:{i + 1:02X}:00.0",
            memory_used=(1000 + i) * MIB,
            utilization=10 * i,
            temperature=40 + i,
            power_mw=100_000 + 1500 * i,
            power_limit_mw=575_000,
            switch=i * 2 // count,
        )
        for i in range(count)
    ]


@pytest.fixture
def install(monkeypatch):
    """install(gpus) -> the fake module, placed where `import pynvml` finds it."""

    def _install(gpus: list[FakeGpu]) -> FakePynvml:
        fake = FakePynvml(gpus)
        monkeypatch.setitem(sys.modules, "pynvml", fake)
        return fake

    return _install


@pytest.fixture
def fake(install) -> FakePynvml:
    return install(make_gpus(4))


# -- the fake is faithful to the installed nvidia-ml-py --------------------------------------


@pytest.fixture(scope="module")
def real_pynvml():
    # Importing pynvml loads no library (that happens in nvmlInit), so this is safe anywhere.
    return pytest.importorskip("pynvml")


@pytest.mark.parametrize("name", fake_pynvml.API)
def test_fake_functions_have_the_real_signatures(real_pynvml, name):
    fake_sig = inspect.signature(getattr(FakePynvml([]), name))
    real_sig = inspect.signature(getattr(real_pynvml, name))
    assert list(fake_sig.parameters) == list(real_sig.parameters)


@pytest.mark.parametrize("name", sorted(fake_pynvml.CONSTANTS))
def test_fake_constants_match_the_real_ones(real_pynvml, name):
    assert getattr(real_pynvml, name) == fake_pynvml.CONSTANTS[name]


@pytest.mark.parametrize("name", sorted(fake_pynvml.ERROR_CLASSES))
def test_fake_error_classes_exist_in_the_real_module(real_pynvml, name):
    real_class = getattr(real_pynvml, name)
    fake_class = fake_pynvml.ERROR_CLASSES[name]
    assert issubclass(real_class, real_pynvml.NVMLError)
    assert real_pynvml.NVMLError(fake_class().value).__class__ is real_class
    assert fake_pynvml.NVMLError(fake_class().value).__class__ is fake_class


# -- a normal read ---------------------------------------------------------------------------


@pytest.mark.parametrize("count", [2, 4, 8])
def test_normal_read_converts_units_and_reads_topology(install, count):
    fake = install(make_gpus(count))
    source = NvmlSource(clock=lambda: 1234.5)
    snapshot = source.read()

    assert snapshot.simulated is False and source.simulated is False
    assert snapshot.taken_at == 1234.5
    assert snapshot.driver_version == "575.57.08"
    assert [c.index for c in snapshot.cards] == list(range(count))
    for i, card in enumerate(snapshot.cards):
        assert card.uuid == fake.gpus[i].uuid
        assert card.name == "NVIDIA GeForce RTX 5090"
        assert card.pci_bus_id == fake.gpus[i].bus_id
        assert card.memory_total_mib == 32607
        assert card.memory_used_mib == 1000 + i
        assert card.utilization_pct == 10 * i
        assert card.temperature_c == 40 + i
        assert card.power_w == pytest.approx(100 + 1.5 * i)
        assert card.power_limit_w == 575.0
        assert card.lost is False
    half = count // 2  # the fake puts the first half of the cards under one switch
    expected = {
        (a, b): LINK_MULTIPLE if a // half == b // half else LINK_SYSTEM
        for a in range(count)
        for b in range(a + 1, count)
    }
    assert snapshot.topology.links == expected


def test_init_and_slow_fields_happen_once_across_many_reads(fake):
    source = NvmlSource()
    for _ in range(5):
        source.read()
    assert fake.calls["nvmlInit"] == 1
    assert fake.calls["nvmlDeviceGetHandleByIndex"] == 4
    for slow in ("nvmlDeviceGetName", "nvmlDeviceGetUUID", "nvmlDeviceGetPciInfo", "nvmlDeviceGetSerial",
                 "nvmlDeviceGetPowerManagementDefaultLimit", "nvmlDeviceGetCudaComputeCapability"):
        assert fake.calls[slow] == 4, slow
    assert fake.calls["nvmlDeviceGetTopologyCommonAncestor"] == 6  # every pair, once
    assert fake.calls["nvmlDeviceGetTemperature"] == 4 * 5  # live fields every read
    assert fake.calls["nvmlDeviceGetEnforcedPowerLimit"] == 4 * 5  # board power apply changes it: read every time
    source.close()
    source.close()
    assert fake.calls["nvmlShutdown"] == 1


def test_live_values_follow_the_driver(fake):
    source = NvmlSource()
    source.read()
    fake.gpus[0].temperature = 88
    fake.gpus[0].memory_used = 30000 * MIB
    card = source.read().cards[0]
    assert (card.temperature_c, card.memory_used_mib) == (88, 30000)


# -- per-field failures ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "function, error, attribute, expected",
    [
        ("nvmlDeviceGetTemperature", "NVMLError_NotSupported", "temperature_c", None),
        ("nvmlDeviceGetUtilizationRates", "NVMLError_FunctionNotFound", "utilization_pct", None),
        ("nvmlDeviceGetPowerUsage", "NVMLError_Unknown", "power_w", None),
        ("nvmlDeviceGetMemoryInfo", "NVMLError_NotSupported", "memory_used_mib", None),
        ("nvmlDeviceGetMemoryInfo", "NVMLError_NotSupported", "memory_total_mib", None),
        ("nvmlDeviceGetName", "NVMLError_Unknown", "name", None),
        ("nvmlDeviceGetPciInfo", "NVMLError_NotSupported", "pci_bus_id", None),
        ("nvmlDeviceGetComputeRunningProcesses", "NVMLError_NoPermission", "processes", ()),
        ("nvmlDeviceGetClockInfo", "NVMLError_NotSupported", "sm_clock_mhz", None),
        # The enforced limit is missing on older drivers: fall back to the management limit.
        ("nvmlDeviceGetEnforcedPowerLimit", "NVMLError_FunctionNotFound", "power_limit_w", 575.0),
    ],
)
def test_a_failing_field_reads_none_and_the_rest_still_works(fake, function, error, attribute, expected):
    fake.gpus[1].errors[function] = getattr(fake, error)
    fake.gpus[1].compute = [FakeProcess(INVISIBLE_PID, 100 * MIB)]
    snapshot = NvmlSource().read()

    broken, healthy = snapshot.cards[1], snapshot.cards[2]
    assert getattr(broken, attribute) == expected
    assert broken.lost is False
    assert broken.uuid == fake.gpus[1].uuid
    assert healthy.temperature_c == 42 and healthy.memory_used_mib == 1002 and healthy.name is not None


def test_sm_clock_and_throttle_reasons_are_read_with_the_older_name_as_a_fallback(fake):
    fake.gpus[0].sm_clock_mhz, fake.gpus[0].clocks_event_reasons = 1650, 0x20 | 0x4
    fake.gpus[1].clocks_event_reasons = 0x40
    fake.gpus[1].errors["nvmlDeviceGetCurrentClocksEventReasons"] = fake.NVMLError_FunctionNotFound
    fake.gpus[2].errors["nvmlDeviceGetCurrentClocksEventReasons"] = fake.NVMLError_FunctionNotFound
    fake.gpus[2].errors["nvmlDeviceGetCurrentClocksThrottleReasons"] = fake.NVMLError_NotSupported
    cards = NvmlSource().read().cards
    assert (cards[0].sm_clock_mhz, cards[0].throttle_reasons) == (1650, 0x24)
    assert cards[1].throttle_reasons == 0x40  # a driver before the "event" name
    assert cards[2].throttle_reasons is None


def test_power_limit_is_none_when_neither_query_works(fake):
    for function in ("nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPowerManagementLimit"):
        fake.gpus[0].errors[function] = fake.NVMLError_NotSupported
    assert NvmlSource().read().cards[0].power_limit_w is None


def test_unknown_topology_pair_reads_as_system(fake):
    fake.gpus[0].errors["nvmlDeviceGetTopologyCommonAncestor"] = fake.NVMLError_NotSupported
    topology = NvmlSource().read().topology
    assert topology.level(0, 1) == LINK_SYSTEM
    assert topology.level(2, 3) == LINK_MULTIPLE


# -- a lost GPU ------------------------------------------------------------------------------


def test_gpu_lost_while_running_marks_only_that_card_and_the_board_goes_on(fake):
    source = NvmlSource()
    source.read()
    fake.gpus[1].lost = True

    for _ in range(3):
        snapshot = source.read()
        lost, others = snapshot.cards[1], [snapshot.cards[i] for i in (0, 2, 3)]
        assert lost.lost is True
        assert lost.index == 1 and lost.uuid == fake.gpus[1].uuid
        assert lost.pci_bus_id == "00000000:02:00.0"  # kept from the cache: which slot to check
        assert (lost.temperature_c, lost.memory_used_mib, lost.processes) == (None, None, ())
        assert all(not c.lost and c.temperature_c is not None for c in others)
    # Sticky: the fallen card is not asked again on every tick.
    assert fake.calls["nvmlDeviceGetMemoryInfo"] == 4 + 4 + 3 * 3 + 1


def test_gpu_lost_before_start_is_lost_with_a_placeholder_uuid(fake):
    fake.gpus[2].lost = True
    snapshot = NvmlSource().read()
    assert snapshot.cards[2].lost is True
    assert snapshot.cards[2].uuid == "GPU-unknown-2"
    assert snapshot.topology.level(2, 3) == LINK_SYSTEM
    assert [c.lost for c in snapshot.cards] == [False, False, True, False]


# -- no driver -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "error", ["NVMLError_LibraryNotFound", "NVMLError_DriverNotLoaded", "NVMLError_NoPermission", "NVMLError_Unknown"]
)
def test_init_failure_is_no_driver_error(fake, error):
    fake.init_error = getattr(fake, error)
    with pytest.raises(NoDriverError) as caught:
        NvmlSource()
    assert str(caught.value) == NO_DRIVER


def test_missing_pynvml_package_is_no_driver_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes `import pynvml` raise ImportError
    with pytest.raises(NoDriverError, match=f"^{NO_DRIVER}$"):
        NvmlSource()


def test_open_source_picks_nvml_without_demo_and_reports_a_missing_driver(fake):
    fake.init_error = fake.NVMLError_DriverNotLoaded
    with pytest.raises(NoDriverError, match=f"^{NO_DRIVER}$"):
        open_source(environ={})


@pytest.mark.parametrize("environ", [{}, {"BOARD_SIMULATE": ""}, {"BOARD_SIMULATE": "0"}])
def test_open_source_reads_nvml_when_not_simulating(fake, environ):
    source = open_source(environ=environ, clock=lambda: 7.0)
    assert isinstance(source, NvmlSource)
    assert source.read().taken_at == 7.0


def test_demo_false_means_nvml_even_when_the_environment_says_simulate(fake):
    assert isinstance(open_source(False, environ={"BOARD_SIMULATE": "1"}), NvmlSource)


# -- processes and their owners --------------------------------------------------------------


def test_processes_get_their_owner_from_psutil(fake):
    fake.gpus[0].compute = [FakeProcess(os.getpid(), 512 * MIB)]
    (process,) = NvmlSource().read().cards[0].processes
    assert process.pid == os.getpid()
    assert process.used_mib == 512
    assert process.uid == os.getuid()
    assert process.user == pwd.getpwuid(os.getuid()).pw_name
    assert process.command == " ".join(psutil.Process().cmdline())
    assert process.started_at == psutil.Process().create_time()


def test_pid_psutil_cannot_see_is_unknown_but_counts_its_vram(fake):
    fake.gpus[0].compute = [FakeProcess(INVISIBLE_PID, 4096 * MIB)]
    (process,) = NvmlSource().read().cards[0].processes
    assert (process.user, process.uid, process.command, process.started_at) == (None, None, "", None)
    assert process.used_mib == 4096


def test_unknown_used_memory_is_none(fake):
    fake.gpus[0].compute = [FakeProcess(INVISIBLE_PID, None)]
    (process,) = NvmlSource().read().cards[0].processes
    assert process.used_mib is None


@pytest.mark.parametrize(
    "compute, graphics, expected",
    [
        ([(11, 100)], [(11, 100)], [(11, 100)]),  # CUDA + graphics in one process: one entry
        ([(11, None)], [(11, 300)], [(11, 300)]),  # the known figure wins
        ([(11, 100)], [(12, 200)], [(11, 100), (12, 200)]),
        ([], [(12, 200)], [(12, 200)]),
    ],
)
def test_compute_and_graphics_processes_are_merged_by_pid(fake, compute, graphics, expected):
    def procs(pairs):
        return [FakeProcess(INVISIBLE_PID + pid, None if mib is None else mib * MIB) for pid, mib in pairs]

    fake.gpus[0].compute, fake.gpus[0].graphics = procs(compute), procs(graphics)
    processes = NvmlSource().read().cards[0].processes
    assert [(p.pid - INVISIBLE_PID, p.used_mib) for p in processes] == expected


def test_process_owner_is_looked_up_once_per_process(fake, monkeypatch):
    looked_up = []
    real_cmdline = psutil.Process.cmdline
    monkeypatch.setattr(psutil.Process, "cmdline", lambda self: looked_up.append(self.pid) or real_cmdline(self))
    fake.gpus[0].compute = [FakeProcess(os.getpid(), MIB)]
    fake.gpus[1].compute = [FakeProcess(os.getpid(), MIB)]  # one process on two cards
    source = NvmlSource()
    for _ in range(3):
        source.read()
    assert looked_up == [os.getpid()]
