"""A simulated fleet for demos, tests and screenshots: lively, yet deterministic for a given clock.

Every live value is a smooth function of the injected clock and the card index (sines with a
per-card phase, plus the load of the card's processes), so two reads at the same clock
value return equal snapshots, and a frozen clock gives a frozen screen.

The default fleet is the team's server: 8 x NVIDIA GeForce RTX 5090, 32607 MiB, 575 W, two
PCIe switches / NUMA nodes (cards 0-3 and 4-7), a few users' processes, card 7 running hot.

Scenario files
--------------
A scenario TOML describes a whole fleet; every section is optional. Without ``[cards]`` it has
the default 8 cards; without ``[[processes]]`` it has no processes; without ``[faults]`` no faults.

    [cards]
    count = 4                          # 1..64, default 8
    name = "NVIDIA GeForce RTX 4090"   # default "NVIDIA GeForce RTX 5090"
    memory_total_mib = 24564           # default 32607
    power_limit_w = 450                # default 575
    switches = 2                       # PCIe switches, cards split in order; default 2 (1 for one card)
    labels = ["slot 1", "slot 2"]      # optional, by card index; may be shorter than count
    compute_capability = "12.0"        # default "12.0" (Blackwell consumer cards, sm_120)

    [[cards.override]]                 # one card differs from the rest
    card = 5                           # required
    pcie_width = 4                     # the link's width now (default 16: the card's own is always x16)
    pcie_gen = 3                       # the link's generation now (default 5, the card's own)
    behind_chipset = true              # default false: every card on a CPU root port
    power_limit_w = 500                # this card's limit now ([cards] power_limit_w stays its default)
    serial = "1652025000999"           # default 16520250000NN, NN the index
    slot = "SLOT7"                     # default "1".."8", the index plus one

    [system]
    driver = "565.57.01"               # default "575.57.08"
    cuda = "12.7"                      # the CUDA version the driver supports; default "12.9"

    [[processes]]                      # one table per process per card
    card = 0                           # required
    pid = 41001                        # required
    used_mib = 22000                   # VRAM; omitted: NVML could not say (None)
    user = "alice"                     # omitted: a PID psutil cannot see, "container/unknown"
    uid = 1001                         # optional; omitted, the process is matched to bookings by its user name
    command = "python train.py"        # optional, default ""

    [faults]
    lost = [3]                         # cards that fell off the bus (LOST)
    hot = [7]                          # cards that run at 91-93 degrees C
    stall_seconds = 2.5                # every read() sleeps this long (a hung driver)

    [[faults.field_error]]             # an NVML error on one field: it reads None ("n/a")
    card = 1
    field = "temperature"              # name, memory_total, memory_used, utilization, temperature,
                                       # power, power_limit, pci_bus_id, processes, sm_clock,
                                       # throttle_reasons

    xid = [{card = 3, code = 79, at = 30}]        # Xid events, `at` seconds after the source starts (default 0)
    oom = [{card = 2, at = 60}]                   # a server on the card exits with llama.cpp's out-of-memory line
    throttle = [{card = 5, at = 10, seconds = 120}]  # HW slowdown for that long

Each card's NUMA node is its switch's number, and its maximum power limit its default plus 25 W (an RTX
5090: 575 W, 600 W). A card's PCIe traffic follows its load: a process that spans several cards (tensor or
layer split) sends more. The defaults are a healthy box: driver and CUDA new enough, x16 Gen 5 everywhere, on the
CPU's root ports, persistence mode on.

Unknown keys, wrong types and card indexes out of range raise ValueError with a one-line
message that names the file. See app/gpu/scenarios/example.toml.
"""

from __future__ import annotations

import math
import os
import re
import threading
import time
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from msgspec import structs

from app.gpu.model import (
    LINK_MULTIPLE,
    LINK_SYSTEM,
    THROTTLE_HW_SLOWDOWN,
    THROTTLE_IDLE,
    THROTTLE_SW_THERMAL,
    CardReading,
    FleetSnapshot,
    GpuEvent,
    GpuProcess,
    Topology,
    link_capacity_mib_s,
)

