"""A stand-in for nvidia-ml-py's `pynvml` module, for machines without a GPU.

It copies the parts of the real API that app.gpu.nvml uses: the function names and
signatures, the NVML_* constants, the NVMLError class hierarchy (built the same way, so
`NVMLError(15)` is an `NVMLError_GpuIsLost`), and struct-like return values with the real
field names. tests/unit/test_gpu_nvml.py checks it against the installed module.

    fake = FakePynvml([FakeGpu(...), FakeGpu(...)])
    monkeypatch.setitem(sys.modules, "pynvml", fake)

Faults: `FakeGpu.errors["nvmlDeviceGetTemperature"] = fake.NVMLError_NotSupported`,
`FakeGpu.lost = True` (every call on it raises GpuIsLost), `fake.init_error = ...`.
Energy: `FakeGpu.energy_mj` is the total energy counter (a test moves it); a card without one:
`FakeGpu.errors["nvmlDeviceGetTotalEnergyConsumption"] = fake.NVMLError_NotSupported`.
Xid events: `fake.inject_xid(index, code)` wakes a waiting `nvmlEventSetWait_v2` on a set the card registered with;
`FakeGpu.errors["nvmlDeviceRegisterEvents"] = fake.NVMLError_NotSupported` makes a card refuse events.
"""

from __future__ import annotations

import queue
import string
import types
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

MIB = 1024 * 1024

NVML_SUCCESS = 0
NVML_TEMPERATURE_GPU = 0
NVML_CLOCK_SM = 1
NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_CPU = NVML_TOPOLOGY_NODE
NVML_TOPOLOGY_SYSTEM = 50
NVML_PCIE_UTIL_TX_BYTES = 0
NVML_PCIE_UTIL_RX_BYTES = 1
NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1

NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_ALREADY_INITIALIZED = 5
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_INSUFFICIENT_SIZE = 7
NVML_ERROR_INSUFFICIENT_POWER = 8
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_IRQ_ISSUE = 11
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_FUNCTION_NOT_FOUND = 13
NVML_ERROR_CORRUPTED_INFOROM = 14
NVML_ERROR_GPU_IS_LOST = 15
NVML_ERROR_RESET_REQUIRED = 16
NVML_ERROR_OPERATING_SYSTEM = 17
NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18
NVML_ERROR_IN_USE = 19
NVML_ERROR_MEMORY = 20
NVML_ERROR_NO_DATA = 21
NVML_ERROR_UNKNOWN = 999

CONSTANTS = {name: value for name, value in dict(globals()).items() if name.startswith("NVML_")}
CONSTANTS["nvmlEventTypeXidCriticalError"] = 0x8  # the event API's names are not NVML_ prefixed


class NVMLError(Exception):
    """Same shape as pynvml.NVMLError: `NVMLError(code)` returns the matching subclass."""

    _valClassMapping: dict[int, type] = {}

    def __new__(typ, value):
        if typ == NVMLError:
            typ = NVMLError._valClassMapping.get(value, typ)
        obj = Exception.__new__(typ)
        obj.value = value
        return obj

    def __str__(self):
        return f"NVML Error with code {self.value}"

    def __eq__(self, other):
        return self.value == other.value

    __hash__ = Exception.__hash__


def _error_classes() -> dict[str, type]:
    # The same naming rule as pynvml._extractNVMLErrorsAsClasses: NVML_ERROR_GPU_IS_LOST -> NVMLError_GpuIsLost.
    classes = {}
    for name, value in CONSTANTS.items():
        if not name.startswith("NVML_ERROR_"):
            continue
        class_name = "NVMLError_" + string.capwords(name.replace("NVML_ERROR_", ""), "_").replace("_", "")

        def new(typ, *args, _value=value):
            return NVMLError.__new__(typ, _value)

        cls = type(class_name, (NVMLError,), {"__new__": new})
        NVMLError._valClassMapping[value] = cls
        classes[class_name] = cls
    return classes


ERROR_CLASSES = _error_classes()


