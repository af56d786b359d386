"""The box's own health, as pure rules over a fleet snapshot: driver and CUDA against the cards' architecture, each
card's PCIe link and power limit against the [power] policy, the chassis table's CUDA numbering, the topology
matrix, and whether a group of cards crosses a PCIe switch or NUMA node.

`board doctor`, `board cards`, `board topo` and the booking plan's notes print what these return.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from app.gpu.model import LINK_MULTIPLE, LINK_NAMES, CardReading, FleetSnapshot, Topology


@dataclass(frozen=True, slots=True)
class Minimum:
    driver: str  # the oldest Linux driver branch that runs it
    cuda: str  # the first CUDA release that compiles for it
    arch: str  # CMAKE_CUDA_ARCHITECTURES for llama.cpp


# The published minimums by compute capability (NVIDIA's CUDA release notes, "CUDA Toolkit and minimum required
# driver version"): the first CUDA that targets each architecture and the driver that CUDA needs.
MINIMUMS = {
    "12.0": Minimum("570", "12.8", "120"),  # Blackwell consumer: RTX 5090, RTX PRO 6000
    "10.0": Minimum("570", "12.8", "100"),  # Blackwell datacenter: B200
    "9.0": Minimum("520", "11.8", "90"),  # Hopper: H100, H200
    "8.9": Minimum("520", "11.8", "89"),  # Ada: RTX 4090, L40S
    "8.6": Minimum("455", "11.1", "86"),  # Ampere consumer: RTX 3090, A40
    "8.0": Minimum("450", "11.0", "80"),  # Ampere datacenter: A100
    "7.5": Minimum("410", "10.0", "75"),  # Turing: RTX 2080, T4
    "7.0": Minimum("384", "9.0", "70"),  # Volta: V100
}

Check = tuple[bool | None, str]  # (True ok, False a failure to fix, None a warning), one line


def version(text: str | None) -> tuple[int, ...] | None:
    """ "570.86.15" -> (570, 86, 15); None for what is not a dotted number."""
    if not text:
        return None
    try:
        return _dotted(text.strip())
    except ValueError:
        return None


def _dotted(text: str) -> tuple[int, ...]:
    """ "570.86.15" -> (570, 86, 15); ValueError for what is not a dotted number (MINIMUMS' versions all are)."""
    return tuple(int(part) for part in text.split("."))


def card_list(indexes: Iterable[int]) -> str:
    """Card numbers as people write them: 0-3,5."""
    found = sorted(set(indexes))
    runs: list[list[int]] = []
    for i in found:
        if runs and i == runs[-1][-1] + 1:
            runs[-1].append(i)
        else:
            runs.append([i])
    return ",".join(str(r[0]) if len(r) == 1 else f"{r[0]}-{r[-1]}" for r in runs)


def by_capability(cards: Sequence[CardReading]) -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for card in cards:
        if card.compute_capability and not card.lost:
            found.setdefault(card.compute_capability, []).append(card.index)
    return found


def driver_checks(snapshot: FleetSnapshot) -> list[Check]:
    """The driver and the CUDA version it supports, against each architecture among the cards."""
    checks: list[Check] = []
    driver, cuda = version(snapshot.driver_version), version(snapshot.cuda_version)
    for capability, indexes in sorted(by_capability(snapshot.cards).items()):
        cards = f"compute capability {capability} (cards {card_list(indexes)})"
        need = MINIMUMS.get(capability)
        if need is None:
            checks.append((None, f"{cards}: not in board's table of minimums; check NVIDIA's CUDA release notes"))
            continue
        ok = True
        if driver is not None and driver < _dotted(need.driver):
            ok = False
            checks.append((False, f"driver {snapshot.driver_version} is too old for {cards}: it needs {need.driver}"
                                  f" or newer; install the {need.driver} driver (or newer) and reboot"))
        if cuda is not None and cuda < _dotted(need.cuda):
            ok = False
            checks.append((False, f"CUDA {snapshot.cuda_version} (what the driver supports) is too old for {cards}: it"
                                  f" needs {need.cuda}; install driver {need.driver}+ and CUDA toolkit {need.cuda}+, then"
                                  f" rebuild llama.cpp with -DCMAKE_CUDA_ARCHITECTURES={need.arch}"))
        if driver is None or cuda is None:
            ok = False
            checks.append((None, f"{cards}: the driver did not say its version (driver {snapshot.driver_version},"
                                 f" CUDA {snapshot.cuda_version}); check nvidia-smi"))
        if ok:
            checks.append((True, f"driver {snapshot.driver_version} and CUDA {snapshot.cuda_version} support {cards}"
                                 f" (needs driver {need.driver}+, CUDA {need.cuda}+)"))
    return checks


def _where(card: CardReading) -> str:
    return f"card {card.index}" + (f" (slot {card.slot})" if card.slot else "")


def link_checks(cards: Sequence[CardReading]) -> list[Check]:
    """Per card: a link narrower or slower than the card can run, and a card behind the chipset. The generation is
    judged only under load: an idle card drops its link to Gen 1 to save power, which is no fault."""
    checks: list[Check] = []
    for card in cards:
        if card.lost:
            continue
        if card.pcie_width is not None and card.pcie_max_width and card.pcie_width < card.pcie_max_width:
            checks.append((None, f"{_where(card)}: PCIe x{card.pcie_width} of its x{card.pcie_max_width}; multi-card"
                                 " work will crawl: move it to a full-width slot wired to the CPU"))
        idle = not card.utilization_pct
        if card.pcie_gen is not None and card.pcie_max_gen and card.pcie_gen < card.pcie_max_gen and not idle:
            checks.append((None, f"{_where(card)}: PCIe Gen {card.pcie_gen} of its Gen {card.pcie_max_gen} under"
                                 " load: check the slot's and riser's generation (BIOS, the riser's rating)"))
        if card.behind_chipset:
            checks.append((None, f"{_where(card)}: behind the chipset (PCH), sharing its one uplink to the CPU: move"
                                 " it to a slot wired to the CPU"))
    if not checks and cards:
        checks.append((True, f"PCIe links: every card at its full width, none behind the chipset"
                             f" (cards {card_list(c.index for c in cards if not c.lost)})"))
    return checks


DRIFT_W = 1.0  # NVML keeps milliwatts; a limit within a watt of the policy is the policy


def drifted(limit_w: float | None, policy_w: float | None) -> bool:
    """Whether a card's power limit is off its [power] policy (`board power`'s DRIFT, doctor's power check)."""
    return limit_w is not None and policy_w is not None and abs(limit_w - policy_w) >= DRIFT_W


def power_checks(cards: Sequence[CardReading], policy_w: Callable[[int], float | None]) -> list[Check]:
    """Per card with a [power] policy (`policy_w`: PowerSettings.policy_w): a limit off it is a warning. The limits
    do not survive a reboot: board-power.service sets them at boot, so a drift is a change since, or a boot unit
    that did not run. No policy, or no card whose limit the driver reports: no line."""
    watched = [c for c in cards if not c.lost and c.power_limit_w is not None and policy_w(c.index) is not None]
    checks: list[Check] = []
    for card in watched:
        policy = policy_w(card.index)
        if drifted(card.power_limit_w, policy):
            checks.append((None, f"{_where(card)}: power limit {card.power_limit_w:.0f} W, not the [power] policy's"
                                 f" {policy:.0f} W: it drifted since boot (board-power.service sets it at boot; check"
                                 " systemctl status board-power), board power apply (as an admin) sets it now"))
    if not checks and watched:
        checks.append((True, f"power limits: every card at the [power] policy (cards {card_list(c.index for c in watched)})"))
    return checks


def cuda_indexes(cards: Sequence[CardReading]) -> dict[int, int]:
    """Card index -> CUDA device number in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID, which board run sets)."""
    ordered = sorted((c for c in cards if c.pci_bus_id), key=lambda c: (c.pci_bus_id or "").lower())
    return {card.index: n for n, card in enumerate(ordered)}


def topo_matrix(snapshot: FleetSnapshot) -> dict:
    """What `nvidia-smi topo -m` prints for the GPUs: level names between every pair, and each card's NUMA node."""
    indexes = [c.index for c in snapshot.cards]
    matrix = [[LINK_NAMES.get(snapshot.topology.level(a, b), "SYS") for b in indexes] for a in indexes]
    return {"cards": indexes, "matrix": matrix, "numa": [c.numa_node for c in snapshot.cards]}


def close_order(snapshot: FleetSnapshot) -> list[int]:
    """The cards grouped by closeness (NUMA node, then switch, then bus): the order to give llama.cpp."""
    groups: list[list[int]] = []
    for card in sorted(snapshot.cards, key=lambda c: (c.numa_node if c.numa_node is not None else 1 << 30,
                                                      (c.pci_bus_id or "").lower())):
        for group in groups:
            if snapshot.topology.level(group[0], card.index) <= LINK_MULTIPLE:
                group.append(card.index)
                break
        else:
            groups.append([card.index])
    return [i for group in groups for i in group]


def group_crossing(topology: Topology, cards: Sequence[CardReading], chosen: Iterable[int]) -> str | None:
    """A note when a group of cards spans PCIe switches or NUMA nodes: its traffic crosses the CPU. None if close."""
    chosen = sorted(set(chosen))
    notes = []
    if any(topology.level(a, b) > LINK_MULTIPLE for a in chosen for b in chosen if a < b):
        notes.append("cross a PCIe switch")
    numa = {c.numa_node for c in cards if c.index in chosen and c.numa_node is not None}
    if len(numa) > 1:
        notes.append(f"span NUMA nodes {','.join(map(str, sorted(numa)))}")
    if not notes:
        return None
    return (f"cards {card_list(chosen)} {' and '.join(notes)}: traffic between them goes through the CPU;"
            " prefer --split-mode layer")
