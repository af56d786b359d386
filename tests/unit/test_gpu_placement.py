"""Where each card sits and what it may draw: the NVML backend's new fields against the fake pynvml and a sysfs
tree in tmp_path, and the readers of sysfs and /proc/PID/cgroup."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from app.gpu.nvml import NvmlSource
from app.gpu.sysfs import behind_chipset, container_in_cgroup, container_of, placement, sysfs_address, upstream

if str(ROOT := Path(__file__).resolve().parents[2]) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.fakes.fake_pynvml import FakeGpu, FakePynvml  # noqa: E402

CONTAINER = "3f4e8a9b2c1d" + "0" * 52


def pci_tree(root: Path, chain: list[tuple[str, str]], *, slot: str | None = None, numa: int = 1,
             max_width: int = 16, speed: str = "32.0 GT/s PCIe", current_width: int = 8) -> None:
    """A device at the end of `chain` (address, vendor of each bridge from the root port down, then the device). Its
    link now is an idle card's: Gen 1 (2.5 GT/s), and narrower than its maximum (a x8 slot)."""
    where = root / "devices" / "pci0000:00"
    for address, vendor in chain:
        where = where / address
        where.mkdir(parents=True)
        (where / "vendor").write_text(vendor + "\n")
    (where / "numa_node").write_text(f"{numa}\n")
    (where / "max_link_width").write_text(f"{max_width}\n")
    (where / "max_link_speed").write_text(speed + "\n")
    (where / "current_link_width").write_text(f"{current_width}\n")
    (where / "current_link_speed").write_text("2.5 GT/s PCIe\n")
    devices = root / "bus" / "pci" / "devices"
    devices.mkdir(parents=True, exist_ok=True)
    os.symlink(where, devices / chain[-1][0])
    if slot is not None:
        (root / "bus" / "pci" / "slots" / slot).mkdir(parents=True)
        (root / "bus" / "pci" / "slots" / slot / "address").write_text(chain[-1][0].rsplit(".", 1)[0] + "\n")


def test_bus_ids_are_named_as_sysfs_names_them():
    assert sysfs_address("00000000:01:00.0") == "0000:01:00.0"
    assert sysfs_address("00000001:C1:00.0") == "0001:c1:00.0"


def test_a_domain_past_four_digits_keeps_them_and_a_sysfs_name_is_kept_as_is():
    """The kernel prints the domain with %04x: a VMD domain 0x10000 is "10000:e1:00.0" in sysfs, and a name sysfs
    already gives (4 digits) stays as it is.
    Wrong versions: the domain cut to its last 4 digits ("0000:e1:00.0", another card); cut from the front."""
    assert sysfs_address("00010000:E1:00.0") == "10000:e1:00.0"
    assert sysfs_address("0001:c1:00.0") == "0001:c1:00.0"
    assert sysfs_address("0000:01:00.0") == "0000:01:00.0"


def test_a_card_on_a_cpu_root_port_has_its_slot_numa_node_and_own_link_maxima(tmp_path):
    pci_tree(tmp_path, [("0000:00:01.1", "0x1022"), ("0000:01:00.0", "0x10de")], slot="3", numa=1, max_width=16)
    where = placement("00000000:01:00.0", tmp_path)
    assert (where.slot, where.numa_node, where.max_gen, where.max_width, where.behind_chipset) == ("3", 1, 5, 16, False)


