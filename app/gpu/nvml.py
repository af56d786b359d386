"""The real backend: NVML through nvidia-ml-py (`import pynvml`), process owners through psutil.

NVML is initialised once and the handles are kept. Fields that do not change while the
driver is loaded (name, UUID, VRAM total, PCI bus id, serial, slot, NUMA node, link maxima,
power range, compute capability, driver and CUDA versions, topology) are read once; each
`read()` asks only for the live ones. Every field is read on its own, so
a card that does not support one (NotSupported, FunctionNotFound, ...) shows it as None and
the rest still works. A card that falls off the bus (GpuIsLost, Xid 79) is marked lost and
the other cards keep reporting.
"""

from __future__ import annotations

import ctypes
import itertools
import pwd
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

from app.gpu import NoDriverError
from app.gpu.model import CardReading, FleetSnapshot, GpuEvent, GpuProcess, Topology
from app.gpu.sysfs import SYSFS, container_of, placement

_MIB = 1024 * 1024
_UNKNOWN_OWNER: tuple[str | None, int | None, str] = (None, None, "")


@dataclass(slots=True)
class _Card:
    """What is cached about one card between reads."""

    index: int
    handle: Any
    uuid: str
    name: str | None
    memory_total_mib: int | None
    pci_bus_id: str | None
    lost: bool
    static: dict[str, Any]  # the other fields read once: serial, slot, NUMA node, link maxima, power range, ...


