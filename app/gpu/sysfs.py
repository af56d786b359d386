"""Where a PCI device sits, from Linux's sysfs: its physical slot, NUMA node, link capability, and whether its
upstream path goes through the chipset.

NVML knows none of these well: its slot-less bus id says nothing of the chassis, and its "max link width" is what
the card and the slot allow together, so a x16 card in a x8 slot reads 8 of 8. sysfs gives the card's own
capability (max_link_width, max_link_speed: the LnkCap register). Also which container a process runs in, from
/proc/PID/cgroup. Every reader returns None where the kernel cannot say (not Linux, a container without /sys, a
device or process that vanished).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

SYSFS = Path("/sys")
_BDF = re.compile(r"^[0-9a-f]{4,8}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
# max_link_speed reads "32.0 GT/s PCIe"; the transfer rate names the generation.
_GEN_BY_GTS = {"2.5": 1, "5.0": 2, "8.0": 3, "16.0": 4, "32.0": 5, "64.0": 6}
_INTEL, _AMD = "0x8086", "0x1022"
# Intel's chipset (PCH) root ports sit on bus 00 at devices 1b-1d; the CPU's are 01, 06 and up to 0x0f.
_INTEL_PCH_DEVICES = {0x1B, 0x1C, 0x1D}


@dataclass(frozen=True, slots=True)
class Placement:
    slot: str | None = None
    numa_node: int | None = None
    max_gen: int | None = None
    max_width: int | None = None
    behind_chipset: bool | None = None


def sysfs_address(bus_id: str) -> str:
    """NVML's "00000000:01:00.0" as sysfs names it: "0000:01:00.0" (the domain as the kernel's %04x prints it: 4
    digits at least, so a VMD domain 0x10000 is "10000"; lower case)."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{domain.lstrip('0'):0>4}:{rest}"


def placement(bus_id: str | None, root: Path = SYSFS) -> Placement:
    if not bus_id:
        return Placement()
    address = sysfs_address(bus_id)
    device = root / "bus" / "pci" / "devices" / address
    if not device.exists():
        return Placement()
    numa = _read(device / "numa_node")
    width = _read(device / "max_link_width")
    speed = _read(device / "max_link_speed")
    return Placement(
        slot=_slot(address, root),
        numa_node=int(numa) if numa is not None and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
        max_gen=_GEN_BY_GTS.get(speed.split()[0]) if speed else None,
        max_width=int(width) if width is not None and width.isdigit() else None,
        behind_chipset=behind_chipset(upstream(device)),
    )


def upstream(device: Path) -> list[Path]:
    """The bridges above a device, from the root port down: the PCI addresses in its resolved sysfs path."""
    parts = Path(os.path.realpath(device)).parts
    chain = [i for i, part in enumerate(parts) if _BDF.match(part)]
    return [Path(*parts[: i + 1]) for i in chain[:-1]]


def behind_chipset(bridges: list[Path]) -> bool | None:
    """Whether the path from the CPU to the device crosses the chipset, which shares one narrow link (Intel's DMI,
    AMD's chipset uplink) among everything behind it. A heuristic over what sysfs shows: an Intel PCH root port
    (bus 00, device 1b-1d), or an AMD bridge below the root port (AMD CPUs have no PCIe switches of their own, so an
    AMD-made bridge there is the chipset; a plain PCIe switch is Broadcom/PLX or Microchip). None: no bridge seen."""
    if not bridges:
        return None
    root_port = bridges[0]
    vendor = _read(root_port / "vendor")
    bus, device = root_port.name.split(":")[1], int(root_port.name.split(":")[2].split(".")[0], 16)
    if vendor == _INTEL and bus == "00" and device in _INTEL_PCH_DEVICES:
        return True
    return any(_read(bridge / "vendor") == _AMD for bridge in bridges[1:])


def _slot(address: str, root: Path) -> str | None:
    """The physical slot whose address is this device's (slots list "0000:01:00", without the function)."""
    slots = root / "bus" / "pci" / "slots"
    try:
        entries = sorted(slots.iterdir())
    except OSError:
        return None
    wanted = address.rsplit(".", 1)[0]
    for entry in entries:
        if _read(entry / "address") == wanted:
            return entry.name
    return None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


# A container's cgroup names its 64-hex id: /system.slice/docker-<id>.scope (systemd), /docker/<id> (cgroupfs),
# libpod-<id> (podman), cri-containerd-<id> and crio-<id> (Kubernetes).
_CONTAINER = re.compile(r"(?:docker|libpod|cri-containerd|crio)[-/]([0-9a-f]{64})(?:\.scope)?(?:/|$)")


def container_in_cgroup(text: str) -> str | None:
    """The short (12-hex, as `docker ps` shows it) id of the container a /proc/PID/cgroup file puts its process in."""
    for line in text.splitlines():
        found = _CONTAINER.search(line.split(":", 2)[-1])
        if found:
            return found.group(1)[:12]
    return None


def container_of(pid: int, proc: Path = Path("/proc")) -> str | None:
    """Which container a process runs in (its short id), or None: not in one, or its /proc is out of sight."""
    text = _read(proc / str(pid) / "cgroup")
    return None if text is None else container_in_cgroup(text)