DEFAULT_NAME = "NVIDIA GeForce RTX 5090"
DEFAULT_MEMORY_TOTAL_MIB = 32607
DEFAULT_POWER_LIMIT_W = 575.0
DRIVER_VERSION = "575.57.08"
CUDA_VERSION = "12.9"
DEFAULT_COMPUTE_CAPABILITY = "12.0"
POWER_HEADROOM_W = 25.0  # the maximum limit over the default (RTX 5090: 575 -> 600 W)
# PCIe traffic per utilisation point, MiB/s each way: a card's own job loads its weights and little else; a job
# split over several cards passes activations (and all-reduces) across the links all the time.
TRAFFIC_ALONE_MIB_S = 20.0
TRAFFIC_SPLIT_MIB_S = 300.0

# Scenario field names -> the CardReading attribute an NVML error blanks.
FIELDS = {
    "name": "name",
    "memory_total": "memory_total_mib",
    "memory_used": "memory_used_mib",
    "utilization": "utilization_pct",
    "temperature": "temperature_c",
    "power": "power_w",
    "power_limit": "power_limit_w",
    "pci_bus_id": "pci_bus_id",
    "processes": "processes",
    "sm_clock": "sm_clock_mhz",
    "throttle_reasons": "throttle_reasons",
    "energy": "energy_mj",  # a card without NVML's energy counter (before Volta): the history integrates the power
}

SM_BOOST_MHZ = 2407  # an RTX 5090's boost clock
SM_IDLE_MHZ = 180


@dataclass(frozen=True, slots=True)
class SimCard:
    name: str = DEFAULT_NAME
    memory_total_mib: int = DEFAULT_MEMORY_TOTAL_MIB
    power_limit_w: float = DEFAULT_POWER_LIMIT_W
    switch: int = 0  # cards under one PCIe switch are close (LINK_MULTIPLE); also its NUMA node
    label: str | None = None
    power_default_w: float = DEFAULT_POWER_LIMIT_W
    serial: str | None = None
    slot: str | None = None
    pcie_gen: int = 5
    pcie_width: int = 16
    behind_chipset: bool = False
    compute_capability: str = DEFAULT_COMPUTE_CAPABILITY


@dataclass(frozen=True, slots=True)
class Scenario:
    cards: tuple[SimCard, ...]
    processes: tuple[tuple[int, GpuProcess], ...] = ()  # (card index, process)
    lost: frozenset[int] = frozenset()
    hot: frozenset[int] = frozenset()
    field_errors: frozenset[tuple[int, str]] = frozenset()  # (card index, FIELDS key)
    stall_seconds: float = 0.0
    xids: tuple[tuple[int, int, float], ...] = ()  # (card index, Xid code, seconds after start)
    ooms: tuple[tuple[int, float], ...] = ()  # (card index, seconds after start)
    throttles: tuple[tuple[int, float, float], ...] = ()  # (card index, from, seconds), after start
    driver_version: str = DRIVER_VERSION
    cuda_version: str = CUDA_VERSION


# The demo team's UIDs, so that simulated processes agree with a seeded demo database.
DEMO_UIDS = {"alice": 1001, "bob": 1002, "carol": 1003, "dave": 1004, "erin": 1005}


def demo_uid(user: str) -> int:
    """A stable made-up UID for a simulated user name (the simulated users need not exist)."""
    return DEMO_UIDS.get(user, 2000 + zlib.crc32(user.encode()) % 8000)


def _uuid_prefix(host: str) -> str:
    """The UUIDs' stem: today's without a [fleet] host (demo databases and snapshots stay valid), else one of the
    host's own, as real cards' UUIDs are unique across hosts."""
    if not host:
        return "GPU-5090sim-0000-0000-0000"
    import hashlib  # start-up: only a simulated fleet with a named host loads hashlib

    digest = hashlib.sha256(host.encode()).hexdigest()
    return f"GPU-5090sim-{digest[:4]}-{digest[4:8]}-{digest[8:12]}"