class NvmlSource:
    """Not re-entrant: the board polls from one worker and never lets polls overlap."""

    simulated = False

    def __init__(self, *, clock: Callable[[], float] = time.time, sysfs: Path = SYSFS) -> None:
        # Imported here, not at module top, so that tests can put a fake in sys.modules first.
        try:
            import pynvml  # start-up: the driver's library loads when the source opens (tests put a fake first)
        except ImportError as exc:
            raise NoDriverError() from exc
        self._nv = pynvml
        self._clock = clock
        self._sysfs = sysfs
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # LibraryNotFound, DriverNotLoaded, NoPermission, a broken install
            raise NoDriverError() from exc
        try:
            count = pynvml.nvmlDeviceGetCount()
        except Exception as exc:
            self._shutdown()
            raise NoDriverError() from exc
        self._closed = False
        self._driver_version = _text(self._field(pynvml.nvmlSystemGetDriverVersion))
        cuda = self._field(pynvml.nvmlSystemGetCudaDriverVersion_v2)
        self._cuda_version = None if cuda is None else f"{cuda // 1000}.{cuda % 1000 // 10}"  # 12080 -> "12.8"
        self._cards = [self._open_card(i) for i in range(count)]
        self._topology = self._read_topology()
        # Owners of GPU processes by (pid, create_time): a reused PID gets a fresh look-up.
        self._owners: dict[tuple[int, float], tuple[str | None, int | None, str, str | None]] = {}
        self._owners_seen: set[tuple[int, float]] = set()
        self._events: Any = None  # the Xid event set, made by the first events(); False: no card supports it

    # -- the GpuSource interface ------------------------------------------------------------

    def read(self) -> FleetSnapshot:
        taken_at = self._clock()
        self._owners_seen = set()
        cards = tuple(self._read_card(card) for card in self._cards)
        # Forget processes that have exited, so the cache stays the size of what runs now.
        self._owners = {key: self._owners[key] for key in self._owners_seen}
        return FleetSnapshot(
            taken_at=taken_at,
            simulated=False,
            cards=cards,
            topology=self._topology,
            driver_version=self._driver_version,
            cuda_version=self._cuda_version,
        )

    def events(self, timeout_s: float) -> list[GpuEvent]:
        """The critical Xid events since the last call, waiting up to `timeout_s` for the first one.

        Called from one thread (the service's fault watcher); NVML itself is thread-safe, so reads go on meanwhile.
        """
        nv = self._nv
        if self._events is None:
            self._events = self._register_events()
        if self._events is False:
            time.sleep(timeout_s)  # no card reports Xid events: the caller still waits its turn
            return []
        found: list[GpuEvent] = []
        timeout_ms = max(0, round(timeout_s * 1000))
        while True:
            try:
                data = nv.nvmlEventSetWait_v2(self._events, 0 if found else timeout_ms)
            except nv.NVMLError_Timeout:
                return found
            except Exception:  # noqa: BLE001 - a failed wait (a lost card, the set freed at shutdown) ends this round
                if not found:
                    time.sleep(timeout_s)  # a wait that fails at once every time must not spin the caller's loop
                return found
            if int(data.eventType) & nv.nvmlEventTypeXidCriticalError:
                found.append(GpuEvent("xid", self._uuid_of(data.device), self._clock(), code=int(data.eventData)))

    def _register_events(self) -> Any:
        nv = self._nv
        try:
            event_set = nv.nvmlEventSetCreate()
        except Exception:  # noqa: BLE001 - no event API here: no Xid events, the rest still works
            return False
        registered = 0
        for card in self._cards:
            if card.handle is None or card.lost:
                continue
            try:
                nv.nvmlDeviceRegisterEvents(card.handle, nv.nvmlEventTypeXidCriticalError, event_set)
                registered += 1
            except Exception:  # noqa: BLE001 - NotSupported on this card (GeForce before Kepler, a vGPU)
                pass  # this card's Xids go unseen; the others still report
        if not registered:
            self._field(nv.nvmlEventSetFree, event_set)
            return False
        return event_set

    def _uuid_of(self, device: Any) -> str:
        """The card an event names; matched by handle, since a card that fell off the bus cannot tell its UUID."""
        address = _address(device)
        for card in self._cards:
            if card.handle is not None and _address(card.handle) == address:
                return card.uuid
        return _text(self._field(self._nv.nvmlDeviceGetUUID, device)) or "GPU-unknown"

    # -- changes (board power apply): each raises what NVML raised, NoPermission without CAP_SYS_ADMIN --------------

    def set_persistence(self, index: int, on: bool) -> None:
        nv = self._nv
        nv.nvmlDeviceSetPersistenceMode(self._handle(index), nv.NVML_FEATURE_ENABLED if on else nv.NVML_FEATURE_DISABLED)

    def set_power_limit(self, index: int, watts: float) -> None:
        self._nv.nvmlDeviceSetPowerManagementLimit(self._handle(index), round(watts * 1000))

    def _handle(self, index: int) -> Any:
        card = self._cards[index]
        if card.handle is None or card.lost:
            raise ValueError(f"card {index} cannot be reached (lost, or NVML gave no handle)")
        return card.handle

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            if self._events:
                self._field(self._nv.nvmlEventSetFree, self._events)
            self._shutdown()

    # -- slow fields, read once -------------------------------------------------------------

    def _open_card(self, index: int) -> _Card:
        nv = self._nv
        card = _Card(index, None, f"GPU-unknown-{index}", None, None, None, lost=False, static={})
        try:
            card.handle = nv.nvmlDeviceGetHandleByIndex(index)
            card.uuid = _text(self._field(nv.nvmlDeviceGetUUID, card.handle)) or card.uuid
            card.name = _text(self._field(nv.nvmlDeviceGetName, card.handle))
            memory = self._field(nv.nvmlDeviceGetMemoryInfo, card.handle)
            card.memory_total_mib = None if memory is None else memory.total // _MIB
            pci = self._field(nv.nvmlDeviceGetPciInfo, card.handle)
            card.pci_bus_id = None if pci is None else _text(pci.busId)
            card.static = self._static(card.handle, card.pci_bus_id)
        except nv.NVMLError_GpuIsLost:
            card.lost = True
        except Exception:  # noqa: BLE001 - any NVML failure on one card leaves only that card unread
            # No handle at all (say, no permission on this one card): its fields stay None.
            card.handle = None
        return card

    def _static(self, handle: Any, bus_id: str | None) -> dict[str, Any]:
        nv = self._nv
        where = placement(bus_id, self._sysfs)
        default_mw = self._field(nv.nvmlDeviceGetPowerManagementDefaultLimit, handle)
        constraints = self._field(nv.nvmlDeviceGetPowerManagementLimitConstraints, handle)
        capability = self._field(nv.nvmlDeviceGetCudaComputeCapability, handle)
        # The card's own maxima: sysfs's LnkCap first, since NVML's "max" is capped by the slot (x16 card, x8 slot: 8).
        max_gen = where.max_gen or self._field(nv.nvmlDeviceGetGpuMaxPcieLinkGeneration, handle)
        return dict(
            serial=_text(self._field(nv.nvmlDeviceGetSerial, handle)),
            slot=where.slot,
            numa_node=where.numa_node,
            behind_chipset=where.behind_chipset,
            pcie_max_gen=max_gen or self._field(nv.nvmlDeviceGetMaxPcieLinkGeneration, handle),
            pcie_max_width=where.max_width or self._field(nv.nvmlDeviceGetMaxPcieLinkWidth, handle),
            power_default_w=None if default_mw is None else default_mw / 1000,
            power_max_w=None if constraints is None else constraints[1] / 1000,
            compute_capability=None if capability is None else f"{capability[0]}.{capability[1]}",
        )

    def _read_topology(self) -> Topology:
        links: dict[tuple[int, int], int] = {}
        usable = [c for c in self._cards if c.handle is not None and not c.lost]
        for a, b in itertools.combinations(usable, 2):
            try:
                links[(a.index, b.index)] = int(
                    self._nv.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)
                )
            except Exception:  # noqa: BLE001 - unknown pairs read as LINK_SYSTEM
                pass  # unknown pairs read as LINK_SYSTEM, the cautious answer
        return Topology(links)

    # -- live fields, every read ------------------------------------------------------------

    def _read_card(self, card: _Card) -> CardReading:
        static = dict(
            index=card.index,
            uuid=card.uuid,
            name=card.name,
            memory_total_mib=card.memory_total_mib,
            pci_bus_id=card.pci_bus_id,
            **card.static,
        )
        if card.handle is not None and not card.lost:
            try:
                return CardReading(**static, **self._live(card.handle))
            except self._nv.NVMLError_GpuIsLost:
                # Sticky: a GPU off the bus stays off until it is reset, so stop asking it.
                card.lost = True
        return CardReading(**static, lost=card.lost)

    def _live(self, handle: Any) -> dict[str, Any]:
        nv = self._nv
        memory = self._field(nv.nvmlDeviceGetMemoryInfo, handle)
        utilization = self._field(nv.nvmlDeviceGetUtilizationRates, handle)
        power_mw = self._field(nv.nvmlDeviceGetPowerUsage, handle)
        # The "throttle" name is the older drivers' one; nvidia-ml-py keeps both.
        reasons = self._field(nv.nvmlDeviceGetCurrentClocksEventReasons, handle)
        if reasons is None:
            reasons = self._field(nv.nvmlDeviceGetCurrentClocksThrottleReasons, handle)
        # Read every time: board power apply (or nvidia-smi -pl) changes it. Enforced is the limit in force; older
        # drivers lack it.
        limit_mw = self._field(nv.nvmlDeviceGetEnforcedPowerLimit, handle)
        if limit_mw is None:
            limit_mw = self._field(nv.nvmlDeviceGetPowerManagementLimit, handle)
        tx_kib = self._field(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx_kib = self._field(nv.nvmlDeviceGetPcieThroughput, handle, nv.NVML_PCIE_UTIL_RX_BYTES)
        persistence = self._field(nv.nvmlDeviceGetPersistenceMode, handle)
        # Millijoules since the driver loaded (Volta and later); NotSupported elsewhere reads None, and the history
        # integrates the power samples instead.
        energy_mj = self._field(nv.nvmlDeviceGetTotalEnergyConsumption, handle)
        return dict(
            memory_used_mib=None if memory is None else memory.used // _MIB,
            utilization_pct=None if utilization is None else utilization.gpu,
            temperature_c=self._field(nv.nvmlDeviceGetTemperature, handle, nv.NVML_TEMPERATURE_GPU),
            power_w=None if power_mw is None else power_mw / 1000,
            sm_clock_mhz=self._field(nv.nvmlDeviceGetClockInfo, handle, nv.NVML_CLOCK_SM),
            throttle_reasons=None if reasons is None else int(reasons),
            processes=self._processes(handle),
            power_limit_w=None if limit_mw is None else limit_mw / 1000,
            pcie_gen=self._field(nv.nvmlDeviceGetCurrPcieLinkGeneration, handle),
            pcie_width=self._field(nv.nvmlDeviceGetCurrPcieLinkWidth, handle),
            pcie_tx_mib_s=None if tx_kib is None else round(tx_kib / 1024, 1),  # NVML says KB/s (KiB: 1024 bytes)
            pcie_rx_mib_s=None if rx_kib is None else round(rx_kib / 1024, 1),
            persistence=None if persistence is None else persistence == nv.NVML_FEATURE_ENABLED,
            energy_mj=None if energy_mj is None else int(energy_mj),
        )

    def _processes(self, handle: Any) -> tuple[GpuProcess, ...]:
        nv = self._nv
        used: dict[int, int | None] = {}
        for query in (nv.nvmlDeviceGetComputeRunningProcesses, nv.nvmlDeviceGetGraphicsRunningProcesses):
            for info in self._field(query, handle) or ():
                mib = None if info.usedGpuMemory is None else info.usedGpuMemory // _MIB
                # A process can be in both lists (CUDA + graphics); it is one process.
                before = used.get(info.pid)
                used[info.pid] = mib if before is None else before if mib is None else max(before, mib)
        return tuple(GpuProcess(pid, mib, *self._owner(pid)) for pid, mib in sorted(used.items()))

    def _owner(self, pid: int) -> tuple[str | None, int | None, str, float | None, str | None]:
        """(user, uid, command, started_at, container) of a PID, or unknowns when psutil cannot see it (the PID is in
        another namespace: board itself runs in a container)."""
        if pid <= 0:
            return (*_UNKNOWN_OWNER, None, None)
        try:
            process = psutil.Process(pid)
            key = (pid, process.create_time())
        except psutil.Error:
            return (*_UNKNOWN_OWNER, None, None)
        self._owners_seen.add(key)
        if key not in self._owners:
            self._owners[key] = (*_describe(process), container_of(pid))
        user, uid, command, container = self._owners[key]
        return user, uid, command, key[1], container

    # -- helpers ----------------------------------------------------------------------------

    def _field(self, query: Callable[..., Any], *args: Any) -> Any:
        """One NVML call; None when the driver cannot answer. GpuIsLost passes up to mark the card."""
        try:
            return query(*args)
        except self._nv.NVMLError_GpuIsLost:
            raise
        except Exception:  # noqa: BLE001 - "n/a" for a field, whatever the driver raised
            return None

    def _shutdown(self) -> None:
        try:
            self._nv.nvmlShutdown()
        except Exception:  # noqa: BLE001 - closing must not fail
            pass  # closing must not fail; the process is going away or NVML never started


def _describe(process: psutil.Process) -> tuple[str | None, int | None, str]:
    try:
        uid = process.uids().real
    except psutil.Error:
        return _UNKNOWN_OWNER
    try:
        user = pwd.getpwuid(uid).pw_name
    except KeyError:
        user = str(uid)  # a UID with no passwd entry is still someone: show the number
    try:
        command = " ".join(process.cmdline()) or process.name()
    except psutil.Error:
        command = ""
    return user, uid, command


def _address(handle: Any) -> int:
    """What a device handle points at: two ctypes pointers to one device compare unequal, their addresses do not."""
    try:
        return ctypes.cast(handle, ctypes.c_void_p).value or 0
    except (ctypes.ArgumentError, TypeError):
        return id(handle)  # not a ctypes pointer (the test fake): the object is the handle


def _text(value: Any) -> Any:
    # nvidia-ml-py returns str; releases before 11.515 returned bytes.
    return value.decode(errors="replace") if isinstance(value, bytes) else value