class nvmlFriendlyObject:
    """What pynvml returns for process lists: a plain object with the struct's fields."""

    def __init__(self, dictionary):
        for key, value in dictionary.items():
            setattr(self, key, value)


class Struct(types.SimpleNamespace):
    """Stands in for the ctypes structures (c_nvmlMemory_t, nvmlPciInfo_t, ...): fields as attributes."""


@dataclass
class FakeProcess:
    pid: int
    used_bytes: int | None  # None: what the real module reports when NVML does not know (WDDM)


@dataclass
class FakeGpu:
    name: str = "NVIDIA GeForce RTX 5090"
    uuid: str = "GPU-00000000-0000-0000-0000-000000000000"
    bus_id: str = "00000000:01:00.0"
    memory_total: int = 32607 * MIB
    memory_used: int = 0
    utilization: int = 0
    temperature: int = 40
    power_mw: int = 30_000
    energy_mj: int = 1_000_000  # the total energy counter, millijoules since the driver loaded
    power_limit_mw: int = 575_000
    power_default_mw: int = 575_000
    power_min_mw: int = 400_000
    power_max_mw: int = 600_000
    persistence: int = 0  # NVML_FEATURE_*
    serial: str = "1652025000001"
    compute_capability: tuple[int, int] = (12, 0)
    pcie_gen: int = 5
    pcie_width: int = 16
    pcie_max_gen: int = 5  # what card and slot allow together (NVML's "max"): a x8 slot caps the width here too
    pcie_max_width: int = 16
    pcie_gpu_max_gen: int = 5  # the card's own
    pcie_tx_kib_s: int = 0
    pcie_rx_kib_s: int = 0
    sm_clock_mhz: int = 2407
    clocks_event_reasons: int = 0  # nvmlClocksEventReason* bits
    switch: int = 0
    compute: list[FakeProcess] = field(default_factory=list)
    graphics: list[FakeProcess] = field(default_factory=list)
    lost: bool = False
    errors: dict[str, type] = field(default_factory=dict)  # function name -> NVMLError subclass to raise


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