def _age(pid: int) -> float:
    """How long a scenario's process had been running when the source started: 10 min to 6 h, by PID."""
    return 600 + pid * 7919 % 21000


def _process(pid: int, used_mib: int | None, user: str | None, command: str = "") -> GpuProcess:
    return GpuProcess(pid, used_mib, user, None if user is None else demo_uid(user), command)


def _cards(count: int, switches: int, card: SimCard = SimCard()) -> tuple[SimCard, ...]:
    return tuple(replace(card, switch=i * switches // count, serial=f"1652025{i:06d}", slot=str(i + 1))
                 for i in range(count))


_TRAIN = "python train.py --config llama3-8b-lora.yaml"
DEFAULT_FLEET = Scenario(
    cards=_cards(8, 2),
    processes=(
        (0, _process(41001, 22000, "alice", _TRAIN)),
        (1, _process(41001, 22000, "alice", _TRAIN)),
        (2, _process(41207, 24500, "bob", "llama-server -m /models/qwen2.5-14b-q4_k_m.gguf --port 8081")),
        (5, _process(42310, 9000, "dave", "python eval.py --shard 3")),
        (6, _process(51999, 4096, None)),  # a container's PID: psutil cannot see it
    ),
    hot=frozenset({7}),
)


class SimulatedSource:
    simulated = True

    def __init__(
        self,
        scenario: Scenario = DEFAULT_FLEET,
        *,
        clock: Callable[[], float] = time.time,
        sleep: Callable[[float], None] = time.sleep,
        host: str = "",
    ) -> None:
        self.scenario = scenario
        self._uuid_prefix = _uuid_prefix(host)
        self._clock = clock
        self._sleep = sleep
        self._processes: dict[int, tuple[GpuProcess, ...]] = {}
        born = self._born = clock()
        # Events still to come, in time order: (due at, event kind, card index, Xid code).
        self._pending = sorted([(born + at, "xid", card, code) for card, code, at in scenario.xids]
                               + [(born + at, "oom", card, None) for card, at in scenario.ooms])
        for index, process in scenario.processes:
            if process.user is not None and process.started_at is None:  # a hidden PID has no known start
                process = structs.replace(process, started_at=born - _age(process.pid))
            self._processes[index] = self._processes.get(index, ()) + (process,)
        self._extra: dict[int, tuple[GpuProcess, ...]] = {}
        # What board power apply changes: the limits and persistence mode, per card.
        self._limits = {i: card.power_limit_w for i, card in enumerate(scenario.cards)}
        self._persistence = dict.fromkeys(range(len(scenario.cards)), True)
        # NVML's energy counter, integrated from each card's own power between reads (trapezoids): (when, W, mJ).
        self._energy: dict[int, tuple[float, float, float]] = {}
        self._energy_lock = threading.Lock()  # two threads reading at once must not count one stretch twice
        cards = scenario.cards
        self._topology = Topology(
            {
                (a, b): LINK_MULTIPLE if cards[a].switch == cards[b].switch else LINK_SYSTEM
                for a in range(len(cards))
                for b in range(a + 1, len(cards))
            }
        )

    def set_extra_processes(self, mapping: Mapping[int, tuple[GpuProcess, ...]]) -> None:
        """Processes started at runtime (demo llama-servers), by card; replaces the previous set."""
        for index in mapping:
            if not 0 <= index < len(self.scenario.cards):
                raise ValueError(f"no simulated card {index}")
        # One assignment, so a read on another thread sees the old set or the new one, never half.
        self._extra = {index: tuple(processes) for index, processes in mapping.items()}

    def set_power_limit(self, index: int, watts: float) -> None:
        card = self.scenario.cards[index]
        if not 0 < watts <= card.power_default_w + POWER_HEADROOM_W:
            raise ValueError(f"card {index}: {watts:g} W is outside 1-{card.power_default_w + POWER_HEADROOM_W:g} W")
        self._limits = {**self._limits, index: float(watts)}

    def set_persistence(self, index: int, on: bool) -> None:
        self._persistence = {**self._persistence, index: on}

    def read(self) -> FleetSnapshot:
        if self.scenario.stall_seconds:
            self._sleep(self.scenario.stall_seconds)
        now = self._clock()
        extra = self._extra
        cards = tuple(
            self._card(i, spec, now, self._processes.get(i, ()) + extra.get(i, ()))
            for i, spec in enumerate(self.scenario.cards)
        )
        return FleetSnapshot(
            taken_at=now, simulated=True, cards=cards, topology=self._topology,
            driver_version=self.scenario.driver_version, cuda_version=self.scenario.cuda_version,
        )

    def events(self, timeout_s: float) -> list[GpuEvent]:
        """The scenario's Xid events and OOM exits that have come due; waits `timeout_s` when none has."""
        now = self._clock()
        due = [event for event in self._pending if event[0] <= now]
        if not due:
            self._sleep(timeout_s)
            return []
        self._pending = self._pending[len(due):]
        return [GpuEvent(kind, self._uuid(index), ts, code=code,
                         detail="" if code is not None else "ggml_cuda: cudaMalloc failed: out of memory")
                for ts, kind, index, code in due]

    def close(self) -> None:
        pass

    def _all_processes(self) -> dict[int, tuple[GpuProcess, ...]]:
        extra = self._extra
        return {i: self._processes.get(i, ()) + extra.get(i, ()) for i in range(len(self.scenario.cards))}

    def _count_energy(self, index: int, now: float, watts: float) -> int:
        """The card's energy counter at `now`, in mJ: the last reading's plus the trapezoid since it (a clock that
        went back adds nothing). A card's counter starts at 0 when the source does, as NVML's at the driver's load."""
        with self._energy_lock:
            at, before, total = self._energy.get(index, (now, watts, 0.0))
            if now >= at:
                total += (before + watts) / 2 * (now - at) * 1000
                self._energy[index] = (now, watts, total)
            return int(total)

    def _uuid(self, index: int) -> str:
        return f"{self._uuid_prefix}-{index:012d}"

    def _card(self, index: int, spec: SimCard, now: float, processes: tuple[GpuProcess, ...]) -> CardReading:
        limit = self._limits[index]
        static = CardReading(
            index=index,
            uuid=self._uuid(index),
            name=spec.name,
            memory_total_mib=spec.memory_total_mib,
            power_limit_w=limit,
            pci_bus_id=f"00000000:{index + 1:02X}:00.0",
            label=spec.label,
            serial=spec.serial,
            slot=spec.slot,
            numa_node=spec.switch,
            pcie_gen=spec.pcie_gen,
            pcie_width=spec.pcie_width,
            pcie_max_gen=5,
            pcie_max_width=16,
            behind_chipset=spec.behind_chipset,
            power_default_w=spec.power_default_w,
            power_max_w=spec.power_default_w + POWER_HEADROOM_W,
            persistence=self._persistence[index],
            compute_capability=spec.compute_capability,
        )
        if index in self.scenario.lost:
            return structs.replace(static, lost=True)
        phase = 1.7 * index  # so that the cards do not move in lockstep
        utilization = round(55 + 40 * math.sin(now / 17 + phase)) if processes else 0  # 15..95
        if index in self.scenario.hot:
            temperature = round(92 + math.sin(now / 23 + phase))  # 91..93: the HOT warning
        else:
            temperature = round(37 + 0.35 * utilization + 2 * math.sin(now / 41 + phase))  # 35..74
        power = 22 + (limit - 22) * 0.8 * utilization / 100 + 3 * math.sin(now / 7 + phase)
        driver_baseline = 400 + 100 * math.sin(now / 29 + phase)  # 300..500 MiB, CUDA context and such
        used = round(driver_baseline) + sum(p.used_mib or 0 for p in processes)
        # Idle cards clock down; a hot card at 92 degrees C or more slows itself (software thermal slowdown).
        throttle = 0 if utilization else THROTTLE_IDLE
        sm_clock = round(SM_BOOST_MHZ - 3 * (100 - utilization)) if utilization else SM_IDLE_MHZ
        if temperature >= 92:
            throttle |= THROTTLE_SW_THERMAL
            sm_clock -= 400
        if any(i == index and 0 <= now - self._born - at < seconds for i, at, seconds in self.scenario.throttles):
            throttle |= THROTTLE_HW_SLOWDOWN
            sm_clock = min(sm_clock, SM_BOOST_MHZ // 2)
        split = any(p.pid == q.pid for i, others in self._all_processes().items() if i != index
                    for p in processes for q in others)
        tx = utilization * (TRAFFIC_SPLIT_MIB_S if split else TRAFFIC_ALONE_MIB_S)
        capacity = link_capacity_mib_s(spec.pcie_gen, spec.pcie_width) or tx
        tx = min(tx, 0.9 * capacity)  # a narrow link carries less, not more than it can
        reading = structs.replace(
            static,
            pcie_tx_mib_s=round(tx, 1),
            pcie_rx_mib_s=round(0.9 * tx, 1),
            memory_used_mib=min(used, spec.memory_total_mib),
            utilization_pct=utilization,
            temperature_c=temperature,
            power_w=round(power, 1),
            processes=processes,
            sm_clock_mhz=sm_clock,
            throttle_reasons=throttle,
            energy_mj=self._count_energy(index, now, round(power, 1)),
        )
        blanked: dict[str, Any] = {FIELDS[f]: () if f == "processes" else None
                                   for i, f in self.scenario.field_errors if i == index}
        return structs.replace(reading, **blanked)


# -- scenario files -------------------------------------------------------------------------


class _Bad(Exception):
    """A problem in a scenario; load_scenario adds the file name."""


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)  # TOML true is not a card count


_INT = ("an integer", _is_int)
_NUMBER = ("a number", lambda v: _is_int(v) or isinstance(v, float))
_STR = ("a string", lambda v: isinstance(v, str))
_INTS = ("a list of integers", lambda v: isinstance(v, list) and all(map(_is_int, v)))
_STRS = ("a list of strings", lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v))
_TABLE = ("a table", lambda v: isinstance(v, dict))
_TABLES = ("an array of tables", lambda v: isinstance(v, list) and all(isinstance(x, dict) for x in v))

