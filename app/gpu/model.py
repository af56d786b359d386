"""The one shape every telemetry backend returns: immutable snapshots, no behaviour."""

from __future__ import annotations

from collections.abc import Mapping
from typing import NotRequired, TypedDict

import msgspec

# Link levels between two cards, as NVML's nvmlDeviceGetTopologyCommonAncestor reports them.
# Lower is closer. Two cards under one PCIe switch are SINGLE or MULTIPLE; across CPU sockets SYSTEM.
LINK_INTERNAL = 0
LINK_SINGLE = 10
LINK_MULTIPLE = 20
LINK_HOSTBRIDGE = 30
LINK_NODE = 40
LINK_SYSTEM = 50

# NVML's clocks event (throttle) reason bits (nvmlClocksEventReason*); the ones the history names.
THROTTLE_IDLE = 0x1
THROTTLE_SW_POWER_CAP = 0x4
THROTTLE_HW_SLOWDOWN = 0x8
THROTTLE_SW_THERMAL = 0x20
THROTTLE_HW_THERMAL = 0x40
THROTTLE_HW_POWER_BRAKE = 0x80
# "Thermal throttling" in the seeds' sense: the card slowed itself for heat (or the board's HW slowdown).
THROTTLE_THERMAL = THROTTLE_HW_SLOWDOWN | THROTTLE_SW_THERMAL | THROTTLE_HW_THERMAL

# nvidia-smi topo -m's names for the LINK_* levels.
LINK_NAMES = {LINK_INTERNAL: "X", LINK_SINGLE: "PIX", LINK_MULTIPLE: "PXB", LINK_HOSTBRIDGE: "PHB", LINK_NODE: "NODE",
              LINK_SYSTEM: "SYS"}
# One direction of a PCIe link, MiB/s, per lane, by generation (after the line code: 8b/10b to Gen 2, 128b/130b on).
PCIE_LANE_MIB_S = {1: 238.4, 2: 476.8, 3: 939.0, 4: 1878.0, 5: 3756.0, 6: 7512.0}


def link_capacity_mib_s(gen: int | None, width: int | None) -> float | None:
    """One direction's capacity of a link of `gen` and `width` lanes, or None if either is unknown."""
    if gen is None or width is None or gen not in PCIE_LANE_MIB_S:
        return None
    return PCIE_LANE_MIB_S[gen] * width


def running_link_mib_s(card) -> float | None:
    """One direction's capacity of the card's link as it runs under load, or None if unknown: an idle card drops its
    link's generation, so an idle card's is its maximum generation's."""
    gen = card.pcie_gen if card.utilization_pct else (card.pcie_max_gen or card.pcie_gen)
    return link_capacity_mib_s(gen, card.pcie_width)


# msgspec Structs, not dataclasses: they are defined in C, where six frozen dataclasses cost ~4.5 ms to define on every
# start-up that reads the cards (board status in file mode). Change one with msgspec.structs.replace.
class GpuProcess(msgspec.Struct, frozen=True):
    pid: int
    used_mib: int | None
    user: str | None  # None: psutil cannot see the PID (a container's namespace); shown "container/unknown"
    uid: int | None
    command: str  # raw command line from another user: display it inert
    started_at: float | None = None  # epoch seconds; None where the PID is hidden (a container)
    container: str | None = None  # the container it runs in (short id from its cgroup, or a scenario's name)


class CardReading(msgspec.Struct, frozen=True):
    index: int
    uuid: str
    name: str | None = None
    memory_total_mib: int | None = None
    memory_used_mib: int | None = None
    utilization_pct: int | None = None
    temperature_c: int | None = None
    power_w: float | None = None
    power_limit_w: float | None = None
    pci_bus_id: str | None = None
    lost: bool = False  # NVML says the GPU fell off the bus (Xid 79)
    processes: tuple[GpuProcess, ...] = ()
    label: str | None = None  # slot or serial from a scenario; the NVML backend leaves it for the config
    sm_clock_mhz: int | None = None
    throttle_reasons: int | None = None  # NVML's clocks event (throttle) reason bits, THROTTLE_* below
    # Where the card sits and what it may draw (the chassis table, board doctor, board power).
    serial: str | None = None
    slot: str | None = None  # the physical slot's name, from /sys/bus/pci/slots
    numa_node: int | None = None
    pcie_gen: int | None = None  # the link now; a card at idle drops its generation to save power
    pcie_width: int | None = None
    pcie_max_gen: int | None = None  # what the card itself can do (not what the slot allows)
    pcie_max_width: int | None = None
    behind_chipset: bool | None = None  # its upstream path goes through the chipset (PCH), not a CPU root port
    pcie_tx_mib_s: float | None = None  # PCIe traffic now (nvmlDeviceGetPcieThroughput)
    pcie_rx_mib_s: float | None = None
    power_default_w: float | None = None
    power_max_w: float | None = None
    persistence: bool | None = None
    compute_capability: str | None = None  # "12.0" for Blackwell consumer cards (sm_120)
    # NVML's total energy counter: millijoules since the driver loaded (it starts again at a reload); None where the
    # card has none (NotSupported before Volta, on some GeForce), and the history integrates the power instead.
    energy_mj: int | None = None


