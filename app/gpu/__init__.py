"""GPU telemetry: one interface (`GpuSource`), an NVML backend and a simulated backend.

This module is imported by the quick CLI, so it stays light: no Textual, and the backends
(with pynvml and psutil) are imported only when `open_source` picks one.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

from app.gpu.model import (
    LINK_HOSTBRIDGE,
    LINK_INTERNAL,
    LINK_MULTIPLE,
    LINK_NODE,
    LINK_SINGLE,
    LINK_SYSTEM,
    CardReading,
    FleetSnapshot,
    GpuProcess,
    Topology,
)

__all__ = [
    "LINK_HOSTBRIDGE",
    "LINK_INTERNAL",
    "LINK_MULTIPLE",
    "LINK_NODE",
    "LINK_SINGLE",
    "LINK_SYSTEM",
    "CardReading",
    "FleetSnapshot",
    "GpuProcess",
    "GpuSource",
    "NoDriverError",
    "Topology",
    "open_source",
]

NO_DRIVER_MESSAGE = "no NVIDIA driver found; use --demo to explore a simulated server"


@runtime_checkable
class GpuSource(Protocol):
    simulated: bool

    def read(self) -> FleetSnapshot:
        """One poll. A field the driver cannot report is None; it never raises for that."""
        ...

    def close(self) -> None: ...


class NoDriverError(Exception):
    """NVML cannot start here: no library, no driver loaded, or no permission."""

    def __init__(self, message: str = NO_DRIVER_MESSAGE) -> None:
        super().__init__(message)


def open_source(
    demo: bool | str | os.PathLike[str] | None = None,
    *,
    environ: Mapping[str, str] = os.environ,
    clock: Callable[[], float] = time.time,
    host: str = "",
) -> GpuSource:
    """Pick the telemetry backend.

    demo=True: the default simulated fleet; a path: a scenario TOML (ValueError if it is bad);
    False: NVML, whatever the environment says; None: BOARD_SIMULATE decides, else NVML
    (NoDriverError when there is no driver). `host`: [fleet] host, which gives simulated cards UUIDs of their own.
    """
    if demo is None:
        demo = _demo_from_env(environ.get("BOARD_SIMULATE", ""))
    if demo is False:
        from app.gpu.nvml import NvmlSource  # start-up: a backend loads only when chosen (NVML brings psutil)

        return NvmlSource(clock=clock)
    from app.gpu.simulated import SimulatedSource, load_scenario  # start-up: a backend loads only when chosen

    if demo is True:
        return SimulatedSource(clock=clock, host=host)
    return SimulatedSource(load_scenario(demo), clock=clock, host=host)


def _demo_from_env(value: str) -> bool | str:
    value = value.strip()
    if value.lower() in ("1", "true"):
        return True
    # "0"/"false" switch it off rather than naming a scenario file called "0".
    if value.lower() in ("", "0", "false"):
        return False
    return value