_SCHEMA_TOP = {"cards": _TABLE, "processes": _TABLES, "faults": _TABLE, "system": _TABLE}
_BOOL = ("true or false", lambda v: isinstance(v, bool))
_SCHEMA_SYSTEM = {"driver": _STR, "cuda": _STR}
_SCHEMA_OVERRIDE = {"card": _INT, "pcie_width": _INT, "pcie_gen": _INT, "behind_chipset": _BOOL,
                    "power_limit_w": _NUMBER, "serial": _STR, "slot": _STR}
_SCHEMA_CARDS = {
    "count": _INT,
    "name": _STR,
    "memory_total_mib": _INT,
    "power_limit_w": _NUMBER,
    "switches": _INT,
    "labels": _STRS,
    "compute_capability": _STR,
    "override": _TABLES,
}
_SCHEMA_PROCESS = {"card": _INT, "pid": _INT, "used_mib": _INT, "user": _STR, "uid": _INT, "command": _STR,
                   "container": _STR}
_SCHEMA_FAULTS = {"lost": _INTS, "hot": _INTS, "stall_seconds": _NUMBER, "field_error": _TABLES, "xid": _TABLES,
                  "oom": _TABLES, "throttle": _TABLES}
_SCHEMA_XID = {"card": _INT, "code": _INT, "at": _NUMBER}
_SCHEMA_OOM = {"card": _INT, "at": _NUMBER}
_SCHEMA_THROTTLE = {"card": _INT, "at": _NUMBER, "seconds": _NUMBER}
_SCHEMA_FIELD_ERROR = {"card": _INT, "field": _STR}