class GpuEvent(msgspec.Struct, frozen=True):
    """Something a card reported between reads (GpuSource.events): an Xid with its code, or (simulated only) an
    out-of-memory exit with its log line in `detail`."""

    kind: str  # "xid" or "oom"
    uuid: str
    ts: float  # epoch seconds
    code: int | None = None
    detail: str = ""


class Topology(msgspec.Struct, frozen=True):
    """Which cards are close. `links[(a, b)]` with a < b is a LINK_* level; missing pairs are LINK_SYSTEM."""

    links: dict[tuple[int, int], int] = msgspec.field(default_factory=dict)

    def level(self, a: int, b: int) -> int:
        if a == b:
            return LINK_INTERNAL
        return self.links.get((min(a, b), max(a, b)), LINK_SYSTEM)


class FleetSnapshot(msgspec.Struct, frozen=True):
    taken_at: float  # epoch seconds
    simulated: bool
    cards: tuple[CardReading, ...]
    topology: Topology
    driver_version: str | None = None
    cuda_version: str | None = None  # the newest CUDA the driver supports ("12.8")


class HostSnapshot(msgspec.Struct, frozen=True):
    """Another host's cards, as its service last published them; `down_since` (its last heartbeat) when it is late."""

    host: str
    snapshot: FleetSnapshot
    down_since: float | None = None


# The wire's typed dicts are written in TypedDict's call form: its types are objects, where the class form's
# annotations are strings here (from __future__) that typing compiles one by one, 2 ms on every start-up.

# A process on a card, on the wire: a GpuProcess's fields (in the order `board status --json` shows them).
WireProcess = TypedDict("WireProcess", {
    "pid": int, "user": str | None, "used_mib": int | None, "command": str, "container": str | None,
    "uid": int | None, "started_at": float | None,
})

# One card on the wire, the one shape of a card for every reader: the `fleet` operation and event carry it
# (card_to_wire: the reading's fields), `board status` a view of it (app.core.cardstate.status_view) with who is on
# it and what it is for: the fields NotRequired, which the fleet leaves out (FLEET_LEAVES_OUT) and
# app.core.cardstate.status_card fills. What `board status` leaves out it names (app.core.cardstate.STATUS_LEAVES_OUT),
# so a field added here reaches both or is left out of one by name. In the order `board status --json` shows a card.
WireCard = TypedDict("WireCard", {
    "host": NotRequired[str],  # the host the card is on
    "index": int,
    "uuid": str,
    "name": str | None,
    "label": str | None,  # the scenario's slot or serial; in a status, the config's label, else that
    "memory_total_mib": int | None,
    "memory_used_mib": int | None,
    "utilization_pct": int | None,
    "temperature_c": int | None,
    "power_w": float | None,
    "power_limit_w": float | None,
    "pci_bus_id": str | None,
    "state": NotRequired[str],  # FREE, BOOKED, IN USE, SQUATTED or LOST (app.core.cardstate)
    "pcie_tx_mib_s": float | None,  # PCIe traffic now (nvmlDeviceGetPcieThroughput)
    "pcie_rx_mib_s": float | None,
    "warnings": NotRequired[list[str]],  # HOT, FULL
    "users": NotRequired[list[str]],  # who runs processes on it, in first-seen order
    "booking": NotRequired[Mapping[str, object] | None],  # the booking holding it now (app.model.BookingWire)
    "next_booking": NotRequired[Mapping[str, object] | None],
    "processes": list[WireProcess],
    "host_down": NotRequired[bool],  # on a down host's cards only: its heartbeat is late
    "down_since": NotRequired[float],  # with host_down: its last heartbeat
    "lost": bool,
    "sm_clock_mhz": int | None,
    "throttle_reasons": int | None,
    "serial": str | None,
    "slot": str | None,
    "numa_node": int | None,
    "pcie_gen": int | None,
    "pcie_width": int | None,
    "pcie_max_gen": int | None,
    "pcie_max_width": int | None,
    "behind_chipset": bool | None,
    "power_default_w": float | None,
    "power_max_w": float | None,
    "persistence": bool | None,
    "compute_capability": str | None,
    "energy_mj": int | None,  # NVML's total energy counter, millijoules since the driver loaded
})