@pytest.mark.parametrize(("chain", "expected"), [
    # AMD: root port, then an AMD bridge (the chipset's uplink, Promontory): behind the chipset.
    ([("0000:00:01.2", "0x1022"), ("0000:02:00.0", "0x1022"), ("0000:03:08.0", "0x1022"), ("0000:04:00.0", "0x10de")], True),
    # A Broadcom/PLX switch under the CPU's root port is not the chipset.
    ([("0000:00:01.1", "0x1022"), ("0000:01:00.0", "0x10b5"), ("0000:02:08.0", "0x10b5"), ("0000:03:00.0", "0x10de")], False),
    # Intel: a PCH root port (device 1c) against the CPU's (device 01).
    ([("0000:00:1c.4", "0x8086"), ("0000:05:00.0", "0x10de")], True),
    # the PCH's last root port (1d, read as hex) is the chipset; 1a is not one of its root ports
    ([("0000:00:1d.0", "0x8086"), ("0000:05:00.0", "0x10de")], True),
    ([("0000:00:1a.0", "0x8086"), ("0000:05:00.0", "0x10de")], False),
    # AMD: the chipset's bridge right under the root port, nothing below it
    ([("0000:00:01.2", "0x1022"), ("0000:02:00.0", "0x1022"), ("0000:03:00.0", "0x10de")], True),
    ([("0000:00:01.0", "0x8086"), ("0000:01:00.0", "0x10de")], False),
])
def test_behind_the_chipset_is_told_from_the_upstream_path(tmp_path, chain, expected):
    pci_tree(tmp_path, chain)
    device = tmp_path / "bus" / "pci" / "devices" / chain[-1][0]
    assert [b.name for b in upstream(device)] == [address for address, _ in chain[:-1]]
    assert behind_chipset(upstream(device)) is expected


@pytest.mark.parametrize(("speed", "gen"), [("2.5 GT/s PCIe", 1), ("5.0 GT/s PCIe", 2), ("8.0 GT/s PCIe", 3),
                                            ("16.0 GT/s PCIe", 4), ("32.0 GT/s PCIe", 5), ("64.0 GT/s PCIe", 6),
                                            ("Unknown", None)])
def test_the_maximum_generation_is_the_cards_link_capability_not_its_link_now(tmp_path, speed, gen):
    """The card idles at 2.5 GT/s x8 now (pci_tree); its maxima are read from max_link_speed and max_link_width.
    Nearest wrong versions:
    - current_link_speed/current_link_width read (Gen 1 x8 for every idle card)
    - a transfer rate mapped to the generation next to it"""
    pci_tree(tmp_path, [("0000:00:01.1", "0x1022"), ("0000:01:00.0", "0x10de")], max_width=16, speed=speed)
    where = placement("00000000:01:00.0", tmp_path)
    assert (where.max_gen, where.max_width) == (gen, 16)


def test_a_link_or_numa_node_the_kernel_cannot_tell_is_none(tmp_path):
    """No NUMA node reads -1; a device without max_link_speed/max_link_width files (no PCIe capability) has no maxima.
    Wrong versions: -1 taken as node -1; a missing file read as a value (a crash, or a number)."""
    pci_tree(tmp_path, [("0000:00:01.1", "0x1022"), ("0000:01:00.0", "0x10de")], numa=-1)
    device = tmp_path / "bus" / "pci" / "devices" / "0000:01:00.0"
    (device / "max_link_speed").unlink()
    (device / "max_link_width").unlink()
    where = placement("00000000:01:00.0", tmp_path)
    assert (where.numa_node, where.max_gen, where.max_width, where.behind_chipset) == (None, None, None, False)
    (device / "max_link_width").write_text("x16\n")
    (device / "numa_node").write_text("\n")
    where = placement("00000000:01:00.0", tmp_path)
    assert (where.numa_node, where.max_width) == (None, None)


def test_no_sysfs_entry_says_nothing(tmp_path):
    assert placement("00000000:01:00.0", tmp_path) == placement(None, tmp_path)
    assert placement("00000000:01:00.0", tmp_path).slot is None
    assert behind_chipset([]) is None


@pytest.mark.parametrize(("text", "expected"), [
    (f"0::/system.slice/docker-{CONTAINER}.scope\n", CONTAINER[:12]),
    (f"12:memory:/docker/{CONTAINER}\n11:cpu:/docker/{CONTAINER}\n", CONTAINER[:12]),
    (f"0::/machine.slice/libpod-{CONTAINER}.scope/container\n", CONTAINER[:12]),
    (f"0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-{CONTAINER}.scope\n", CONTAINER[:12]),
    ("0::/user.slice/user-1001.slice/session-4.scope\n", None),
    ("0::/\n", None),
    # the path (the third field) may itself hold a colon: only the first two split it
    (f"0::/system.slice/docker-{CONTAINER}.scope/app:1\n", CONTAINER[:12]),
    (f"1:name=systemd:/docker/{CONTAINER}/a:b:c\n", CONTAINER[:12]),
    ("0::/system.slice/docker-notanid.scope\n", None),
])
def test_the_container_is_read_from_the_cgroup(text, expected):
    assert container_in_cgroup(text) == expected