_VERSION = re.compile(r"^\d+(\.\d+)*$")
_CAPABILITY = re.compile(r"^\d+\.\d$")


def _check(table: dict[str, Any], where: str, schema: dict[str, Any], required: tuple[str, ...] = ()) -> None:
    for key, value in table.items():
        if key not in schema:
            raise _Bad(f"unknown key '{where}{key}' (expected one of: {', '.join(schema)})")
        kind, ok = schema[key]
        if not ok(value):
            raise _Bad(f"{where}{key} must be {kind}, not {value!r}")
    for key in required:
        if key not in table:
            raise _Bad(f"{where}{key} is missing")


def load_scenario(path: str | os.PathLike[str]) -> Scenario:
    """Read and validate a scenario TOML; any problem is a one-line ValueError naming the file."""
    import tomllib  # only for scenario files; the default fleet's quick commands skip it

    try:
        with open(path, "rb") as f:
            data = tomllib.load(f)
        return parse_scenario(data)
    except OSError as exc:
        raise ValueError(f"scenario {os.fspath(path)}: cannot read it ({exc.strerror})") from None
    except (tomllib.TOMLDecodeError, _Bad) as exc:
        raise ValueError(f"scenario {os.fspath(path)}: {exc}") from None


def parse_scenario(data: dict[str, Any]) -> Scenario:
    """Build a Scenario from parsed TOML. Raises _Bad (load_scenario turns it into ValueError)."""
    _check(data, "", _SCHEMA_TOP)
    cards = _parse_cards(data.get("cards", {}))
    count = len(cards)

    def card_index(value: int, where: str) -> int:
        if not 0 <= value < count:
            raise _Bad(f"{where} {value} is out of range (cards are 0-{count - 1})")
        return value

    processes = []
    for n, table in enumerate(data.get("processes", [])):
        where = f"processes[{n}]."
        _check(table, where, _SCHEMA_PROCESS, required=("card", "pid"))
        index = card_index(table["card"], f"{where}card")
        if table["pid"] <= 0:
            raise _Bad(f"{where}pid must be positive")
        if table.get("used_mib", 0) < 0:
            raise _Bad(f"{where}used_mib must not be negative")
        # Without a uid the process is matched by its user's name, as the card's state is: a made-up uid would make
        # the person running the demo a stranger to their own process.
        processes.append((index, GpuProcess(table["pid"], table.get("used_mib"), table.get("user"), table.get("uid"),
                                            table.get("command", ""), container=table.get("container"))))

    faults = data.get("faults", {})
    _check(faults, "faults.", _SCHEMA_FAULTS)
    lost = frozenset(card_index(i, "faults.lost card") for i in faults.get("lost", []))
    hot = frozenset(card_index(i, "faults.hot card") for i in faults.get("hot", []))
    stall = float(faults.get("stall_seconds", 0.0))
    if stall < 0:
        raise _Bad("faults.stall_seconds must not be negative")
    field_errors = set()
    for n, table in enumerate(faults.get("field_error", [])):
        where = f"faults.field_error[{n}]."
        _check(table, where, _SCHEMA_FIELD_ERROR, required=("card", "field"))
        if table["field"] not in FIELDS:
            raise _Bad(f"{where}field {table['field']!r} is not one of: {', '.join(FIELDS)}")
        field_errors.add((card_index(table["card"], f"{where}card"), table["field"]))

    def timed(name: str, schema: dict, required: tuple[str, ...]) -> list[tuple[int, dict]]:
        found = []
        for n, table in enumerate(faults.get(name, [])):
            where = f"faults.{name}[{n}]."
            _check(table, where, schema, required=required)
            for key in ("at", "seconds", "code"):
                if table.get(key, 0) < 0:
                    raise _Bad(f"{where}{key} must not be negative")
            found.append((card_index(table["card"], f"{where}card"), table))
        return found

    xids = tuple((i, t["code"], float(t.get("at", 0))) for i, t in timed("xid", _SCHEMA_XID, ("card", "code")))
    ooms = tuple((i, float(t.get("at", 0))) for i, t in timed("oom", _SCHEMA_OOM, ("card",)))
    throttles = tuple((i, float(t.get("at", 0)), float(t["seconds"]))
                      for i, t in timed("throttle", _SCHEMA_THROTTLE, ("card", "seconds")))

    system = data.get("system", {})
    _check(system, "system.", _SCHEMA_SYSTEM)
    for key in ("driver", "cuda"):
        if key in system and not _VERSION.match(system[key]):
            raise _Bad(f"system.{key} must be a version such as 570.86.15 or 12.8, not {system[key]!r}")
    return Scenario(
        driver_version=system.get("driver", DRIVER_VERSION),
        cuda_version=system.get("cuda", CUDA_VERSION),
        cards=cards,
        processes=tuple(processes),
        lost=lost,
        hot=hot,
        field_errors=frozenset(field_errors),
        stall_seconds=stall,
        xids=xids,
        ooms=ooms,
        throttles=throttles,
    )