# What the `fleet` operation and event leave out of a card: who is on it, which the board works out from its own
# bookings (app.core.cardstate), and a host's being down, which the event says per host.
FLEET_LEAVES_OUT = WireCard.__optional_keys__

# A FleetSnapshot on the wire: the `fleet` operation's reply and event, and a host's heartbeat row (app.store.hosts).
WireSnapshot = TypedDict("WireSnapshot", {
    "taken_at": float, "simulated": bool, "driver_version": str | None, "cuda_version": str | None,
    "cards": list[WireCard],
    "links": list[list[int]],  # [a, b, LINK_* level] for each pair Topology.links names
})


def card_to_wire(card: CardReading) -> WireCard:
    """A reading as the one wire card, less what FLEET_LEAVES_OUT names (app.core.cardstate.status_card adds it)."""
    return {
        "index": card.index, "uuid": card.uuid, "name": card.name, "label": card.label,
        "memory_total_mib": card.memory_total_mib, "memory_used_mib": card.memory_used_mib,
        "utilization_pct": card.utilization_pct, "temperature_c": card.temperature_c, "power_w": card.power_w,
        "power_limit_w": card.power_limit_w, "pci_bus_id": card.pci_bus_id,
        "pcie_tx_mib_s": card.pcie_tx_mib_s, "pcie_rx_mib_s": card.pcie_rx_mib_s,
        "processes": [{"pid": p.pid, "user": p.user, "used_mib": p.used_mib, "command": p.command,
                       "container": p.container, "uid": p.uid, "started_at": p.started_at} for p in card.processes],
        "lost": card.lost, "sm_clock_mhz": card.sm_clock_mhz, "throttle_reasons": card.throttle_reasons,
        "serial": card.serial, "slot": card.slot, "numa_node": card.numa_node, "pcie_gen": card.pcie_gen,
        "pcie_width": card.pcie_width, "pcie_max_gen": card.pcie_max_gen, "pcie_max_width": card.pcie_max_width,
        "behind_chipset": card.behind_chipset, "power_default_w": card.power_default_w,
        "power_max_w": card.power_max_w, "persistence": card.persistence, "compute_capability": card.compute_capability,
        "energy_mj": card.energy_mj,
    }


def hosts_to_wire(hosts) -> list[dict]:
    """(host, snapshot, down_since) of each other host, as the `fleet` event carries them."""
    return [{"host": host, "down_since": down_since, "snapshot": snapshot_to_wire(snapshot)}
            for host, snapshot, down_since in hosts]


def hosts_from_wire(data: list[dict]) -> tuple[HostSnapshot, ...]:
    return tuple(HostSnapshot(h["host"], snapshot_from_wire(h["snapshot"]), h.get("down_since")) for h in data)


def snapshot_to_wire(snapshot: FleetSnapshot) -> WireSnapshot:
    return {
        "taken_at": snapshot.taken_at, "simulated": snapshot.simulated, "driver_version": snapshot.driver_version,
        "cuda_version": snapshot.cuda_version, "cards": [card_to_wire(card) for card in snapshot.cards],
        "links": [[a, b, level] for (a, b), level in snapshot.topology.links.items()],
    }


def snapshot_from_wire(data: dict) -> FleetSnapshot:
    cards = tuple(
        CardReading(**{**card, "processes": tuple(GpuProcess(**p) for p in card["processes"])})
        for card in data["cards"]
    )
    links = {(a, b): level for a, b, level in data["links"]}
    return FleetSnapshot(data["taken_at"], data["simulated"], cards, Topology(links), data.get("driver_version"),
                         data.get("cuda_version"))


def sample(taken_at: float, card: CardReading) -> list:
    """One sparkline point: when, VRAM in GiB, utilisation, temperature and power in W (0 where the driver said
    nothing)."""
    return [taken_at, (card.memory_used_mib or 0) / 1024, float(card.utilization_pct or 0),
            float(card.temperature_c or 0), float(card.power_w or 0)]