def test_container_of_a_pid_reads_its_proc_cgroup(tmp_path):
    (tmp_path / "4242").mkdir()
    (tmp_path / "4242" / "cgroup").write_text(f"0::/system.slice/docker-{CONTAINER}.scope\n")
    assert container_of(4242, tmp_path) == CONTAINER[:12]
    assert container_of(4243, tmp_path) is None  # gone, or out of sight
    assert container_of(os.getpid()) is None  # the tests themselves run in no container this matches


def test_nvml_reads_serial_link_power_range_persistence_and_versions(monkeypatch, tmp_path):
    gpus = [FakeGpu(uuid="GPU-a", bus_id="00000000:01:00.0", serial="1652025000007", pcie_gen=2, pcie_width=8,
                    pcie_max_width=8, pcie_tx_kib_s=2048 * 1024, pcie_rx_kib_s=512, persistence=1,
                    power_limit_mw=500_000, compute_capability=(12, 0)),
            FakeGpu(uuid="GPU-b", bus_id="00000000:02:00.0", compute_capability=(8, 9), pcie_gpu_max_gen=4)]
    fake = FakePynvml(gpus, cuda_version=12080)
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    # Card 0 sits in a x8 slot behind the chipset: NVML's max width says 8, the card's own (sysfs) 16.
    pci_tree(tmp_path, [("0000:00:1c.0", "0x8086"), ("0000:01:00.0", "0x10de")], slot="7", numa=0, max_width=16)
    snapshot = NvmlSource(sysfs=tmp_path).read()
    a, b = snapshot.cards
    assert snapshot.cuda_version == "12.8" and snapshot.driver_version == "575.57.08"
    assert (a.serial, a.slot, a.numa_node, a.behind_chipset) == ("1652025000007", "7", 0, True)
    assert (a.pcie_gen, a.pcie_width, a.pcie_max_gen, a.pcie_max_width) == (2, 8, 5, 16)
    assert (a.pcie_tx_mib_s, a.pcie_rx_mib_s) == (2048.0, 0.5)
    assert (a.power_limit_w, a.power_default_w, a.power_max_w, a.persistence) == (500.0, 575.0, 600.0, True)
    assert (a.compute_capability, b.compute_capability) == ("12.0", "8.9")
    # No sysfs entry: NVML's own answers (the card's max generation, the slot-capped width), no slot.
    assert (b.slot, b.numa_node, b.behind_chipset, b.pcie_max_gen, b.pcie_max_width, b.persistence) == (
        None, None, None, 4, 16, False)


def test_nvml_setters_change_the_card_and_say_no_without_permission(monkeypatch, tmp_path):
    fake = FakePynvml([FakeGpu()])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    source = NvmlSource(sysfs=tmp_path)
    source.set_persistence(0, True)
    source.set_power_limit(0, 500)
    card = source.read().cards[0]
    assert (card.persistence, card.power_limit_w) == (True, 500.0)
    fake.root = False
    with pytest.raises(fake.NVMLError_NoPermission):
        source.set_power_limit(0, 450)


def test_nvml_process_in_a_container_names_it(monkeypatch, tmp_path):
    """The container comes from the process's cgroup: here this test's own process, whose cgroup the reader sees
    through a stand-in /proc."""
    import app.gpu.nvml as nvml

    from tests.fakes.fake_pynvml import FakeProcess

    fake = FakePynvml([FakeGpu(compute=[FakeProcess(os.getpid(), 1024 * 1024 * 1024)])])
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    (tmp_path / str(os.getpid())).mkdir()
    (tmp_path / str(os.getpid()) / "cgroup").write_text(f"0::/system.slice/docker-{CONTAINER}.scope\n")
    monkeypatch.setattr(nvml, "container_of", lambda pid: container_of(pid, tmp_path))
    (process,) = NvmlSource(sysfs=tmp_path).read().cards[0].processes
    assert process.container == CONTAINER[:12]