def _parse_cards(table: dict[str, Any]) -> tuple[SimCard, ...]:
    _check(table, "cards.", _SCHEMA_CARDS)
    count = table.get("count", 8)
    if not 1 <= count <= 64:
        raise _Bad(f"cards.count must be 1-64, not {count}")
    switches = table.get("switches", min(2, count))
    if not 1 <= switches <= count:
        raise _Bad(f"cards.switches must be 1-{count}, not {switches}")
    labels = table.get("labels", [])
    if len(labels) > count:
        raise _Bad(f"cards.labels has {len(labels)} entries for {count} cards")
    for key in ("memory_total_mib", "power_limit_w"):
        if table.get(key, 1) <= 0:
            raise _Bad(f"cards.{key} must be positive")
    capability = table.get("compute_capability", DEFAULT_COMPUTE_CAPABILITY)
    if not _CAPABILITY.match(capability):
        raise _Bad(f"cards.compute_capability must be MAJOR.MINOR such as 12.0, not {capability!r}")
    power = float(table.get("power_limit_w", DEFAULT_POWER_LIMIT_W))
    card = SimCard(
        name=table.get("name", DEFAULT_NAME),
        memory_total_mib=table.get("memory_total_mib", DEFAULT_MEMORY_TOTAL_MIB),
        power_limit_w=power,
        power_default_w=power,
        compute_capability=capability,
    )
    cards = list(_cards(count, switches, card))
    cards = [replace(c, label=labels[i]) if i < len(labels) else c for i, c in enumerate(cards)]
    for n, override in enumerate(table.get("override", [])):
        where = f"cards.override[{n}]."
        _check(override, where, _SCHEMA_OVERRIDE, required=("card",))
        index = override["card"]
        if not 0 <= index < count:
            raise _Bad(f"{where}card {index} is out of range (cards are 0-{count - 1})")
        if override.get("pcie_width", 16) not in (1, 2, 4, 8, 16):
            raise _Bad(f"{where}pcie_width must be 1, 2, 4, 8 or 16, not {override['pcie_width']}")
        if not 1 <= override.get("pcie_gen", 5) <= 5:
            raise _Bad(f"{where}pcie_gen must be 1-5, not {override['pcie_gen']}")
        limit = override.get("power_limit_w", cards[index].power_limit_w)
        if not 0 < limit <= cards[index].power_default_w + POWER_HEADROOM_W:
            raise _Bad(f"{where}power_limit_w must be 1-{cards[index].power_default_w + POWER_HEADROOM_W:g}, not {limit}")
        changes = {k: v for k, v in override.items() if k != "card"}
        cards[index] = replace(cards[index], **{**changes, "power_limit_w": float(limit)})
    return tuple(cards)


def replay(source, now: float, seconds: float, step: float) -> list:
    """The last `seconds` of a simulated fleet, which is a pure function of the clock; [] for real GPUs."""
    scenario = getattr(source, "scenario", None)
    if not source.simulated or scenario is None:
        return []
    moment = [now - seconds]
    again = SimulatedSource(replace(scenario, stall_seconds=0.0), clock=lambda: moment[0])
    samples = []
    while moment[0] < now:
        samples.append(again.read())
        moment[0] += step
    return samples