class FakePynvml(types.ModuleType):
    """A fresh fake module per test; `calls` counts every NVML function called."""

    def __init__(self, gpus: list[FakeGpu], driver_version: str = "575.57.08", cuda_version: int = 12090) -> None:
        super().__init__("pynvml")
        self.__dict__.update(CONSTANTS)
        self.__dict__.update(ERROR_CLASSES)
        self.NVMLError = NVMLError
        self.gpus = gpus
        self.driver_version = driver_version
        self.cuda_version = cuda_version
        self.root = True  # False: the setters raise NoPermission, as NVML does without CAP_SYS_ADMIN
        self.init_error: type | None = None
        self.initialised = False
        self.calls: Counter[str] = Counter()
        self.event_sets: list[_EventSet] = []

    # -- plumbing --------------------------------------------------------------------------

    def _enter(self, function: str, *handles: _Handle) -> Any:
        """Count the call, then fail the way NVML would: uninitialised, lost card, injected error."""
        self.calls[function] += 1
        if not self.initialised:
            raise self.NVMLError_Uninitialized()
        gpus = [self._gpu(function, handle) for handle in handles]
        return gpus[0] if len(gpus) == 1 else gpus

    def _gpu(self, function: str, handle: _Handle) -> FakeGpu:
        gpu = self.gpus[handle.index]
        if gpu.lost:
            raise self.NVMLError_GpuIsLost()
        if function in gpu.errors:
            raise gpu.errors[function]()
        return gpu

    # -- the API, with the real signatures -----------------------------------------------------

    def nvmlInit(self):
        self.calls["nvmlInit"] += 1
        if self.init_error is not None:
            raise self.init_error()
        self.initialised = True

    def nvmlShutdown(self):
        self._enter("nvmlShutdown")
        self.initialised = False

    def nvmlSystemGetDriverVersion(self):
        self._enter("nvmlSystemGetDriverVersion")
        return self.driver_version

    def nvmlSystemGetCudaDriverVersion_v2(self):
        self._enter("nvmlSystemGetCudaDriverVersion_v2")
        return self.cuda_version

    def nvmlDeviceGetCount(self):
        self._enter("nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter("nvmlDeviceGetHandleByIndex")
        if not 0 <= index < len(self.gpus):
            raise self.NVMLError_InvalidArgument()
        handle = _Handle(index)
        self._gpu("nvmlDeviceGetHandleByIndex", handle)  # a lost card fails here too
        return handle

    def nvmlDeviceGetName(self, handle):
        return self._enter("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetUUID(self, handle):
        return self._enter("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetPciInfo(self, handle):
        gpu = self._enter("nvmlDeviceGetPciInfo", handle)
        bus = int(gpu.bus_id.split(":")[1], 16)
        return Struct(busIdLegacy=gpu.bus_id, domain=0, bus=bus, device=0, pciDeviceId=0x2B8510DE,
                      pciSubSystemId=0, busId=gpu.bus_id)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        gpu = self._enter("nvmlDeviceGetMemoryInfo", handle)
        return Struct(total=gpu.memory_total, free=gpu.memory_total - gpu.memory_used, used=gpu.memory_used)

    def nvmlDeviceGetUtilizationRates(self, handle):
        gpu = self._enter("nvmlDeviceGetUtilizationRates", handle)
        return Struct(gpu=gpu.utilization, memory=gpu.utilization // 2)

    def nvmlDeviceGetTemperature(self, handle, sensor):
        gpu = self._enter("nvmlDeviceGetTemperature", handle)
        if sensor != NVML_TEMPERATURE_GPU:
            raise self.NVMLError_InvalidArgument()
        return gpu.temperature

    def nvmlDeviceGetPowerUsage(self, handle):
        return self._enter("nvmlDeviceGetPowerUsage", handle).power_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle):
        return self._enter("nvmlDeviceGetTotalEnergyConsumption", handle).energy_mj

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self._enter("nvmlDeviceGetEnforcedPowerLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementLimit(self, handle):
        return self._enter("nvmlDeviceGetPowerManagementLimit", handle).power_limit_mw

    def nvmlDeviceGetPowerManagementDefaultLimit(self, handle):
        return self._enter("nvmlDeviceGetPowerManagementDefaultLimit", handle).power_default_mw

    def nvmlDeviceGetPowerManagementLimitConstraints(self, handle):
        gpu = self._enter("nvmlDeviceGetPowerManagementLimitConstraints", handle)
        return [gpu.power_min_mw, gpu.power_max_mw]

    def nvmlDeviceSetPowerManagementLimit(self, handle, limit):
        gpu = self._enter("nvmlDeviceSetPowerManagementLimit", handle)
        if not self.root:
            raise self.NVMLError_NoPermission()
        if not gpu.power_min_mw <= limit <= gpu.power_max_mw:
            raise self.NVMLError_InvalidArgument()
        gpu.power_limit_mw = limit

    def nvmlDeviceGetPersistenceMode(self, handle):
        return self._enter("nvmlDeviceGetPersistenceMode", handle).persistence

    def nvmlDeviceSetPersistenceMode(self, handle, mode):
        gpu = self._enter("nvmlDeviceSetPersistenceMode", handle)
        if not self.root:
            raise self.NVMLError_NoPermission()
        gpu.persistence = mode

    def nvmlDeviceGetSerial(self, handle):
        return self._enter("nvmlDeviceGetSerial", handle).serial

    def nvmlDeviceGetCudaComputeCapability(self, handle):
        return self._enter("nvmlDeviceGetCudaComputeCapability", handle).compute_capability

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        return self._enter("nvmlDeviceGetCurrPcieLinkGeneration", handle).pcie_gen

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        return self._enter("nvmlDeviceGetCurrPcieLinkWidth", handle).pcie_width

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        return self._enter("nvmlDeviceGetMaxPcieLinkGeneration", handle).pcie_max_gen

    def nvmlDeviceGetGpuMaxPcieLinkGeneration(self, handle):
        return self._enter("nvmlDeviceGetGpuMaxPcieLinkGeneration", handle).pcie_gpu_max_gen

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        return self._enter("nvmlDeviceGetMaxPcieLinkWidth", handle).pcie_max_width

    def nvmlDeviceGetPcieThroughput(self, device, counter):
        gpu = self._enter("nvmlDeviceGetPcieThroughput", device)
        if counter not in (NVML_PCIE_UTIL_TX_BYTES, NVML_PCIE_UTIL_RX_BYTES):
            raise self.NVMLError_InvalidArgument()
        return gpu.pcie_tx_kib_s if counter == NVML_PCIE_UTIL_TX_BYTES else gpu.pcie_rx_kib_s

    def nvmlDeviceGetClockInfo(self, handle, type):
        gpu = self._enter("nvmlDeviceGetClockInfo", handle)
        if type != NVML_CLOCK_SM:
            raise self.NVMLError_InvalidArgument()
        return gpu.sm_clock_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self._enter("nvmlDeviceGetCurrentClocksEventReasons", handle).clocks_event_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle):
        return self._enter("nvmlDeviceGetCurrentClocksThrottleReasons", handle).clocks_event_reasons

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        return _process_list(self._enter("nvmlDeviceGetComputeRunningProcesses", handle).compute)

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle):
        return _process_list(self._enter("nvmlDeviceGetGraphicsRunningProcesses", handle).graphics)

    def nvmlDeviceGetTopologyCommonAncestor(self, device1, device2):
        a, b = self._enter("nvmlDeviceGetTopologyCommonAncestor", device1, device2)
        return NVML_TOPOLOGY_MULTIPLE if a.switch == b.switch else NVML_TOPOLOGY_SYSTEM

    # -- the event API: a set is a queue that inject_xid feeds -------------------------------------

    def nvmlEventSetCreate(self):
        self._enter("nvmlEventSetCreate")
        event_set = _EventSet()
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle, eventTypes, eventSet):
        self._enter("nvmlDeviceRegisterEvents", handle)
        eventSet.registered[handle.index] = (handle, eventSet.registered.get(handle.index, (None, 0))[1] | eventTypes)

    def nvmlEventSetWait_v2(self, eventSet, timeoutms):
        self._enter("nvmlEventSetWait_v2")
        if eventSet.freed:
            raise self.NVMLError_InvalidArgument()
        try:
            return eventSet.queue.get(timeout=timeoutms / 1000)
        except queue.Empty:
            raise self.NVMLError_Timeout() from None

    def nvmlEventSetFree(self, eventSet):
        self._enter("nvmlEventSetFree")
        eventSet.freed = True

    def inject_xid(self, index: int, code: int) -> None:
        """An Xid on card `index`: every live set the card registered for Xid events gets it."""
        for event_set in self.event_sets:
            handle, types_ = event_set.registered.get(index, (None, 0))
            if handle is not None and types_ & CONSTANTS["nvmlEventTypeXidCriticalError"] and not event_set.freed:
                event_set.queue.put(Struct(device=handle, eventType=CONSTANTS["nvmlEventTypeXidCriticalError"],
                                           eventData=code, gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF))


class _EventSet:
    def __init__(self) -> None:
        self.queue: queue.Queue = queue.Queue()
        self.registered: dict[int, tuple[_Handle, int]] = {}  # card index -> (the handle registered, event types)
        self.freed = False


API = [name for name in vars(FakePynvml) if name.startswith("nvml")]


def _process_list(processes: list[FakeProcess]) -> list[nvmlFriendlyObject]:
    return [
        nvmlFriendlyObject({"pid": p.pid, "usedGpuMemory": p.used_bytes, "gpuInstanceId": 0xFFFFFFFF,
                            "computeInstanceId": 0xFFFFFFFF})
        for p in processes
    ]
