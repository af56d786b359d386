"""The operations: one table (OPS), one entry each: its name, arguments, handler, and whether it writes.

The CLI's commands and the TUI's actions map onto these names, so a feature is added once. The table and
how an entry checks its arguments are app.service.ops.registry, which imports none of the modules below;
each of them registers one area's operations with `@op`, and importing this package imports them all.
"""

from __future__ import annotations

from app.service.ops import alerts, bookings, faults, gateway, notify, power, reads, series, servers
from app.service.ops.registry import OPS, Op

REGISTERS = (reads, bookings, series, servers, notify, faults, alerts, gateway, power)  # the modules that fill OPS

__all__ = ["OPS", "Op", "REGISTERS"]
